"""Local SGD: local steps, and a synchronous global model average every ``local_steps`` steps."""
from __future__ import annotations

from typing import Iterable

import torch
from mpi4py import MPI

from wagma_rl.job.deadline import DEFAULT_TIMEOUT

from .averaging import global_average
from .outer import build_outer, check_outer_options
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
        outer: ``None`` (default: the average becomes the model) or ``"nesterov"``: an outer
            Nesterov-momentum step on every average, DiLoCo's outer optimizer
            (:mod:`wagma_rl.optim.outer`; keeps two more model-size float32 buffers).
        outer_lr: the outer step's learning rate (> 0; DiLoCo 0.7; 1 with momentum 0 = plain).
        outer_momentum: the outer step's momentum, in [0, 1) (DiLoCo 0.9).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, local_steps: int, comm: MPI.Comm | None = None,
                 buffers: Iterable[torch.Tensor] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 nonfinite: str = "raise", outer: str | None = None, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9):
        outer_options = check_outer_options("LocalSGD", outer, outer_lr, outer_momentum)
        super().__init__(optimizer, local_steps=local_steps, comm=comm, buffers=buffers, timeout=timeout,
                         nonfinite=nonfinite, options=outer_options)
        self._outer = build_outer(outer_options, self._flat.body)

    def _exchange(self) -> tuple[int, ...]:
        # The mean over all ranks (every average is global), then the outer step if any (the
        # same mean as without one, so outer_lr=1, outer_momentum=0 gives it bit for bit).
        dropped = global_average(self._deadline, self._flat.array, numel=self._flat.numel,
                                 step=self._stats.steps, nonfinite=self.nonfinite)
        if self._outer is not None:
            self._outer.step(self._flat.body)
        return dropped
