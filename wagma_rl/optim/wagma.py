"""WAGMA-SGD: local steps, then wait-avoiding group model averaging through ``native_coll``."""
from __future__ import annotations

import time
from typing import Iterable

import numpy as np
import torch
from mpi4py import MPI

from wagma_rl.bounded_comm import DEFAULT_TIMEOUT

from ._native import native_coll
from .averaging import agree
from .background import check_background
from .base import DistributedOptimizer
from .finite import NonFiniteError, is_finite
from .outer import build_outer, check_outer_options
from .precision import precision_options

__all__ = ["WAGMA"]


class WAGMA(DistributedOptimizer):
    """Wait-Avoiding Group Model Averaging around any ``torch.optim.Optimizer``.

    ``step()`` runs the wrapped optimizer's step; every ``local_steps``-th step it then averages
    the model with its group (``group_size`` ranks, rotating butterfly groups) through the native
    wait-avoiding allreduce: ranks that arrive late are represented by their last published model
    and merge their own progress when they arrive, so nobody waits for a straggler. Every
    ``sync_period``-th average is global: with ``global_mode="blocking"`` (default) all ranks wait
    for each other there and all replicas are then identical; with ``"overlap"`` each rank
    contributes a snapshot and goes on, and takes ``average + (own progress since the snapshot)``
    at a later average (at the latest the next global one, which waits for every rank to have
    reached this one). :meth:`synchronize` makes the replicas identical in both modes.
    Optimizer state (momentum, Adam moments) stays local.

    Args:
        optimizer: the wrapped ``torch.optim.Optimizer``.
        group_size: ranks per averaging group, 1 to the world size. With the world size and
            group size powers of two the groups form a butterfly; otherwise the ranks are cut
            into ``world // group_size`` pseudo-random groups of ``group_size`` to
            ``2 * group_size - 1`` members (see ``native_coll.group_of``).
        sync_period: every ``sync_period``-th average is global (tau in the paper).
        local_steps: optimizer steps per average (``0`` = only when :meth:`average` is called).
        late: what a rank whose group averaged without it (its stale model stood in) gets when it
            arrives: ``"apply"`` (default, as ``averaging.late`` in both stacks' configs) the
            result plus all of its progress since that model, which conserves the sum of the
            models over the ranks, so no rank's local steps are lost (the peers receive them at
            later averages); ``"merge"`` the result plus that progress divided by the group
            size, i.e. what it would have got on time, but its peers never see the rest (with a
            PPO update per average merge loses all but 1/group size of a late update:
            docs/results/training.md, Mode comparison).
        global_mode: ``"blocking"`` or ``"overlap"`` (see above and docs/overlap.md). In
            overlap mode ``stats.extra["global_lag"]`` is the number of averages between the last
            applied global snapshot and its application (at most ``sync_period``), and
            ``state_dict()`` does not carry a global average still outstanding: call
            :meth:`synchronize` before saving.
        comm: communicator (default ``MPI.COMM_WORLD``).
        timeout: seconds a collective may wait for an unresponsive rank before raising
            ``native_coll.CollectiveTimeout`` (naming it).
        nonfinite: no average with NaN or inf in it is ever applied: the native collective
            tests each result while it computes it (no extra pass) and refuses a poisoned one on
            every member of that average, leaving each model as it was. ``"raise"`` (default):
            the rank that held the NaN or inf tells its peers, and every rank raises the same
            :class:`~wagma_rl.optim.finite.NonFiniteError` naming it, the members of the refused
            average at once, the others at their next average (group averages never wait, so
            they learn it there; the blocking global one agrees first). ``"drop"``: that rank
            takes back its last averaged model, the members skip the average (counted in
            ``stats.extra["nonfinite_skipped"]``) and training goes on (this keeps one copy of
            the model per average).
        buffers: module buffers to average with the parameters.
        views: let the parameters be views into the averaging buffer (CPU float32 models).
        outer: ``None`` (default) or ``"nesterov"``: an outer Nesterov-momentum step on every
            global average (every ``sync_period``-th; group averages are untouched), DiLoCo's
            outer optimizer (:mod:`wagma_rl.optim.outer`; two more model-size float32 buffers).
            Blocking: taken right after the global call, on the average every rank holds.
            Overlap: taken by the native collective where it applies the average, so every rank
            gets ``T + (own progress since its snapshot)`` with the same T.
        outer_lr: the outer step's learning rate (> 0; DiLoCo 0.7; 1 with momentum 0 = plain).
        outer_momentum: the outer step's momentum, in [0, 1) (DiLoCo 0.9).
        global_precision: ``"fp32"`` (default) or ``"bf16"``/``"fp16"``: global averages send
            16-bit pseudo-gradients through the native collective (each rank's model, or its
            overlapped snapshot, minus the last global model B, rounded to nearest even), half
            the bytes; the mean is rounded to 16 bits once and every rank takes ``B + mean``,
            bitwise identical (docs/optimizers.md#low-precision-global-exchange). B is the outer
            optimizer's ``prev`` when there is one, else one more model-size float32 copy. Group
            averages and :meth:`synchronize` stay float32.
        background: the averages ``step()`` schedules run on a thread while the next forward
            and backward pass compute, and the next ``step()`` (or :meth:`wait_average`) puts the
            result into the parameters before it writes them: that step's gradient was computed
            at the model this rank contributed, one pass late (a rank the group averaged
            without computes at its own model too). The result is taken whole under ``late``
            ``"merge"`` and ``"apply"`` alike: no local step runs while it is in flight, so there
            is no progress for the late rule to divide. The parameters are then packed into the
            averaging buffer, never views of it (the thread writes it while the forward pass
            reads them). :meth:`average` called directly stays blocking.
    """

    _collective_first_check = False

    def __init__(self, optimizer: torch.optim.Optimizer, *, group_size: int, sync_period: int,
                 local_steps: int = 1, late: str = "apply", global_mode: str = "blocking",
                 comm: MPI.Comm | None = None,
                 timeout: float = DEFAULT_TIMEOUT, nonfinite: str = "raise",
                 buffers: Iterable[torch.Tensor] | None = None, views: bool = True,
                 outer: str | None = None, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 global_precision: str = "fp32", background: bool = False):
        for name, value, low in (("group_size", group_size, 1), ("sync_period", sync_period, 1),
                                 ("local_steps", local_steps, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"WAGMA {name} must be an integer >= {low}, got {value!r}")
        if not timeout > 0:
            raise ValueError(f"WAGMA timeout must be positive seconds, got {timeout!r}")
        if late not in ("merge", "apply"):
            raise ValueError(f"WAGMA late must be 'merge' or 'apply', got {late!r}")
        if global_mode not in ("blocking", "overlap"):
            raise ValueError(f"WAGMA global_mode must be 'blocking' or 'overlap', got {global_mode!r}")
        check_background("WAGMA", background)
        outer_options = check_outer_options("WAGMA", outer, outer_lr, outer_momentum)
        precision_option = precision_options("WAGMA", global_precision)
        native_coll()  # a missing native module fails here, before the base class's collectives
        self.group_size, self.sync_period, self.local_steps = group_size, sync_period, local_steps
        self.timeout, self.late, self.global_mode = float(timeout), late, global_mode
        self.global_precision, self.background = global_precision, background
        super().__init__(optimizer, comm=comm, buffers=buffers, views=views and not background,
                         options={"group_size": group_size, "sync_period": sync_period,
                                  "local_steps": local_steps, "late": late,
                                  "global_mode": global_mode, **outer_options, **precision_option,
                                  **({"background": True} if background else {})},
                         timeout=timeout, nonfinite=nonfinite)
        size = self.world_size
        problem = None
        if group_size > size:
            problem = (f"group_size={group_size} does not fit {size} rank{'s' if size > 1 else ''}: "
                       f"it must be between 1 and the number of ranks (at most group_size={size})")
        agree(self._deadline, problem)
        self._local_since_avg = 0
        self.last_arrival_wait_s = 0.0
        """Seconds the last average waited for the other ranks to arrive (global averages)."""
        # nonfinite="drop": the last averaged model, taken back when a fresh one is not finite.
        self._good = self._flat.body.clone() if self.nonfinite == "drop" else None
        # Over the whole averaged buffer (the model and its status slots, which stay zero): the
        # native collective steps that buffer.
        self._outer = build_outer(outer_options, self._flat.body, extra=self._flat.extra)
        # global_precision: B, the last global model over the whole averaged buffer (identical on
        # every rank; at first the broadcast model): the outer optimizer's prev when there is
        # one, else a copy of our own. The native collective reads it inside global averages.
        self._base = (self._flat.flat.clone()
                      if global_precision != "fp32" and self._outer is None else None)
        self._wa = self._collective(start_iteration=0)

    def _collective(self, *, start_iteration: int):
        # Everyone present first, so the native constructor's own collectives cannot hang on a
        # rank that never comes.
        self._deadline.barrier("WAGMA collective start-up")
        wa = native_coll().WaitAvoidingAllreduce(
            self.comm, self._flat.flat, group_size=self.group_size, sync_period=self.sync_period,
            start_iteration=start_iteration, global_mode=self.global_mode, timeout=self.timeout,
            global_precision=self.global_precision,
            global_base=self._outer.prev if self._outer is not None else self._base)
        if self._outer is not None and self.global_mode == "overlap":
            # An overlapped average is applied inside a later native call (possibly one that then
            # runs a group iteration), so the outer step is taken there, before anything else.
            wa.set_outer(self._outer.prev, self._outer.buf, lr=self._outer.lr,
                         mu=self._outer.momentum)
        return wa

    @property
    def iteration(self) -> int:
        """Index of the next group average (the position in the group/global schedule)."""
        return self._wa.iteration

    def group(self, t: int | None = None) -> tuple[int, ...]:
        """Ranks in this rank's group at average ``t`` (default: the next one)."""
        return tuple(self._wa.group(self.iteration if t is None else t))

    def is_global(self, t: int | None = None) -> bool:
        """Whether average ``t`` (default: the next one) is a global one."""
        return bool(self._wa.is_global(self.iteration if t is None else t))

    def step(self, closure=None):
        """Take the background average in flight, if any; run the wrapped optimizer's step;
        every ``local_steps``-th step, average with the group (in the background with
        ``background=True``)."""
        self.wait_average()
        self._check_step()
        loss = self.optimizer.step(closure)
        self._stats.steps += 1
        self._local_since_avg += 1
        if self.local_steps and self._local_since_avg >= self.local_steps:
            self._local_since_avg = 0
            self._start_average(background=self.background)
        return loss

    def average(self):
        """One wait-avoiding group (or, on schedule, global) model average now.

        Returns the ``native_coll.CollectiveInfo`` (also in ``stats.info``), or None when the
        average was refused because NaN or inf reached it and training goes on (``nonfinite``).
        """
        if self._closed:
            raise RuntimeError("WAGMA.average() after close()")
        self.wait_average()
        self._local_since_avg = 0
        return self._start_average()

    def _exchange_flat(self):
        """The average of the gathered flat buffer, in place; (info or None, seconds)."""
        self.last_arrival_wait_s = 0.0
        heard = bool(self._deadline.notices())
        if not heard and self.is_global() and self.global_mode == "overlap":
            heard = self._await_outstanding_global()
        if heard or (self.is_global() and self.global_mode == "blocking"):
            # A peer reported non-finite values, or the blocking global average (which would wait
            # for that peer) is next: agree first, in one tiny bounded allreduce. An overlapped
            # global call waits only for the previous global (above), so peers learn of a notice
            # there or at their next average.
            self._agree_finite(0)
        t0 = time.perf_counter()
        info = self._native_average()
        seconds = time.perf_counter() - t0
        if info is None:
            return None, seconds  # the last averaged model is where it was put back
        if self._outer is not None and info.kind == "global" and self.global_mode == "blocking":
            # The average is bitwise identical on every rank, so T is too. Publish T: it, not
            # the plain average, is the model this rank continues from (a stand-in for it).
            self._outer.step(self._flat.flat)  # prev = T: also the next B (global_precision)
            self._wa.publish()
        elif self._base is not None and info.kind == "global" and self.global_mode == "blocking":
            self._base.copy_(self._flat.flat)  # the next B: this global's model (overlap: the
            # native collective makes B the average where it applies it)
        if self._good is not None:
            self._good.copy_(self._flat.body)
        return info, seconds

    def _finish_average(self, info):
        self._scatter_average()
        if info is None:
            return None
        self._stats.averages += 1
        self._stats.info = info
        self._stats.staleness = int(info.staleness)
        if info.applied_global is not None:
            self._stats.extra["global_lag"] = int(info.global_lag)
        return info

    def synchronize(self) -> None:
        """Blocking global model average now; afterwards every rank's parameters are bitwise equal.

        In overlap mode the outstanding global average is applied first. Collective: every rank
        must call it, after the same number of averages. Use before evaluation and checkpoints.
        """
        self.wait_average()
        self._flat.gather()
        if self._await_outstanding_global():
            self._agree_finite(0)  # raises: the notice's sender marks itself there
        try:
            self._native(self._wa.settle)
            agreed = False
        except native_coll().NonFiniteResult as exc:
            agreed = self._refused(exc)
        if not agreed:
            # A rank that found NaN or inf at its last average sits in the agreement and would
            # never come to the average below: meet it there first (one tiny bounded allreduce).
            self._agree_finite(0)
        self._flat.scatter()
        super().synchronize()

    def _await_outstanding_global(self) -> bool:
        """Overlap mode: wait while the outstanding global average is incomplete, listening for
        notices; True when one came (the caller agrees next). The next global call and the settle
        would wait for that average inside the native call, i.e. for every rank's global call,
        but a rank that found NaN or inf, and every peer it told, sits in the finiteness
        agreement instead of making it: this rank must hear the notice and join them there.
        The native call that follows counts its timeout from this wait's start, so a rank that
        stopped is still named within one timeout."""
        if self.global_mode != "overlap" or self.world_size == 1 or not self._wa.global_pending():
            return False
        start = time.monotonic()
        nap = 1e-4
        while self._wa.global_pending() and time.monotonic() < start + self.timeout:
            if self._deadline.notices():
                return True
            time.sleep(nap)
            nap = min(2 * nap, 2e-3)  # a sleeping wait: ranks share cores with their peers
        if self._deadline.notices():
            return True
        self._wa.wait_began(start)
        return False

    def _native_average(self):
        """The native average of the next iteration; None when it was refused (its result held
        NaN or inf) and training goes on. An overlapped global refused before the iteration ran
        leaves the iteration next: it is run now."""
        while True:
            before = self._wa.iteration
            try:
                return self._native(self._wa.allreduce, late=self.late)
            except native_coll().NonFiniteResult as exc:
                self._refused(exc)
            if self._wa.iteration != before:
                return None

    def _refused(self, exc) -> bool:
        """A native average was refused (``native_coll.NonFiniteResult``): NaN or inf reached it,
        nothing was applied and this rank's model is as it was. Only now is this rank's own model
        checked (the rare path). ``"raise"``: the ranks agree and every rank raises the same
        :class:`NonFiniteError` naming the rank(s) that held it (returns True when the agreement
        named nobody: the rank whose stand-in held it reports when it reaches that average).
        ``"drop"``: a model that is not finite is put back to the last averaged one; returns
        False (no agreement)."""
        step = self._stats.steps
        finite = is_finite(self._flat.body)
        own = exc.own or not finite
        self._stats.extra["nonfinite_skipped"] = self._stats.extra.get("nonfinite_skipped", 0) + 1
        if self._good is not None:
            if not finite:
                self._flat.body.copy_(self._good)
            if own:
                self._note_dropped((self.rank,))
            return False
        if own:
            # Peers outside the refused average hear of it now and join the agreement at their
            # next average (they never wait in a group average, so they cannot miss it).
            self._deadline.notify(step + 1)
        self._agree_finite(step + 1 if own else 0)
        return True

    def _agree_finite(self, mark: int) -> None:
        """Allreduce the ranks' marks (step + 1 when non-finite, else 0); raise on any. Before a
        global average this is also where the ranks wait for the slowest one."""
        marks = np.zeros(self.world_size, dtype=np.float64)
        marks[self.rank] = mark
        t0 = time.perf_counter()
        self._deadline.allreduce(marks, what="arrival at the global average (finiteness agreement)")
        self.last_arrival_wait_s = time.perf_counter() - t0
        bad = np.flatnonzero(marks > 0)
        if bad.size:
            raise NonFiniteError(bad.tolist(), int(marks[bad].min()) - 1, "model")

    def publish(self) -> None:
        """Make the current model this rank's contribution now (no communication).

        Peers that run this rank's next group average on its behalf use the published model;
        by default that is the result of this rank's previous average.
        """
        self.wait_average()
        self._flat.gather()
        self._wa.publish()

    def _after_synchronize(self) -> None:
        # Peers that run our next group average on our behalf should use the synchronised model.
        self._wa.publish()
        if self._good is not None:
            self._good.copy_(self._flat.body)
        if self._base is not None:  # identical everywhere, and nearer every replica than B was
            self._base.copy_(self._flat.flat)

    def _wrapper_state(self):
        state = super()._wrapper_state()
        state.update(iteration=int(self._wa.iteration), local_since_avg=self._local_since_avg)
        return state

    def _load_wrapper_state(self, wrapper):
        super()._load_wrapper_state(wrapper)
        self._local_since_avg = int(wrapper["local_since_avg"])
        if self._base is not None:  # the loaded model, the same file on every rank
            self._flat.gather()
            self._base.copy_(self._flat.flat)
        self._restart_at(int(wrapper["iteration"]))

    def _restart_at(self, iteration: int) -> None:
        """Continue the group/global schedule at ``iteration`` (collective): the native collective
        is rebuilt to start there, publishing the (just loaded) model as this rank's contribution."""
        if iteration == self._wa.iteration:
            return
        self._flat.gather()
        self._wa.close()
        self._wa = self._collective(start_iteration=iteration)
        if self._good is not None:
            self._good.copy_(self._flat.body)

    def _close(self) -> None:
        self._wa.close()
