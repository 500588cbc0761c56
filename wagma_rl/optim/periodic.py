"""The shared body of the synchronous model-averaging optimizers (LocalSGD, DPSGD).

A local step, then every ``period``-th step one model average; the average gathers the flat
buffer, lets the subclass average it in place (:meth:`PeriodicAveraging._exchange`: over all
ranks, or with the ring neighbours), and scatters it back. A subclass says only how it averages.
"""
from __future__ import annotations

import time
from typing import Iterable

import torch
from mpi4py import MPI

from wagma_rl.deadline import DEFAULT_TIMEOUT

from .base import DistributedOptimizer

__all__ = ["PeriodicAveraging"]


class PeriodicAveraging(DistributedOptimizer):
    """Base class: the wrapped optimizer's step, and :meth:`average` every ``period``-th step.

    Args:
        optimizer, comm, buffers, timeout, nonfinite: as :class:`DistributedOptimizer`.
        period: local steps between two averages (0 = only when :meth:`average` is called).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, period: int, comm: MPI.Comm | None = None,
                 buffers: Iterable[torch.Tensor] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 nonfinite: str = "raise"):
        if not isinstance(period, int) or isinstance(period, bool) or period < 0:
            raise ValueError(f"{type(self).__name__} period must be an integer >= 0, got {period!r}")
        self.period = period
        super().__init__(optimizer, comm=comm, buffers=buffers, options={"period": period},
                         timeout=timeout, nonfinite=nonfinite)

    def step(self, closure=None):
        """Run the wrapped optimizer's step; every ``period``-th step, :meth:`average`."""
        self._check_step()
        loss = self.optimizer.step(closure)
        self._stats.steps += 1
        if self.period and self._stats.steps % self.period == 0:
            self.average()
        return loss

    def average(self) -> None:
        """Average the model now (collective over the ranks this optimizer averages with)."""
        self._flat.gather()
        t0 = time.perf_counter()
        self._note_dropped(self._exchange())
        self._record_comm(time.perf_counter() - t0)
        self._flat.scatter()
        self._stats.averages += 1

    def _exchange(self) -> tuple[int, ...]:
        """Average the gathered flat buffer in place; return the ranks left out as non-finite."""
        raise NotImplementedError
