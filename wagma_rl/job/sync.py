"""The points where every rank of a job is in step (synchronised points), the same for both loops.

A loop keeps one :class:`SyncPoint` beside its :class:`~wagma_rl.job.Job` and calls it::

    sync = SyncPoint(job, checkpoint_every=cfg.run.checkpoint_interval, at=start, ...)
    ...                                          # after every step of this rank:
    sync.keep_own(own_state, ...)                # (only where a loss is survived in place)
    ...                                          # at a synchronised point:
    rows, stop = sync.gather(LAYOUT, row, where="update 12", what="statistics reduction")
    sync.remember(snapshot, ...)                 # the replicas' state, for the survivors of a loss
    if sync.checkpoint_due(12, final=..., stop=stop):
        job.save(...)

Statistics travel as named rows (:class:`RowLayout`): every rank's figures are gathered in one
allgather, and read back by name, one array per field indexed by rank. A stop signal on any rank,
or the elastic supervisor's request for ranks that rejoin, rides in the same row, so every rank
stops at the same point. The state kept in memory is what the survivors of lost ranks go on from
(Open MPI's fault tolerance, docs/mpi.md) or save (:attr:`Job.rescue`, docs/faults.md).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from native_coll import faults

from .lifecycle import Job

__all__ = ["RowLayout", "SyncPoint", "OWN_MODELS"]

#: The averaging whose replicas differ between global averages: after a loss in place every
#: survivor goes on from its own model of its last completed step, kept by :meth:`SyncPoint.keep_own`.
OWN_MODELS = ("wagma", "local_sgd", "dpsgd")


class RowLayout:
    """The fields of the row every rank contributes to a statistics gather, by name: ``scalars``
    (one number each), then ``vectors`` (name: width, the same on every rank)."""

    def __init__(self, scalars: Sequence[str], vectors: Mapping[str, int] | None = None):
        self.widths: dict[str, int | None] = {**dict.fromkeys(scalars), **(vectors or {})}
        """Each field's width (None: a scalar), in the row's order."""
        self.size = sum(1 if w is None else w for w in self.widths.values())

    def pack(self, values: Mapping[str, Any]) -> np.ndarray:
        """This rank's row (float64) from ``values``, one per field."""
        if values.keys() != self.widths.keys():
            raise KeyError(f"row fields {sorted(values)} are not the layout's {sorted(self.widths)}")
        parts = []
        for name, width in self.widths.items():
            part = np.asarray(values[name], dtype=np.float64).reshape(-1)
            if part.size != (1 if width is None else width):
                raise ValueError(f"row field {name!r}: {part.size} values, the layout has {width}")
            parts.append(part)
        return np.concatenate(parts) if parts else np.zeros(0)

    def columns(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The gathered ``rows`` (row r from rank r) by field: a scalar's values by rank, shape
        ``(ranks,)``; a vector's, ``(ranks, width)``."""
        out, at = {}, 0
        for name, width in self.widths.items():
            out[name] = rows[:, at] if width is None else rows[:, at:at + width]
            at += 1 if width is None else width
        return out

    def totals(self, rows: np.ndarray) -> dict[str, Any]:
        """Each field of the gathered ``rows`` summed over the ranks, in rank order."""
        return {name: value[0] for name, value in self.columns(rows.sum(axis=0, keepdims=True)).items()}


class SyncPoint:
    """What a loop does where all its ranks are in step: gather statistics (with the stop folded
    in), decide the checkpoint cadence, and keep the state the survivors of a loss go on from.

    Args:
        job: the job (its bounded communicator is read at every call: a shrink replaces it).
        checkpoint_every: iterations between checkpoints (``run.checkpoint_interval``; 0: only
            at the end and at a stop).
        at: the iteration the run starts at (the cadence counts from it).
        aligned: checkpoints at the multiples of ``checkpoint_every`` (the supervised jobs, whose
            evaluations fall on fixed steps); otherwise ``checkpoint_every`` iterations after the
            last one or more (the RL trainer, whose synchronised updates follow the averaging).
        keep_synced: keep the state of the last two synchronised points (:meth:`remember`).
        own_models: the averaging leaves each replica its own model between global averages
            (:data:`OWN_MODELS`): where a loss is survived in place (``faults.fault_tolerant()``),
            each rank keeps its own state after every step too (:meth:`keep_own`).
    """

    def __init__(self, job: Job, *, checkpoint_every: int, at: int, aligned: bool,
                 keep_synced: bool, own_models: bool):
        self.job = job
        self.every, self.saved_at, self.aligned = int(checkpoint_every), int(at), aligned
        self.keep_synced = keep_synced
        self.in_place = faults.fault_tolerant()
        """Whether a lost rank is survived in the same processes (Open MPI's ULFM)."""
        self.keeps_own = own_models and self.in_place
        self.snapshot: dict[str, Any] | None = None
        """The state of the last synchronised point (identical on every rank; a copy in memory)."""
        self.previous: dict[str, Any] | None = None
        """The one before: a synchronised point that completed on some survivors and failed on
        others (a rank died inside it) leaves them one apart, and they agree on the older."""
        self.kept: dict[str, Any] | None = None
        """This rank's own state after its last completed step (:meth:`keep_own`)."""
        self._mine: tuple[Any, Any] = (None, None)  # this rank's own figure at each snapshot

    def gather(self, layout: RowLayout, row: Mapping[str, Any], *, where: str,
               what: str) -> tuple[np.ndarray, bool]:
        """Every rank's ``row`` (``layout``'s fields but ``stop``, which is added here; row r from
        rank r: read it with :meth:`RowLayout.columns` or :meth:`RowLayout.totals`) and whether
        any rank stops here: a stop signal reached it, or (rank 0) the elastic supervisor
        has ranks that rejoin (:meth:`Job.check_rejoin`; ``where`` names this point, e.g.
        ``"update 12"``). One allgather (``what`` names it should a rank not answer). Collective."""
        self.job.check_rejoin(where)
        rows = self.job.deadline.allgather(layout.pack({**row, "stop": self.job.stop_requested}),
                                           what=what)
        return rows, bool(layout.columns(rows)["stop"].max())

    def checkpoint_due(self, at: int, *, final: bool, stop: bool) -> bool:
        """Whether the synchronised point at iteration ``at`` writes a checkpoint: at the end
        (``final``), at a stop, and by the cadence (counted from here when it does)."""
        every = self.every
        by_cadence = bool(every) and (at % every == 0 if self.aligned else at - self.saved_at >= every)
        if final or stop or by_cadence:
            self.saved_at = at
            return True
        return False

    def remember(self, snapshot: Callable[..., dict[str, Any]], *args: Any, mine: Any = None) -> None:
        """At a synchronised point: keep ``snapshot(*args)`` (a copy of the replicas' state) as the
        newest, the newest as the one before, where :attr:`keep_synced` (otherwise nothing is
        copied); ``mine``: this rank's own figure at it, for :meth:`common` (e.g. its samples)."""
        if self.keep_synced:
            self.previous, self.snapshot = self.snapshot, snapshot(*args)
            self._mine = (mine, self._mine[0])

    def keep_own(self, own_state: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> None:
        """After this rank's step: keep ``own_state(*args, **kwargs)`` (a copy of its own model and
        optimizer state) where a loss is survived in place and replicas differ (:attr:`keeps_own`);
        otherwise nothing is copied."""
        if self.keeps_own:
            self.kept = own_state(*args, **kwargs)

    def common(self, *, key: str) -> tuple[dict[str, Any], Any]:
        """After :meth:`Job.shrink`: the snapshot every survivor holds (:meth:`Job.common_snapshot`;
        ``key``: its position, ``"update"`` or ``"step"``) and this rank's own figure at it.
        Collective over the survivors."""
        snap = self.job.common_snapshot((self.snapshot, self.previous), key=key)
        return snap, self._mine[0 if snap is self.snapshot else 1]

    def restart(self, snapshot: dict[str, Any], *, mine: Any = None) -> None:
        """After going on in place from ``snapshot``: it is the only state kept."""
        self.snapshot, self.previous, self._mine = snapshot, None, (mine, None)
