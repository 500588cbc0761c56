"""The shared body of the synchronous model-averaging optimizers (LocalSGD, DPSGD).

A local step, then every ``local_steps``-th step one model average; the average gathers the flat
buffer, lets the subclass average it in place (:meth:`PeriodicAveraging._exchange`: over all
ranks, or with the ring neighbours), and scatters it back. A subclass says only how it averages.
"""
from __future__ import annotations

import time
from typing import Iterable

import torch
from mpi4py import MPI

from wagma_rl.job.deadline import DEFAULT_TIMEOUT

from .base import DistributedOptimizer

__all__ = ["PeriodicAveraging"]


class PeriodicAveraging(DistributedOptimizer):
    """Base class: the wrapped optimizer's step, and :meth:`average` every ``local_steps``-th step.

    Args:
        optimizer, comm, buffers, timeout, nonfinite: as :class:`DistributedOptimizer`.
        local_steps: optimizer steps per average (0 = only when :meth:`average` is called).
        options: the subclass's further options (checked equal on every rank, saved).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, local_steps: int, comm: MPI.Comm | None = None,
                 buffers: Iterable[torch.Tensor] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 nonfinite: str = "raise", options: dict | None = None):
        if not isinstance(local_steps, int) or isinstance(local_steps, bool) or local_steps < 0:
            raise ValueError(f"{type(self).__name__} local_steps must be an integer >= 0, got "
                             f"{local_steps!r}")
        self.local_steps = local_steps
        super().__init__(optimizer, comm=comm, buffers=buffers,
                         options={"local_steps": local_steps, **(options or {})},
                         timeout=timeout, nonfinite=nonfinite)

    def step(self, closure=None):
        """Run the wrapped optimizer's step; every ``local_steps``-th step, :meth:`average`."""
        self._check_step()
        loss = self.optimizer.step(closure)
        self._stats.steps += 1
        if self.local_steps and self._stats.steps % self.local_steps == 0:
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
