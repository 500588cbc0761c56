"""Liveness: every rank of a supervised launch beats, and the supervisor tells a dead rank from a
slow one within seconds (MPICH cannot: a collective over a dead rank waits out ``averaging.timeout``).

The job's side needs nothing of its own: a rank of a launch of the supervisor
(``WAGMA_ELASTIC_DIR`` and ``WAGMA_ELASTIC_LAUNCH`` set, and a rank number from the launcher:
``PMI_RANK`` from Hydra, ``SLURM_PROCID`` from ``srun``, ``OMPI_COMM_WORLD_RANK`` or ``PMIX_RANK``
from Open MPI) starts a daemon thread when it imports :mod:`wagma_rl.elastic`, which every job of
the project does (``wagma_rl.job``). The thread rewrites ``beat_<launch>_rank<R>`` in the state
folder every ``WAGMA_ELASTIC_BEAT`` seconds (1): a counter, the host and the pid, in place (one
``pwrite`` of a fixed-size line), so a reader on another node of an NFS mount sees the new value at
its next open (close-to-open consistency). At a normal exit it writes ``ended``.

What the counter says: a Python thread runs while the main thread waits in MPI or in the native
collective (the GIL is released there) and while it computes (the interpreter switches threads
every few ms), so a live rank keeps beating however slow it is. A rank whose process is gone,
stopped (SIGSTOP stops every thread) or whose node is gone stops beating. The supervisor
(:class:`Liveness`) watches the counters with its own clock only (no clock of another node is read),
and calls a rank dead when its counter has not moved for ``dead_after`` seconds; a peer that is
slow but beating is left to ``averaging.timeout``, as before. Processes that a rank starts (e.g.
environment workers of ``multiprocessing``) do not beat.

The verdict reaches the job too: the supervisor writes ``dead_<launch>.json`` (the dead ranks), and
the thread of every rank that registered a callback with :func:`on_dead` (the job's exit policy:
the lowest survivor saves its last synchronised state and records the loss) calls it once with the
dead ranks, from the thread: the main thread may be waiting inside a collective for the dead rank,
where nothing but its deadline reaches it. Without a callback the supervisor ends the launch after
its grace and the job goes on from its newest checkpoint.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable

__all__ = ["BEAT_ENV", "start_if_supervised", "on_dead", "write_dead", "Liveness",
           "rank_from_environment"]

BEAT_ENV = "WAGMA_ELASTIC_BEAT"
_RANK_VARS = ("PMI_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
_LINE = 160  # bytes of a beat file: one fixed-size line, rewritten in place
_started = False
_on_dead: list = []  # callbacks for the supervisor's verdict (this process)


def rank_from_environment(environ=os.environ) -> int | None:
    """This process's rank as its launcher set it, or None."""
    for name in _RANK_VARS:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def beat_path(folder: Path, launch: int, rank: int) -> Path:
    return folder / f"beat_{launch}_rank{rank}"


def verdict_path(folder: Path, launch: int) -> Path:
    return folder / f"dead_{launch}.json"


def write_dead(folder: Path, launch: int, ranks: list[int]) -> None:
    """The supervisor's verdict for the job's ranks: ``ranks`` of ``launch`` are dead."""
    from . import _write_json

    _write_json(verdict_path(folder, launch), {"ranks": list(ranks), "at": time.time()})


def on_dead(callback) -> Callable[[], None]:
    """Call ``callback(ranks)`` (from the heartbeat thread, once for each rank) when the
    supervisor finds ranks of this launch dead and this rank is not one of them; returns the
    function that takes the callback back (e.g. when the job that registered it ends)."""
    _on_dead.append(callback)
    return lambda: _on_dead.remove(callback) if callback in _on_dead else None


def start_if_supervised(environ=os.environ) -> bool:
    """Start this rank's heartbeat when it runs under the supervisor (once per process); returns
    whether it beats."""
    global _started
    from . import elastic_dir, launch_generation

    folder, launch, rank = elastic_dir(environ), launch_generation(environ), rank_from_environment(environ)
    if _started or folder is None or launch is None or rank is None or \
            multiprocessing.parent_process() is not None:
        return _started
    try:
        interval = float(environ.get(BEAT_ENV, "1"))
    except ValueError:
        interval = 1.0
    _started = True
    beat = _Beat(beat_path(folder, launch, rank), interval=max(interval, 0.05),
                 verdict=verdict_path(folder, launch), rank=rank)
    threading.Thread(target=beat.run, name="wagma-elastic-heartbeat", daemon=True).start()
    atexit.register(beat.end)
    return True


