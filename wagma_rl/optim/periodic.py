"""The shared body of the synchronous model-averaging optimizers (LocalSGD, DPSGD).

A local step, then every ``local_steps``-th step one model average; the average gathers the flat
buffer, lets the subclass average it in place (:meth:`PeriodicAveraging._exchange`: over all
ranks, or with the ring neighbours), and scatters it back, at once or (``background=True``) at
the start of the next step (:mod:`.background`). A subclass says only how it averages.
"""
from __future__ import annotations

import time
from typing import Iterable

import torch
from mpi4py import MPI

from wagma_rl.bounded_comm import DEFAULT_TIMEOUT

from .background import check_background
from .base import DistributedOptimizer

__all__ = ["PeriodicAveraging"]


class PeriodicAveraging(DistributedOptimizer):
    """Base class: the wrapped optimizer's step, and :meth:`average` every ``local_steps``-th step.

    Args:
        optimizer, comm, buffers, timeout, nonfinite: as :class:`DistributedOptimizer`.
        local_steps: optimizer steps per average (0 = only when :meth:`average` is called).
        background: run the averages that ``step()`` schedules on a thread while the next
            forward and backward pass compute; the next ``step()`` takes the result before it
            writes the parameters (:mod:`.background`: the next gradient is computed at the
            model this rank contributed).
        options: the subclass's further options (checked equal on every rank, saved).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, local_steps: int, comm: MPI.Comm | None = None,
                 buffers: Iterable[torch.Tensor] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 nonfinite: str = "raise", background: bool = False, options: dict | None = None):
        if not isinstance(local_steps, int) or isinstance(local_steps, bool) or local_steps < 0:
            raise ValueError(f"{type(self).__name__} local_steps must be an integer >= 0, got "
                             f"{local_steps!r}")
        check_background(type(self).__name__, background)
        self.local_steps, self.background = local_steps, background
        # In the background the average runs while the forward pass reads the parameters: they
        # must not be views into the buffer it writes.
        super().__init__(optimizer, comm=comm, buffers=buffers, views=not background,
                         options={"local_steps": local_steps, **(options or {}),
                                  **({"background": True} if background else {})},
                         timeout=timeout, nonfinite=nonfinite)

    def step(self, closure=None):
        """Take the background average in flight, if any; run the wrapped optimizer's step;
        every ``local_steps``-th step, average (in the background with ``background=True``)."""
        self.wait_average()
        self._check_step()
        loss = self.optimizer.step(closure)
        self._stats.steps += 1
        if self.local_steps and self._stats.steps % self.local_steps == 0:
            self._start_average(background=self.background)
        return loss

    def average(self) -> None:
        """Average the model now (collective over the ranks this optimizer averages with)."""
        self._start_average()

    def _exchange_flat(self) -> tuple[tuple[int, ...], float]:
        t0 = time.perf_counter()
        dropped = self._exchange()
        return dropped, time.perf_counter() - t0

    def _finish_average(self, dropped: tuple[int, ...]) -> None:
        self._note_dropped(dropped)
        self._scatter_average()
        self._stats.averages += 1

    def _exchange(self) -> tuple[int, ...]:
        """Average the gathered flat buffer in place; return the ranks left out as non-finite."""
        raise NotImplementedError
