"""DD-PPO with the preemption threshold (Wijmans et al., ICLR 2020)."""
from __future__ import annotations

import math

from mpi4py import MPI

from wagma_rl.job.deadline import DEFAULT_TIMEOUT

from .allreduce import AllreduceStrategy
from .counter import FinishedCounter

__all__ = ["PreemptStrategy"]


class PreemptStrategy(AllreduceStrategy):
    """Synchronous DD-PPO whose stragglers stop collecting early.

    A worker that has done at least ``short_rollout_frac`` of its steps stops once at least
    ``sync_frac`` of all workers have finished their rollout. The finished count lives in an MPI
    RMA window on rank 0 (:class:`FinishedCounter`), read with atomic fetch-and-op.
    """

    name = "preempt"

    def __init__(self, *, comm: MPI.Comm, sync_frac: float = 0.6, short_rollout_frac: float = 0.25,
                 timeout: float = DEFAULT_TIMEOUT):
        if not 0.0 < sync_frac <= 1.0:
            raise ValueError(f"distrib.sync_frac must be in (0, 1], got {sync_frac}")
        if not 0.0 <= short_rollout_frac <= 1.0:
            raise ValueError(f"distrib.short_rollout_frac must be in [0, 1], got {short_rollout_frac}")
        super().__init__(comm=comm, timeout=timeout)
        self.sync_frac = sync_frac
        self.short_rollout_frac = short_rollout_frac
        # Workers that must have finished before a straggler is preempted.
        self.threshold = max(1, math.ceil(sync_frac * self.world_size - 1e-9))
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
