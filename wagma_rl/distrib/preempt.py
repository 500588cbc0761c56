"""DD-PPO with the preemption threshold (Wijmans et al., ICLR 2020)."""
from __future__ import annotations

import math

from mpi4py import MPI

from .average import AveragingStrategy
from .counter import FinishedCounter

__all__ = ["PreemptStrategy"]


class PreemptStrategy(AveragingStrategy):
    """Synchronous DD-PPO (allreduce) whose stragglers stop collecting early.

    A worker that has done at least ``short_rollout_frac`` of its steps stops once at least
    ``sync_frac`` of all workers have finished their rollout. The finished count lives in an MPI
    RMA window on rank 0 (:class:`FinishedCounter`), read with atomic fetch-and-op.
    """

    def __init__(self, spec, *, comm: MPI.Comm):
        # The ranges of sync_frac and short_rollout_frac are checked when the config loads.
        super().__init__(spec, comm=comm)
        self.sync_frac = spec.sync_frac
        self.short_rollout_frac = spec.short_rollout_frac
        # Workers that must have finished before a straggler is preempted.
        self.threshold = max(1, math.ceil(self.sync_frac * self.world_size - 1e-9))
        self.deadline.barrier("preemption counter start-up")
        self.counter = FinishedCounter(self.comm, deadline=self.deadline)
        self._rollout = 0

    def collect_more(self, steps_done: int, num_steps: int) -> bool:
        if steps_done == 1:
            # Rank 0 clears the slot the rollout after this one will use (see FinishedCounter).
            self.counter.reset_next(self._rollout)
        if steps_done >= num_steps:
            self._finish_rollout(steps_done, preempted=False)
            return False
        if (steps_done >= self.short_rollout_frac * num_steps
                and self.counter.read(self._rollout) >= self.threshold):
            self._finish_rollout(steps_done, preempted=True)
            return False
        return True

    def _finish_rollout(self, steps_done: int, *, preempted: bool) -> None:
        self.counter.add(self._rollout)
        self._rollout += 1
        super()._finish_rollout(steps_done, preempted=preempted)

    def close(self) -> None:
        self.deadline.barrier("close")  # the window's release waits for every rank
        self.counter.free()
        super().close()
