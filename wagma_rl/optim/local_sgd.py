"""Local SGD: local steps, and a synchronous global model average every ``period`` steps."""
from __future__ import annotations

import time
from typing import Iterable

import torch
from mpi4py import MPI

from wagma_rl.deadline import DEFAULT_TIMEOUT

from .averaging import global_average
from .base import DistributedOptimizer

__all__ = ["LocalSGD"]


class LocalSGD(DistributedOptimizer):
    """Model averaging every ``period`` local steps (a blocking allreduce over all ranks).

    Args:
        optimizer: the wrapped ``torch.optim.Optimizer``.
        period: local steps between two global averages (1 = average after every step; 0 = only
            when :meth:`average` is called, e.g. once per PPO update by the RL trainer).
        comm: communicator (default ``MPI.COMM_WORLD``).
        buffers: module buffers to average with the parameters.
        timeout: seconds an average may wait for the slowest rank (then ``PeerTimeout``).
        nonfinite: ``"raise"`` or ``"drop"`` a rank whose model holds NaN/inf (see
            :class:`~wagma_rl.optim.DistributedOptimizer`).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, period: int, comm: MPI.Comm | None = None,
                 buffers: Iterable[torch.Tensor] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 nonfinite: str = "raise"):
        if not isinstance(period, int) or isinstance(period, bool) or period < 0:
            raise ValueError(f"LocalSGD period must be an integer >= 0, got {period!r}")
        self.period = period
        super().__init__(optimizer, comm=comm, buffers=buffers, options={"period": period},
                         timeout=timeout, nonfinite=nonfinite)

    def step(self, closure=None):
        """Run the wrapped optimizer's step; every ``period``-th step, average the models."""
        self._check_step()
        loss = self.optimizer.step(closure)
        self._stats.steps += 1
        if self.period and self._stats.steps % self.period == 0:
            self.average()
        return loss

    def average(self) -> None:
        """Average the models over all ranks now (collective)."""
        self._flat.gather()
        t0 = time.perf_counter()
        self._note_dropped(global_average(self._deadline, self._flat.array, numel=self._flat.numel,
                                          step=self._stats.steps, nonfinite=self.nonfinite))
        self._record_comm(time.perf_counter() - t0)
        self._flat.scatter()
        self._stats.averages += 1
