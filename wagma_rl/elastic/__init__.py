"""Training on with the ranks that are left: what a job and its supervisor tell each other.

MPICH 5 (the PyPI wheel) cannot keep a communicator alive past a dead rank (docs/faults.md), so a
job does not shrink in place. Instead, when ranks are lost:

1. every survivor stops within ``distrib.timeout`` naming the lost ranks (as before), and the
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
state). Every file in it is written whole (temporary file, then rename).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

__all__ = ["ELASTIC_DIR_ENV", "elastic_dir", "named", "write_loss", "read_losses", "rejoin_requested",
           "request_rejoin", "write_finished", "finished", "write_stopped_for_rejoin",
           "stopped_for_rejoin", "hydra_notifies", "HYDRA_NOTIFIES_ENV", "write_launch_note", "launch_note",
           "clear"]

ELASTIC_DIR_ENV = "WAGMA_ELASTIC_DIR"
HYDRA_NOTIFIES_ENV = "WAGMA_ELASTIC_HYDRA"
_REJOIN = "rejoin"
_FINISHED = "finished.json"
_STOPPED = "stopped.json"
_NOTE = "launch.json"


def elastic_dir(environ=os.environ) -> Path | None:
    """The folder the supervisor gave this job, or None when the job runs without one."""
    value = environ.get(ELASTIC_DIR_ENV, "")
    return Path(value) if value else None


def hydra_notifies(environ=os.environ) -> bool:
    """Whether this job runs under the supervisor's ``mpiexec -disable-auto-cleanup``, whose Hydra
    sends SIGUSR1 to the remaining ranks whenever one ends (the job ignores it there)."""
    return environ.get(HYDRA_NOTIFIES_ENV, "") == "1"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def named(ranks, peers) -> list[dict[str, Any]]:
    """The lost ``ranks`` as a loss record lists them, ``{"rank", "host", "pid"}`` each, from the
    job's (rank, host, pid) table ``peers`` (``wagma_rl.job.deadline.Peer``s; "?" and 0 where a rank
    is not in it)."""
    table = {p.rank: p for p in peers}
    return [{"rank": r, "host": table[r].host if r in table else "?",
             "pid": table[r].pid if r in table else 0} for r in sorted(set(ranks))]


def write_loss(*, writer: int, world_size: int, lost: Sequence[dict[str, Any]],
               checkpoint: str | None, update: int | None, frames: int | None, why: str,
               state_error: str | None = None, folder: Path | None = None) -> Path | None:
    """Record, as the survivors' writer ``writer``, which ranks were lost (``{"rank", "host",
    "pid"}`` each) and where the survivors' state went (``checkpoint``; None: the job goes on from
    its newest checkpoint; ``state_error``: why the survivors could not save it, and the job must
    not go on); returns the file (None without a folder)."""
    folder = folder if folder is not None else elastic_dir()
    if folder is None:
        return None
    gone = {int(p["rank"]) for p in lost}
    record = {"writer": writer, "world_size": world_size, "lost": list(lost),
              "survivors": [r for r in range(world_size) if r not in gone],
              "checkpoint": checkpoint, "update": update, "frames": frames,
              "detected_at": time.time(), "why": why, "state_error": state_error}
    path = folder / f"loss_rank{writer}.json"
    _write_json(path, record)
    return path


def read_losses(folder: Path) -> list[dict[str, Any]]:
    """The loss records in ``folder``, those of the survivors' side holding the most ranks first
    (on a split network each side writes one: the larger side, then the one with the lowest rank,
    is the job that goes on)."""
    records = []
    for path in sorted(folder.glob("loss_rank*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(records, key=lambda r: (-len(r["survivors"]), min(r["survivors"], default=1 << 30)))


def request_rejoin(folder: Path, hosts: Sequence[str]) -> None:
    """Ask the job to stop at its next synchronised update (saving a checkpoint) for a relaunch."""
    _write_json(folder / _REJOIN, {"hosts": list(hosts), "at": time.time()})


def rejoin_requested(folder: Path | None = None) -> bool:
    """Whether the supervisor asked this job to stop for ranks that rejoin (rank 0 asks, at every
    synchronised update: one ``stat``)."""
    folder = folder if folder is not None else elastic_dir()
    return folder is not None and (folder / _REJOIN).exists()


def write_finished(*, frames: int, update: int, folder: Path | None = None) -> None:
    """Tell the supervisor the job spent its whole frame budget (rank 0, at the end)."""
    folder = folder if folder is not None else elastic_dir()
    if folder is not None:
        _write_json(folder / _FINISHED, {"frames": frames, "update": update, "at": time.time()})


def write_stopped_for_rejoin(*, frames: int, update: int, checkpoint: str | None,
                             folder: Path | None = None) -> None:
    """Tell the supervisor the job stopped as asked, its state saved (rank 0, at the end)."""
    folder = folder if folder is not None else elastic_dir()
    if folder is not None:
        _write_json(folder / _STOPPED, {"frames": frames, "update": update,
                                        "checkpoint": checkpoint, "at": time.time()})


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def finished(folder: Path) -> dict[str, Any] | None:
    """What :func:`write_finished` wrote, or None."""
    return _read(folder / _FINISHED)


def stopped_for_rejoin(folder: Path) -> dict[str, Any] | None:
    """What :func:`write_stopped_for_rejoin` wrote, or None."""
    return _read(folder / _STOPPED)


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
    for path in [*folder.glob("loss_rank*.json"), folder / _REJOIN, folder / _FINISHED,
                 folder / _STOPPED]:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
