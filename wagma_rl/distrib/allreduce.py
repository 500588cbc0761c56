"""Synchronous DD-PPO: full rollouts everywhere, gradients averaged every mini-batch."""
from __future__ import annotations

from mpi4py import MPI

from wagma_rl.job.deadline import DEFAULT_TIMEOUT
from wagma_rl.optim import AllreduceSGD

from .base import Strategy, SyncInfo

__all__ = ["AllreduceStrategy"]


class AllreduceStrategy(Strategy):
    """Every worker collects ``num_steps`` steps; the first gradient average waits for the slowest.

    The waiting is measured by a barrier at the end of the rollout (where the workers would block
    anyway), so the timing split shows it as ``wait`` instead of hiding it in ``communicate``.
    """

    name = "allreduce"

    def __init__(self, *, comm: MPI.Comm, timeout: float = DEFAULT_TIMEOUT):
        super().__init__(comm=comm, timeout=timeout)
        self._comm_before = 0.0

    def wrap_optimizer(self, optimizer, *, buffers=None):
        self.optimizer = AllreduceSGD(optimizer, comm=self.comm, buffers=buffers, timeout=self.timeout)
        return self.optimizer

    def _finish_rollout(self, steps_done: int, *, preempted: bool) -> None:
        super()._finish_rollout(steps_done, preempted=preempted)
        self._wait_s = self._timed_barrier("end of rollout")
        self._comm_before = self.optimizer.stats.comm_time_s

    def after_update(self) -> SyncInfo:
        # Gradient averaging keeps the replicas identical at every update.
        comm_s = self.optimizer.stats.comm_time_s - self._comm_before
        return SyncInfo(synced=True, comm_s=comm_s, wait_s=self._wait_s, rollout_wait_s=self._wait_s,
                        preempted=self._preempted)
