"""Local SGD in the trainer: local PPO updates, a blocking global model average every
``sync_period`` updates (:class:`wagma_rl.optim.LocalSGD`)."""
from __future__ import annotations

from mpi4py import MPI

from wagma_rl.job.deadline import DEFAULT_TIMEOUT
from wagma_rl.optim import LocalSGD

from .periodic import PeriodicGlobalStrategy

__all__ = ["LocalSgdStrategy"]


class LocalSgdStrategy(PeriodicGlobalStrategy):
    """Every worker trains on its own rollouts; every ``sync_period``-th update all models are
    averaged (blocking, so everyone waits for the slowest there and only there). WAGMA is this
    plus wait-avoiding group averages in between."""

    name = "local_sgd"

    def __init__(self, *, comm: MPI.Comm, sync_period: int, timeout: float = DEFAULT_TIMEOUT,
                 outer: str | None = None, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 global_precision: str = "fp32"):
        super().__init__(comm=comm, sync_period=sync_period, timeout=timeout)
        self.outer = dict(outer=outer, outer_lr=outer_lr, outer_momentum=outer_momentum,
                          global_precision=global_precision)

    def wrap_optimizer(self, optimizer, *, buffers=None):
        # local_steps=0: the strategy decides when to average (once per sync_period updates).
        self.optimizer = LocalSGD(optimizer, local_steps=0, comm=self.comm, buffers=buffers,
                                  timeout=self.timeout, **self.outer)
        return self.optimizer

    def _global_average(self) -> None:
        # With an outer optimizer or a 16-bit wire the global average is LocalSGD.average(),
        # which takes the outer step and sends 16 bits; synchronize() stays the plain float32
        # average (as for evaluation).
        if self.outer["outer"] is None and self.outer["global_precision"] == "fp32":
            self.optimizer.synchronize()
        else:
            self.optimizer.average()

    def _between(self) -> tuple[float, float, tuple[int, ...]]:
        return 0.0, 0.0, (self.rank,)
