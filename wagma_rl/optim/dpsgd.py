"""D-PSGD: decentralised SGD with synchronous ring gossip (average with both neighbours) every step."""
from __future__ import annotations

import time
from typing import Iterable

import torch
from mpi4py import MPI

from wagma_rl.deadline import DEFAULT_TIMEOUT

from .averaging import ring_average, ring_neighbours
from .base import DistributedOptimizer

__all__ = ["DPSGD"]


class DPSGD(DistributedOptimizer):
    """After every ``period``-th local step (default: every step), replace the model by the mean of
    it and its ring neighbours' models.

    Rank r's neighbours are r-1 and r+1 modulo the world size (one neighbour at 2 ranks). Models
    are not identical between ranks; call :meth:`synchronize` before evaluating.

    Args:
        optimizer: the wrapped ``torch.optim.Optimizer``.
        period: local steps between two gossips (1 = after every step, the published D-PSGD;
            0 = only when :meth:`average` is called, e.g. once per PPO update by the RL trainer).
        comm: communicator (default ``MPI.COMM_WORLD``).
        buffers: module buffers to gossip with the parameters.
        timeout: seconds a step may wait for a neighbour (then ``PeerTimeout`` names it).
        nonfinite: ``"raise"`` or ``"drop"`` a rank whose model holds NaN/inf (see
            :class:`~wagma_rl.optim.DistributedOptimizer`).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, period: int = 1,
                 comm: MPI.Comm | None = None, buffers: Iterable[torch.Tensor] | None = None,
                 timeout: float = DEFAULT_TIMEOUT, nonfinite: str = "raise"):
        if not isinstance(period, int) or isinstance(period, bool) or period < 0:
            raise ValueError(f"DPSGD period must be an integer >= 0, got {period!r}")
        self.period = period
        super().__init__(optimizer, comm=comm, buffers=buffers, options={"period": period},
                         timeout=timeout, nonfinite=nonfinite)
        self._scratch = None

    @property
    def neighbours(self) -> list[int]:
        """This rank's gossip partners."""
        return ring_neighbours(self.rank, self.world_size)

    def step(self, closure=None):
        """Run the wrapped optimizer's step; every ``period``-th step, gossip with the neighbours."""
        self._check_step()
        loss = self.optimizer.step(closure)
        self._stats.steps += 1
        if self.period and self._stats.steps % self.period == 0:
            self.average()
        return loss

    def average(self) -> None:
        """Gossip once with the ring neighbours now (collective over neighbours)."""
        self._flat.gather()
        t0 = time.perf_counter()
        self._scratch, dropped = ring_average(self._deadline, self._flat.array[: self._flat.numel],
                                              self._scratch, step=self._stats.steps,
                                              nonfinite=self.nonfinite)
        self._note_dropped(dropped)
        self._record_comm(time.perf_counter() - t0)
        self._flat.scatter()
        self._stats.averages += 1
