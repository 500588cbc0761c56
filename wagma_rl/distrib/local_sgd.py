"""Local SGD in the trainer: local PPO updates, a blocking global model average every
``sync_period`` updates (:class:`wagma_rl.optim.LocalSGD`)."""
from __future__ import annotations

from wagma_rl.optim import LocalSGD

from .periodic import PeriodicGlobalStrategy

__all__ = ["LocalSgdStrategy"]


class LocalSgdStrategy(PeriodicGlobalStrategy):
    """Every worker trains on its own rollouts; every ``sync_period``-th update all models are
    averaged (blocking, so everyone waits for the slowest there and only there). WAGMA is this
    plus wait-avoiding group averages in between."""

    name = "local_sgd"

    def wrap_optimizer(self, optimizer, *, buffers=None):
        # local_steps=0: the strategy decides when to average (once per sync_period updates).
        self.optimizer = LocalSGD(optimizer, local_steps=0, comm=self.comm, buffers=buffers,
                                  timeout=self.timeout)
        return self.optimizer

    def _between(self) -> tuple[float, float, tuple[int, ...]]:
        return 0.0, 0.0, (self.rank,)
