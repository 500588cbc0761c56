"""How a process of this project ends: one line saying why, the reason in log.txt, a non-zero
exit code, and nothing left in /dev/shm.

* :func:`release_shm_segments`: MPICH's shared-memory transport creates one file per node,
  ``/dev/shm/mpich_shm_<id>_<n>``, in ``MPI_Init`` and unlinks it only in ``MPI_Finalize``; a rank
  that ends any other way (``MPI_Abort``, ``os._exit``, a signal, Hydra killing the job after a
  peer failed) leaves it behind. Once every rank of the node has mapped it, the name is no longer
  needed (the mappings stay valid, as for any unlinked file), so the project unlinks it right after
  start-up and no exit, however abrupt, can leave it.
* :func:`describe_failure` turns the failures a user can cause into the one line printed on rank 0
  (every rank, for a peer that stopped answering) and written to ``log.txt``; :data:`EXIT_CODES`
  gives each kind its exit status.
* :func:`record_stop` appends that line to the run's ``log.txt``.
"""
from __future__ import annotations

import errno
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from mpi4py import MPI

__all__ = ["release_shm_segments", "describe_failure", "exit_code", "record_stop", "JobError",
           "EXIT_CODES", "failure_writer", "run_main"]

#: Exit status per kind of failure (0 is a clean end, signal stops included). ``env``: an
#: environment worker of this rank died or hung (``envs.EnvWorkerError``); a relaunch may well
#: succeed, so the elastic supervisor relaunches after it (it is none of its stop codes).
EXIT_CODES = {"config": 2, "timeout": 3, "nonfinite": 4, "env": 5, "interrupt": 130, "crash": 1}


class JobError(RuntimeError):
    """A failure every rank agreed on (e.g. a checkpoint that could not be written); the message is
    the one line the user sees, ``kind`` a key of :data:`EXIT_CODES`."""

    def __init__(self, message: str, kind: str = "config"):
        super().__init__(message)
        self.kind = kind


def _mapped_mpich_segments() -> list[str]:
    found = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and "/dev/shm/mpich_shm" in parts[5] and "(deleted)" not in parts[5]:
                    found.append(parts[5].strip())
    except OSError:  # not Linux: nothing to do
        return []
    return sorted(set(found))


def release_shm_segments(comm: MPI.Comm | None = None) -> list[str]:
    """Unlink the MPICH shared-memory files this process maps; return their paths.

    Call it only when every rank on this node has finished ``MPI_Init`` (after any collective over
    all ranks of the job); ``comm`` is that collective's communicator and must span the whole job
    (``MPI.COMM_WORLD``'s size), otherwise nothing is done, since ranks outside it may still be
    attaching. Safe to call several times and on several ranks (a name already gone is skipped).
    """
    if comm is not None and comm.Get_size() != MPI.COMM_WORLD.Get_size():
        return []
    done = []
    for path in _mapped_mpich_segments():
        try:
            os.unlink(path)
            done.append(path)
        except FileNotFoundError:
            pass
        except OSError:
            pass  # another user's file, read-only /dev/shm: MPI_Finalize still removes it
    return done


def describe_failure(exc: BaseException) -> tuple[str, str]:
    """``(kind, one line)`` for a failure a user can cause; kind ``"crash"`` for anything else
    (a bug: the caller prints the traceback)."""
    from wagma_rl.job.checkpoint import CheckpointError, NonFiniteCheckpoint
    from wagma_rl.config import ConfigError
    from wagma_rl.bounded_comm import PeerTimeout
    from wagma_rl.optim.finite import NonFiniteError

    try:
        from native_coll import CollectiveTimeout
    except ImportError:  # pragma: no cover
        CollectiveTimeout = PeerTimeout
    try:
        from envs.pool import EnvWorkerError
    except ImportError:  # pragma: no cover (envs ships with the project)
        EnvWorkerError = ()
    if isinstance(exc, JobError):
        return exc.kind, str(exc)
    if isinstance(exc, EnvWorkerError):
        return "env", (f"{exc}. This rank stopped; its envs' simulator failed, not the job: resume "
                       "from the newest checkpoint, or run under python -m wagma_rl.elastic, "
                       "which relaunches the job after exit status 5")
    if isinstance(exc, NonFiniteCheckpoint):
        return "nonfinite", str(exc)
    if isinstance(exc, (ConfigError, FileNotFoundError, CheckpointError)):
        return "config", str(exc)
    if isinstance(exc, (PeerTimeout, CollectiveTimeout)):
        if getattr(exc, "rescued", None):  # the trainer saved the survivors' state (or will)
            return "timeout", exc.rescued
        return "timeout", (f"{exc}. The job stopped without writing a checkpoint; find out why those "
                           "ranks stopped (their output, the node), then resume from the last checkpoint")
    if isinstance(exc, NonFiniteError):
        return "nonfinite", f"{exc}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupt", "interrupted (second Ctrl-C): stopped at once, without a checkpoint"
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES,
                                                  errno.EROFS, errno.EPERM, errno.ENOTDIR,
                                                  errno.EEXIST):
        where = f" {exc.filename!r}" if exc.filename else ""
        fix = ("free space on that file system" if exc.errno in (errno.ENOSPC, errno.EDQUOT)
               else "make the run folder writable or choose another run.dir")
        return "config", f"cannot write{where}: {exc.strerror}; {fix}, then resume"
    return "crash", f"{type(exc).__name__}: {exc}"


