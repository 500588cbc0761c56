"""One run per folder: a lock file naming its holder (host, pid), released when the holder ends.

The lock is ``<run dir>/.lock``, held with ``flock`` for the holder's lifetime: the kernel drops it
when the process ends in any way (SIGKILL included), so a lock left by a dead run is stale by
construction and the next run takes it over (saying so). The file's text names the holder for the
message a second run prints. ``flock`` works across nodes on NFSv4 and Lustre (with ``flock``
mounts); on a file system without it the lock only protects runs started on the same node.

A dead holder's lock outlives it where the file system's server still counts the holder's node as
alive (NFSv4: until its lease expires, 90 s by default), and a rank of an earlier launch that is cut
off from the others holds it until it ends itself: under the elastic supervisor a refused lock is
therefore also recorded for the supervisor (:func:`wagma_rl.elastic.write_lock_busy`), which waits
until the lock is free (bounded, logged) and relaunches instead of stopping for a configuration
error.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from .exits import JobError

__all__ = ["RunLock", "RunLocked", "describe_holder"]


def describe_holder(record: dict) -> str:
    """A lock record as the log says it: ``host H, pid P, started T``."""
    return (f"host {record.get('host', '?')}, pid {record.get('pid', '?')}, started "
            f"{record.get('started', '?')}")


class RunLocked(JobError):
    """Another live run holds the folder; ``holder`` is its lock record ({} when unreadable)."""

    marker = "is in use by another run"
    """Part of the message (it reaches the other ranks as text)."""

    def __init__(self, message: str, holder: dict | None = None):
        super().__init__(message)
        self.holder = holder or {}


class RunLock:
    """The lock of ``run_dir`` (taken by :meth:`acquire`, released by :meth:`release`)."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / ".lock"
        self._fd: int | None = None
        self.stale: dict | None = None
        """The previous holder's record when a stale lock was taken over, else None."""

    def acquire(self) -> "RunLock":
        """Take the lock or raise :class:`RunLocked` naming the holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            who = describe_holder(holder) if holder else "an unknown process"
            from wagma_rl import elastic

            elastic.write_lock_busy(lock=self.path, holder=holder)
            raise RunLocked(f"run folder {str(self.path.parent)!r} {RunLocked.marker} ({who}); "
                            "wait for it to end or stop it, or choose another run.dir",
                            holder) from None
        previous = _read(fd)
        self.stale = previous or None
        record = {"host": socket.gethostname(), "pid": os.getpid(),
                  "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Give the lock up (the file stays; an unlocked file is free)."""
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:
                pass
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read(fd: int) -> dict:
    try:
        raw = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        return json.loads(raw) if raw else {}
    except (OSError, ValueError):
        return {}
