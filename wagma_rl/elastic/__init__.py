"""Training on with the ranks that are left: what a job and its supervisor tell each other.

MPICH 5 (the PyPI wheel) cannot keep a communicator alive past a dead rank (docs/faults.md), so a
job does not shrink in place. Instead, when ranks are lost:

1. every survivor stops within ``averaging.timeout`` naming the lost ranks (as before), and the
   lowest survivor writes the state of the last synchronised update, which every rank keeps in
   memory, as a checkpoint, plus a *loss record* naming the lost ranks (:func:`write_loss`);
2. the supervisor (``python -m wagma_rl.elastic``, :mod:`wagma_rl.elastic.supervisor`) reads the
   record and relaunches the job on the slots that are left, through the same launcher (Hydra's
   ``mpiexec`` or ``srun`` inside the allocation); the job resumes from that checkpoint at the
   smaller world size;
3. when a lost host answers again, the supervisor asks the job to stop at its next synchronised
   update (:func:`rejoin_requested`), and relaunches it on every slot; the ranks that rejoin copy
   the model and optimizer state from rank 0 over MPI.

The two sides meet in one folder, named by the ``WAGMA_ELASTIC_DIR`` environment variable that the
supervisor sets for the job (unset: a job runs as before, and a loss still saves the survivors'
state). Every file in it is written whole (temporary file, then rename), and none of the job's
writes raises: a record that cannot be written (a full disk) is one line on stderr, and the
supervisor's watchdog ends a launch that shows no progress (:mod:`wagma_rl.elastic.heartbeat`).

Every launch has a generation (``WAGMA_ELASTIC_LAUNCH``, 1, 2, ...), which every record and
request carries: a record written late by a process of an earlier launch (a rank cut off from the
others that times out after the relaunch) is ignored by the supervisor, with a line saying so, and
a rejoin request reaches only the launch it was made for.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

__all__ = ["ELASTIC_DIR_ENV", "LAUNCH_ENV", "elastic_dir", "launch_generation", "named", "write_loss",
           "write_env_failure", "env_failures", "write_in_place", "read_in_place",
           "read_losses", "rejoin_requested", "request_rejoin", "write_finished", "finished",
           "write_stopped_for_rejoin", "stopped_for_rejoin", "write_lock_busy", "lock_busy",
           "hydra_notifies", "HYDRA_NOTIFIES_ENV", "write_launch_note", "launch_note", "clear"]

ELASTIC_DIR_ENV = "WAGMA_ELASTIC_DIR"
LAUNCH_ENV = "WAGMA_ELASTIC_LAUNCH"
HYDRA_NOTIFIES_ENV = "WAGMA_ELASTIC_HYDRA"
_REJOIN = "rejoin"
_FINISHED = "finished.json"
_STOPPED = "stopped.json"
_LOCK_BUSY = "lock_busy.json"
_NOTE = "launch.json"


def elastic_dir(environ=os.environ) -> Path | None:
    """The folder the supervisor gave this job, or None when the job runs without one."""
    value = environ.get(ELASTIC_DIR_ENV, "")
    return Path(value) if value else None


def launch_generation(environ=os.environ) -> int | None:
    """Which launch of the supervisor this process belongs to (1, 2, ...), or None without one."""
    value = environ.get(LAUNCH_ENV, "")
    return int(value) if value.isdigit() else None


def hydra_notifies(environ=os.environ) -> bool:
    """Whether this job runs under the supervisor's ``mpiexec -disable-auto-cleanup``, whose Hydra
    sends SIGUSR1 to the remaining ranks whenever one ends (the job ignores it there)."""
    return environ.get(HYDRA_NOTIFIES_ENV, "") == "1"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def _record(path: Path, data: dict[str, Any]) -> Path | None:
    """Write a record of this launch (the job's side): never raises, since it is called where the
    job is already failing (e.g. the disk is full); a record that cannot be written is one line on
    stderr, and the supervisor's watchdog ends the launch instead."""
    try:
        _write_json(path, dict(data, launch=launch_generation()))
        return path
    except OSError as exc:
        try:
            path.with_name(f".{path.name}.{os.getpid()}.tmp").unlink(missing_ok=True)
        except OSError:
            pass
        print(f"wagma_rl.elastic: cannot write {path} ({exc.strerror or exc}); the supervisor's "
              "watchdog ends this launch", file=sys.stderr, flush=True)
        return None


def _of_launch(record: dict[str, Any] | None, launch: int | None) -> bool:
    """Whether ``record`` belongs to ``launch`` (any record when ``launch`` is None)."""
    return record is not None and (launch is None or record.get("launch") == launch)


def named(ranks, peers) -> list[dict[str, Any]]:
    """The lost ``ranks`` as a loss record lists them, ``{"rank", "host", "pid"}`` each, from the
    job's (rank, host, pid) table ``peers`` (``wagma_rl.bounded_comm.Peer``s; "?" and 0 where a rank
    is not in it)."""
    table = {p.rank: p for p in peers}
    return [{"rank": r, "host": table[r].host if r in table else "?",
             "pid": table[r].pid if r in table else 0} for r in sorted(set(ranks))]


def write_loss(*, writer: int, world_size: int, lost: Sequence[dict[str, Any]],
               checkpoint: str | None, update: int | None, frames: int | None, why: str,
               state_error: str | None = None, saved: str | None = None,
               folder: Path | None = None) -> Path | None:
    """Record, as the survivors' writer ``writer``, which ranks were lost (``{"rank", "host",
    "pid"}`` each) and where the survivors' state went (``checkpoint``; None: the job goes on from
    its newest checkpoint; ``state_error``: why the survivors could not save it, and the job must
    not go on; ``saved``: that state's position in the stack's own words, e.g. ``"update 12 (768
    frames)"`` or ``"step 40 (640 samples)"``, for the supervisor's line); returns the file (None without a folder, or when it could not be written: never
    raises)."""
    folder = folder if folder is not None else elastic_dir()
    if folder is None:
        return None
    gone = {int(p["rank"]) for p in lost}
    record = {"writer": writer, "world_size": world_size, "lost": list(lost),
              "survivors": [r for r in range(world_size) if r not in gone],
              "checkpoint": checkpoint, "update": update, "frames": frames,
              "detected_at": time.time(), "why": why, "state_error": state_error, "saved": saved}
    return _record(folder / f"loss_rank{writer}.json", record)


def read_losses(folder: Path, *, launch: int | None = None,
                stale: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The loss records in ``folder`` (of ``launch`` only, when given: the others go to ``stale``),
    those of the survivors' side holding the most ranks first (on a split network each side writes
    one: the larger side, then the one with the lowest rank, is the job that goes on)."""
    records = []
    for path in sorted(folder.glob("loss_rank*.json")):
        record = _read(path)
        if _of_launch(record, launch):
            records.append(record)
        elif record is not None and stale is not None:
            stale.append(dict(record, file=path.name))
    return sorted(records, key=lambda r: (-len(r["survivors"]), min(r["survivors"], default=1 << 30)))


def write_in_place(*, writer: int, world_size: int, lost: Sequence[dict[str, Any]],
                   folder: Path | None = None) -> Path | None:
    """Record, as the survivors' new rank 0 ``writer``, that the job went on in place without
    ``lost`` (``{"rank", "host", "pid"}`` each, ranks of the communicator of ``world_size``
    ranks they were lost from) after shrinking (Open MPI with ULFM): the supervisor takes their
    slots out and tries their hosts again later, without ending the launch. One file per shrink
    (its world size before the shrink names it); never raises."""
    folder = folder if folder is not None else elastic_dir()
    if folder is None:
        return None
    return _record(folder / f"in_place_{world_size}.json",
                   {"writer": writer, "world_size": world_size, "lost": list(lost),
                    "at": time.time()})


def read_in_place(folder: Path, *, launch: int | None = None) -> list[dict[str, Any]]:
    """The in-place records of ``launch`` (:func:`write_in_place`), the first shrink first."""
    records = [r for path in folder.glob("in_place_*.json")
               if _of_launch(r := _read(path), launch)]
    return sorted(records, key=lambda r: -int(r["world_size"]))


def write_env_failure(*, rank: int, why: str, folder: Path | None = None) -> Path | None:
    """Record, from the rank whose environment worker died or hung, that its end is the
    simulator's fault and not its host's: the supervisor then relaunches on the same slots
    instead of taking the host out (the peers still report the rank lost)."""
    folder = folder if folder is not None else elastic_dir()
    if folder is None:
        return None
    return _record(folder / f"env_failure_rank{rank}.json", {"rank": rank, "why": why})


def env_failures(folder: Path, *, launch: int | None = None) -> set[int]:
    """The ranks of ``launch`` that recorded an environment worker's failure."""
    ranks = set()
    for path in folder.glob("env_failure_rank*.json"):
        record = _read(path)
        if _of_launch(record, launch):
            ranks.add(int(record["rank"]))
    return ranks


def request_rejoin(folder: Path, hosts: Sequence[str], *, launch: int | None = None) -> None:
    """Ask the job's launch ``launch`` (None: whichever runs) to stop at its next synchronised
    update (saving a checkpoint) for a relaunch."""
    _write_json(folder / _REJOIN, {"hosts": list(hosts), "at": time.time(), "launch": launch})


def rejoin_requested(folder: Path | None = None) -> bool:
    """Whether the supervisor asked this launch of the job to stop for ranks that rejoin (rank 0
    asks, at every synchronised update: one ``stat`` while there is no request)."""
    folder = folder if folder is not None else elastic_dir()
    if folder is None or not (folder / _REJOIN).exists():
        return False
    mine, request = launch_generation(), _read(folder / _REJOIN) or {}
    return mine is None or request.get("launch") in (None, mine)


def write_finished(*, frames: int, update: int, folder: Path | None = None) -> None:
    """Tell the supervisor the job spent its whole frame budget (rank 0, at the end)."""
    folder = folder if folder is not None else elastic_dir()
    if folder is not None:
        _record(folder / _FINISHED, {"frames": frames, "update": update, "at": time.time()})


def write_stopped_for_rejoin(*, frames: int, update: int, checkpoint: str | None,
                             folder: Path | None = None) -> None:
    """Tell the supervisor the job stopped as asked, its state saved (rank 0, at the end)."""
    folder = folder if folder is not None else elastic_dir()
    if folder is not None:
        _record(folder / _STOPPED, {"frames": frames, "update": update,
                                    "checkpoint": checkpoint, "at": time.time()})


def write_lock_busy(*, lock: Path, holder: dict[str, Any], folder: Path | None = None) -> None:
    """Tell the supervisor that this launch could not take the run folder's lock (``lock``,
    held by ``holder``): a rank of an earlier launch that has not ended yet, or a dead client's
    lock that the shared file system still keeps. The supervisor waits for it and relaunches
    instead of stopping for a configuration error (rank 0, at the start)."""
    folder = folder if folder is not None else elastic_dir()
    if folder is not None:
        _record(folder / _LOCK_BUSY, {"lock": str(lock), "holder": holder, "at": time.time()})


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def finished(folder: Path, *, launch: int | None = None) -> dict[str, Any] | None:
    """What :func:`write_finished` wrote (in ``launch``, when given), or None."""
    record = _read(folder / _FINISHED)
    return record if _of_launch(record, launch) else None


def stopped_for_rejoin(folder: Path, *, launch: int | None = None) -> dict[str, Any] | None:
    """What :func:`write_stopped_for_rejoin` wrote (in ``launch``, when given), or None."""
    record = _read(folder / _STOPPED)
    return record if _of_launch(record, launch) else None


def lock_busy(folder: Path, *, launch: int | None = None) -> dict[str, Any] | None:
    """What :func:`write_lock_busy` wrote (in ``launch``, when given), or None."""
    record = _read(folder / _LOCK_BUSY)
    return record if _of_launch(record, launch) else None


def write_launch_note(folder: Path, *, reason: str, detected_at: float, since: str,
                      world_size: int) -> None:
    """Why the supervisor relaunches the job, for the job's log (the supervisor, before it):
    ``detected_at`` is when what ``since`` names happened (e.g. "the loss was detected")."""
    _write_json(folder / _NOTE, {"reason": reason, "detected_at": detected_at, "since": since,
                                 "world_size": world_size})


def launch_note(folder: Path | None = None) -> dict[str, Any] | None:
    """What :func:`write_launch_note` wrote for this launch, or None (a first launch, no
    supervisor)."""
    folder = folder if folder is not None else elastic_dir()
    if folder is None:
        return None
    try:
        return json.loads((folder / _NOTE).read_text())
    except (OSError, ValueError):
        return None


def clear(folder: Path) -> None:
    """Remove the records of the last launch (the supervisor, before each launch)."""
    for path in [*folder.glob("loss_rank*.json"), *folder.glob("beat_*"), *folder.glob("dead_*"),
                 *folder.glob("in_place_*.json"),
                 folder / _REJOIN, folder / _FINISHED, folder / _STOPPED, folder / _LOCK_BUSY]:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


# A rank of a supervised launch beats from the moment the job imports this package (every job of
# the project does, through wagma_rl.job): see heartbeat.py.
from . import heartbeat as _heartbeat  # noqa: E402

_heartbeat.start_if_supervised()
