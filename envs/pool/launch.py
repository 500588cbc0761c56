"""Starting a pool's worker processes, and what each does before it serves (:mod:`envs.pool.worker`).

Each worker is a fresh Python interpreter (``context="exec"``, the default: fork and exec, so
no copy of the trainer's MPI state, torch threads or locks, and not its ``__main__`` script,
whose import would initialise MPI in the worker if the script imports mpi4py at the top). It
starts with the MPI launcher's variables removed from its environment (:data:`LAUNCHER_PREFIXES`:
a child must not take itself for an MPI rank) and with SIGINT, SIGTERM and SIGUSR1 blocked until
it ignores them (the trainer's handlers decide when to stop; the pool ends with
:meth:`~envs.pool.process_env.ProcessVectorEnv.close`), and dies with the pool's process: the
kernel sends it SIGKILL when its parent dies (Linux's ``PR_SET_PDEATHSIG``), so a worker hung
inside its simulator does not outlive a trainer that was killed (under a forkserver, a thread of
the worker watches the pool's process instead). ``context="forkserver"`` or ``"spawn"`` use
multiprocessing instead, for env_fns defined in ``__main__``: those workers import the parent's
``__main__`` before they can drop the variables, so keep MPI's import inside ``main()`` there.

The pool sees a started worker as :class:`ExecWorker` or :class:`ProcessWorker`: ``conn`` (the
pipe), ``pid``, ``first_message`` (what the pool sends first, or None) and ``exitcode(wait_s)``.
"""

from __future__ import annotations

import os
import pickletools
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection

from .worker import serve

__all__ = ["LAUNCHER_PREFIXES", "IGNORED_SIGNALS", "WorkerEnvFn", "scrub_launcher_environment",
           "from_main", "ExecWorker", "ProcessWorker"]

# Variables of MPI launchers (Hydra, Open MPI, Intel MPI, PMI/PMIx) and of a SLURM job step
# that make a process take itself for an MPI rank or a task of the step. Job-level SLURM
# variables (SLURM_JOB_ID, ...) stay.
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "MPI_", "MPIR_", "MPIEXEC_", "HYDRA_", "HYDI_", "OMPI_",
                     "ORTE_", "PRTE_", "I_MPI_", "SLURM_STEP", "SLURM_SRUN_", "SLURM_PMI")
_LAUNCHER_NAMES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_GTIDS",
                   "SLURM_TASK_PID", "SLURM_STEPID", "SLURM_LAUNCH_NODE_IPADDR")
IGNORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class WorkerEnvFn:
    """A picklable ``env_fn``: ``build(**options)``, then ``wrap(env, index)`` when ``wrap`` is
    given (``build`` and ``wrap`` must be picklable: module-level functions or classes)."""

    def __init__(self, build, index=0, *, wrap=None, **options):
        self.build, self.index, self.wrap, self.options = build, int(index), wrap, options

    def __call__(self):
        env = self.build(**self.options)
        return env if self.wrap is None else self.wrap(env, self.index)

    def __repr__(self):
        return f"WorkerEnvFn({getattr(self.build, '__qualname__', self.build)}, {self.index})"


def scrub_launcher_environment(environ=os.environ):
    """Remove the MPI launcher's and SLURM step's variables from ``environ``."""
    for key in list(environ):
        if key.startswith(LAUNCHER_PREFIXES) or key in _LAUNCHER_NAMES:
            del environ[key]


def _die_with(pool_pid):
    """End this process when the pool's process ``pool_pid`` dies: Linux's
    ``PR_SET_PDEATHSIG`` when that is the parent (``spawn``); under a forkserver (the parent,
    which the trainer's signals may end before the pool does) a thread that polls it."""
    if os.getppid() == pool_pid:
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            if os.getppid() == pool_pid:
                return
        except (OSError, AttributeError):
            pass

    def watch():
        while True:
            try:
                os.kill(pool_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass
            time.sleep(0.5)

    import threading

    threading.Thread(target=watch, name="die-with-pool", daemon=True).start()


def _mp_worker(index, conn, payload, pool_pid):
    """A multiprocessing worker: die with the pool's process, ignore the signals, drop the
    launcher's variables, serve."""
    _die_with(pool_pid)
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    scrub_launcher_environment()
    serve(index, conn, payload)


def _exec_worker(fd):
    """An exec'd worker (:data:`_BOOT`): its index, env_fn and the pool's ``sys.path`` come
    first over the pipe ``fd``. Its name is in every exec'd worker's command line, which is how
    tests/test_env_worker_faults.py finds the workers."""
    conn = Connection(fd)
    try:
        index, payload, path = conn.recv()
    except (EOFError, OSError):
        return
    sys.path[:] = path
    try:
        serve(index, conn, payload)
    finally:  # as multiprocessing's workers: no interpreter teardown (slow) once the env closed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# An exec'd worker's program: the signals arrive blocked (see ExecWorker) and are ignored before
# they are unblocked, so none can stop it, not even while the interpreter starts. First of all it
# asks the kernel for SIGKILL when its parent dies (Linux's PR_SET_PDEATHSIG, through libc's
# prctl), then leaves if the parent (argv[2]) is gone already: a worker hung inside its simulator
# never reads the pipe's EOF, and must not outlive a trainer that was killed.
_BOOT = """import signal, sys, os
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):  # not Linux: the pipe's EOF still ends an idle worker
    pass
if os.getppid() != int(sys.argv[2]):
    os._exit(0)
signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
for s in signals:
    signal.signal(s, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
from envs.pool.launch import _exec_worker
_exec_worker(int(sys.argv[1]))
"""


def from_main(payload):
    """Whether a pickle names an object of ``__main__`` (which an exec'd worker does not have)."""
    for op, arg, _ in pickletools.genops(payload):
        if (op.name in ("GLOBAL", "INST") and str(arg).split(" ")[0] == "__main__") or (
                "UNICODE" in op.name and arg == "__main__"):
            return True
    return False


class ExecWorker:
    """A worker started as a fresh interpreter (fork and exec) with the launcher's variables
    removed from its environment and the ignored signals blocked until it ignores them."""

    def __init__(self, index, payload):
        env = dict(os.environ)
        scrub_launcher_environment(env)
        here = os.path.abspath(__file__)  # envs/pool/launch.py
        root = os.path.dirname(os.path.dirname(os.path.dirname(here)))  # where envs is
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        ours, theirs = socket.socketpair()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, IGNORED_SIGNALS)
        try:
            self.popen = subprocess.Popen([sys.executable, "-c", _BOOT, str(theirs.fileno()),
                                           str(os.getpid())],
                                          pass_fds=[theirs.fileno()], env=env,
                                          stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            theirs.close()
        self.conn, self.pid = Connection(ours.detach()), self.popen.pid
        self.first_message = (index, payload, list(sys.path))

    def exitcode(self, wait_s):
        """The exit code (negative: the signal) once it has exited within ``wait_s``, else None."""
        try:
            return self.popen.wait(wait_s)
        except subprocess.TimeoutExpired:
            return None


class ProcessWorker:
    """A multiprocessing worker (``context`` "forkserver" or "spawn")."""

    first_message = None

    def __init__(self, ctx, index, payload):
        ours, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_mp_worker, args=(index, theirs, payload, os.getpid()),
                                daemon=True, name=f"env-worker-{index}")
        try:
            self.proc.start()
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.conn, self.pid = ours, self.proc.pid

    def exitcode(self, wait_s):
        """The exit code once it has exited within ``wait_s``, else None (also when the
        forkserver that reports it is gone)."""
        self.proc.join(wait_s)
        return None if self.proc.exitcode == 255 else self.proc.exitcode