def exit_code(kind: str) -> int:
    """The exit status for a failure kind of :func:`describe_failure`."""
    return EXIT_CODES[kind]


def failure_writer(exc: BaseException, rank: int, size: int) -> bool:
    """Whether ``rank`` writes the failure into log.txt: rank 0, or for a timeout that names rank
    0 the lowest rank still running (each survivor computes the same answer); a failed env worker
    only its own rank knows of, so that rank."""
    kind = describe_failure(exc)[0]
    if kind == "env":
        return True
    gone = set(getattr(exc, "ranks", ()) or ()) if kind == "timeout" else set()
    alive = [r for r in range(size) if r not in gone]
    return bool(alive) and rank == alive[0]


def record_stop(run_dir: str | Path, line: str) -> None:
    """Append ``stopped: <line>`` to ``run_dir/log.txt`` (never raises: the disk may be full)."""
    try:
        path = Path(run_dir) / "log.txt"
        if path.parent.is_dir():
            with open(path, "a") as fh:
                fh.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] stopped: {line}\n")
    except OSError:
        pass


def _record_loss(exc: BaseException, rank: int, size: int) -> None:
    """Tell the elastic supervisor (if any) which ranks were lost, from the lowest survivor, unless
    the job saved its survivors' state and recorded the loss itself (the RL trainer does): the
    supervisor then goes on without them from the job's newest checkpoint."""
    from wagma_rl import elastic

    if elastic.elastic_dir() is None or getattr(exc, "recorded", False) or \
            not failure_writer(exc, rank, size):
        return
    lost = elastic.named(exc.ranks, getattr(exc, "peers", ()))
    try:
        elastic.write_loss(writer=rank, world_size=size, lost=lost, checkpoint=None, update=None,
                           frames=None, why=str(exc))
    except OSError:
        pass  # the supervisor then sees the launch end without a record (it probes the hosts)


def run_main(body: Callable[[], Any], *, prog: str) -> int:
    """Run an entry point's ``body`` on every rank with the project's exit policy; return the exit
    status (or leave the process at once where MPI cannot be finalised).

    * a failure every rank agreed on (config, checkpoint, disk, non-finite values): rank 0 prints
      ``<prog>: error: <line>``; every rank returns its code and MPI finalises normally;
    * a peer that stopped answering: every surviving rank prints its line, then leaves without
      ``MPI_Finalize`` (which would wait for the lost peer) after a short grace so that the other
      survivors' lines get out before the launcher kills them;
    * a second Ctrl-C: leaves at once (130);
    * an env worker of this rank that died or hung (``envs.EnvWorkerError``): this rank prints its
      line (env, pid, episode) and exits 5, without ``MPI_Finalize`` when there are other ranks
      (they wait in a collective): they find it lost after their timeout and save their state as
      for any lost rank;
    * anything else is a bug: the traceback on that rank, then ``MPI_Abort`` of the whole job.

    The shared-memory segments are already unlinked (:func:`release_shm_segments`) on every path.
    """
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    try:
        body()
        return 0
    except SystemExit:
        raise
    except BaseException as exc:
        kind, line = describe_failure(exc)
        if kind == "crash":
            print(f"[rank {rank}] uncaught exception:\n{traceback.format_exc()}", file=sys.stderr,
                  flush=True)
            release_shm_segments()
            if size > 1:
                comm.Abort(EXIT_CODES["crash"])
            return EXIT_CODES["crash"]
        if kind == "env":
            print(f"{prog}: error (rank {rank}): {line}", file=sys.stderr, flush=True)
            from wagma_rl import elastic
            elastic.write_env_failure(rank=rank, why=line)  # (never raises; no-op unsupervised)
            release_shm_segments()
            if size == 1:
                return EXIT_CODES["env"]
            time.sleep(1.0)
            os._exit(EXIT_CODES["env"])
        if kind == "timeout":
            print(f"{prog}: error (rank {rank}): {line}", file=sys.stderr, flush=True)
            _record_loss(exc, rank, size)
            release_shm_segments()
            time.sleep(1.0)
            os._exit(EXIT_CODES["timeout"])
        if rank == 0:
            print(f"{prog}: error: {line}", file=sys.stderr, flush=True)
        if kind == "interrupt":
            release_shm_segments()
            os._exit(EXIT_CODES["interrupt"])
        return EXIT_CODES[kind]
