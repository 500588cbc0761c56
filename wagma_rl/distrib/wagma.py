"""WAGMA in place of DD-PPO's preemption: full rollouts, local PPO, wait-avoiding group averaging."""
from __future__ import annotations

import time

from mpi4py import MPI

from wagma_rl.deadline import DEFAULT_TIMEOUT
from wagma_rl.optim import WAGMA

from .base import Strategy, SyncInfo

__all__ = ["WagmaStrategy"]


class WagmaStrategy(Strategy):
    """Every worker runs its whole PPO update with its local optimizer, then takes one WAGMA step:
    a wait-avoiding average with its group of ``group_size`` workers, or every ``sync_period``-th
    update a blocking global one. Nobody waits for a straggler except at the global sync.
    """

    name = "wagma"

    def __init__(self, *, comm: MPI.Comm, group_size: int, sync_period: int, late: str = "apply",
                 timeout: float = DEFAULT_TIMEOUT):
        super().__init__(comm=comm, timeout=timeout)
        self.group_size, self.sync_period = group_size, sync_period
        self.late = late

    def wrap_optimizer(self, optimizer, *, buffers=None):
        # local_steps=0: the PPO mini-batch steps stay local; after_update() averages once.
        self.optimizer = WAGMA(optimizer, group_size=self.group_size, sync_period=self.sync_period,
                               local_steps=0, late=self.late, comm=self.comm, timeout=self.timeout,
                               buffers=buffers)
        return self.optimizer

    def after_update(self) -> SyncInfo:
        t0 = time.perf_counter()
        info = self.optimizer.average()
        # The global average first waits for the slowest worker (in the optimizer's bounded
        # finiteness agreement, so a worker that found NaN meets the others there): report that
        # wait apart from moving the model.
        wait = self.optimizer.last_arrival_wait_s
        comm_s = time.perf_counter() - t0 - wait
        return SyncInfo(synced=(info.kind == "global"), comm_s=comm_s, wait_s=wait,
                        staleness=float(info.staleness), stale=len(info.stale),
                        late=self.rank in info.stale,
                        group=() if info.kind == "global" else tuple(info.group),
                        rollout_steps=self._rollout_steps, preempted=False)

