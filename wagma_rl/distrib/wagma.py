"""WAGMA in place of DD-PPO's preemption: full rollouts, local PPO, wait-avoiding group averaging."""
from __future__ import annotations

import time

from mpi4py import MPI

from wagma_rl.job.deadline import DEFAULT_TIMEOUT
from wagma_rl.optim import WAGMA

from .base import Strategy, SyncInfo

__all__ = ["WagmaStrategy"]


class WagmaStrategy(Strategy):
    """Every worker runs its whole PPO update with its local optimizer, then takes one WAGMA step:
    a wait-avoiding average with its group of ``group_size`` workers, or every ``sync_period``-th
    update a global one. With ``global_mode="blocking"`` the global one waits for the slowest
    worker and is the loop's synchronised point. With ``"overlap"`` it does not wait (WAGMA's
    overlapped global); every ``overlap_sync_every``-th global average is then followed by a
    blocking :meth:`synchronize`, the synchronised point where statistics are reduced, stop
    signals acted on and checkpoints written. ``late`` defaults to ``"apply"``, not the
    optimizer's ``"merge"``: see ``DistribConfig.late``.
    """

    name = "wagma"

    def __init__(self, *, comm: MPI.Comm, group_size: int, sync_period: int, late: str = "apply",
                 global_mode: str = "blocking", overlap_sync_every: int = 4,
                 timeout: float = DEFAULT_TIMEOUT, outer: str | None = None, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, global_precision: str = "fp32"):
        super().__init__(comm=comm, timeout=timeout)
        self.outer = dict(outer=outer, outer_lr=outer_lr, outer_momentum=outer_momentum,
                          global_precision=global_precision)
        self.group_size, self.sync_period = group_size, sync_period
        self.late, self.global_mode = late, global_mode
        self.overlap_sync_every = overlap_sync_every

    def wrap_optimizer(self, optimizer, *, buffers=None):
        # local_steps=0: the PPO mini-batch steps stay local; after_update() averages once.
        self.optimizer = WAGMA(optimizer, group_size=self.group_size, sync_period=self.sync_period,
                               local_steps=0, late=self.late, global_mode=self.global_mode,
                               comm=self.comm, timeout=self.timeout, buffers=buffers, **self.outer)
        return self.optimizer

    def after_update(self) -> SyncInfo:
        t0 = time.perf_counter()
        info = self.optimizer.average()
        # The global average first waits for the slowest worker (in the optimizer's bounded
        # finiteness agreement, so a worker that found NaN meets the others there): report that
        # wait apart from moving the model.
        wait = self.optimizer.last_arrival_wait_s
        if info is None:
            # The average was refused (a non-finite contribution, nonfinite="drop"): nothing was
            # averaged, so this is no point at which the replicas agree.
            return SyncInfo(synced=False, stats_point=False,
                            comm_s=time.perf_counter() - t0 - wait, wait_s=wait, staleness=0.0,
                            stale=0, late=False, group=(), preempted=False)
        synced = info.kind == "global"
        stats_point = False
        if synced and self.global_mode == "overlap":
            # The schedule position, not a counter, decides: a resumed run keeps the same points.
            synced = (info.iteration + 1) // self.sync_period % self.overlap_sync_every == 0
            if synced:
                # Synchronising first waits for every worker to arrive: report that as waiting.
                t1 = time.perf_counter()
                self.optimizer.synchronize()
                wait += time.perf_counter() - t1
            stats_point = not synced
        comm_s = time.perf_counter() - t0 - wait
        return SyncInfo(synced=synced, stats_point=stats_point, comm_s=comm_s, wait_s=wait,
                        staleness=float(info.staleness), stale=len(info.stale),
                        late=self.rank in info.stale,
                        group=() if info.kind == "global" else tuple(info.group),
                        preempted=False)

