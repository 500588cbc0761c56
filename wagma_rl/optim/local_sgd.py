"""Local SGD: local steps, and a synchronous global model average every ``local_steps`` steps."""
from __future__ import annotations

from typing import Iterable

import torch
from mpi4py import MPI

from wagma_rl.job.deadline import DEFAULT_TIMEOUT

from .averaging import global_average
from .periodic import PeriodicAveraging

__all__ = ["LocalSGD"]


class LocalSGD(PeriodicAveraging):
    """Model averaging every ``local_steps`` local steps (a blocking allreduce over all ranks).

    Args:
        optimizer: the wrapped ``torch.optim.Optimizer``.
        local_steps: optimizer steps per global average (1 = average after every step; 0 = only
            when :meth:`average` is called, e.g. once per PPO update by the RL trainer).
        comm: communicator (default ``MPI.COMM_WORLD``).
        buffers: module buffers to average with the parameters.
        timeout: seconds an average may wait for the slowest rank (then ``PeerTimeout``).
        nonfinite: ``"raise"`` or ``"drop"`` a rank whose model holds NaN/inf (see
            :class:`~wagma_rl.optim.DistributedOptimizer`).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, local_steps: int, comm: MPI.Comm | None = None,
                 buffers: Iterable[torch.Tensor] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 nonfinite: str = "raise"):
        super().__init__(optimizer, local_steps=local_steps, comm=comm, buffers=buffers, timeout=timeout,
                         nonfinite=nonfinite)

    def _exchange(self) -> tuple[int, ...]:
        # The mean over all ranks.
        return global_average(self._deadline, self._flat.array, numel=self._flat.numel,
                              step=self._stats.steps, nonfinite=self.nonfinite)