class _Beat:
    """One rank's beat file (the thread's loop and the exit mark)."""

    def __init__(self, path: Path, *, interval: float, verdict: Path | None = None,
                 rank: int = -1):
        self.path = path
        self.interval = interval
        self.verdict = verdict
        self.rank = rank
        self.told: set[int] = set()  # the dead ranks passed to the callbacks so far
        self._verdict_mtime = 0
        self.count = 0
        self.ended = False
        self.head = f"{socket.gethostname()} {os.getpid()}"

    def write(self, state: str) -> None:
        line = f"{self.count} {state} {self.head}".ljust(_LINE - 1)[:_LINE - 1] + "\n"
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, line.encode(), 0)
            finally:
                os.close(fd)
        except OSError:
            pass  # (a full or vanished folder: the supervisor's watchdog sees a silent rank)

    def run(self) -> None:
        while not self.ended:
            self.count += 1
            self.write("alive")
            self.check_verdict()
            time.sleep(self.interval)

    def check_verdict(self) -> None:
        """Pass each rank the supervisor's verdict newly names dead to the callbacks, once (one
        ``stat`` a beat while a callback is registered). A job that went on in place after a
        loss can meet a second verdict in the same launch, on other ranks."""
        if not _on_dead or self.verdict is None:
            return
        try:
            mtime = self.verdict.stat().st_mtime_ns
        except OSError:
            return
        if mtime == self._verdict_mtime:
            return
        self._verdict_mtime = mtime
        from . import _read

        ranks = [int(r) for r in (_read(self.verdict) or {}).get("ranks", [])]
        new = [r for r in ranks if r not in self.told]
        if not new or self.rank in ranks:
            return
        self.told.update(new)
        for callback in list(_on_dead):
            try:
                callback(new)
            except Exception as exc:  # noqa: BLE001 - the supervisor's grace decides then
                print(f"wagma_rl.elastic: acting on the dead ranks {new} failed: {exc}",
                      file=sys.stderr, flush=True)

    def end(self) -> None:
        self.ended = True
        self.count += 1
        self.write("ended")


class Liveness:
    """The supervisor's view of one launch's beats: which ranks beat, which stopped, for how long
    (by the supervisor's clock: when it last saw each counter move)."""

    def __init__(self, folder: Path, launch: int):
        self.folder = folder
        self.launch = launch
        self.seen: dict[int, dict] = {}  # rank -> {"count", "state", "host", "pid", "moved"}
        self.gone: set[int] = set()  # ranks the job went on without, in place: no verdict on them

    def poll(self, now: float | None = None) -> None:
        """Read every beat file of the launch (the supervisor, about once a second)."""
        now = time.monotonic() if now is None else now
        for path in self.folder.glob(f"beat_{self.launch}_rank*"):
            try:
                rank = int(path.name.rsplit("rank", 1)[1])
                count, state, host, pid = path.read_text().split()[:4]
                count = int(count)
            except (OSError, ValueError, IndexError):
                continue
            old = self.seen.get(rank)
            if old is None or old["count"] != count:
                self.seen[rank] = {"count": count, "state": state, "host": host, "pid": int(pid),
                                   "moved": now}

    def silent(self, rank: int, now: float | None = None) -> float | None:
        """Seconds since ``rank``'s counter last moved (None: it never beat, or it ended)."""
        now = time.monotonic() if now is None else now
        info = self.seen.get(rank)
        if info is None or info["state"] == "ended" or rank in self.gone:
            return None
        return now - info["moved"]

    def rank_of(self, host: str, pid: int) -> int | None:
        """The launch's rank whose process is ``pid`` on ``host`` (as the job names a rank after
        a shrink, when its ranks no longer are the launch's), or None."""
        return next((r for r, i in self.seen.items() if i["host"] == host and i["pid"] == pid), None)

    def dead(self, dead_after: float, now: float | None = None) -> list[int]:
        """The ranks that beat and then stopped for ``dead_after`` seconds (not those that ended)."""
        return sorted(r for r in self.seen if (s := self.silent(r, now)) is not None and s >= dead_after)

    def quiet_for(self, now: float | None = None) -> float | None:
        """Seconds since any rank's counter last moved (None: no rank beat yet)."""
        now = time.monotonic() if now is None else now
        return now - max(i["moved"] for i in self.seen.values()) if self.seen else None

    def describe(self, rank: int, now: float | None = None) -> str:
        """``rank 3 (host n1, pid 4242)``, as the job names a rank."""
        info = self.seen.get(rank)
        return (f"rank {rank} (host {info['host']}, pid {info['pid']})" if info else f"rank {rank}")
