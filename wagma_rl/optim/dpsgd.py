"""D-PSGD: decentralised SGD with synchronous ring gossip (average with both neighbours) every step."""
from __future__ import annotations

from typing import Iterable

import torch
from mpi4py import MPI

from wagma_rl.bounded_comm import DEFAULT_TIMEOUT

from .averaging import ring_average, ring_neighbours
from .periodic import PeriodicAveraging

__all__ = ["DPSGD"]


class DPSGD(PeriodicAveraging):
    """After every ``local_steps``-th local step (default: every step), replace the model by the mean of
    it and its ring neighbours' models.

    Rank r's neighbours are r-1 and r+1 modulo the world size (one neighbour at 2 ranks). Models
    are not identical between ranks; call :meth:`synchronize` before evaluating.

    Args:
        optimizer: the wrapped ``torch.optim.Optimizer``.
        local_steps: optimizer steps per gossip (1 = after every step, the published D-PSGD;
            0 = only when :meth:`average` is called, e.g. once per PPO update by the RL trainer).
        comm: communicator (default ``MPI.COMM_WORLD``).
        buffers: module buffers to gossip with the parameters.
        timeout: seconds a step may wait for a neighbour (then ``PeerTimeout`` names it).
        nonfinite: ``"raise"`` or ``"drop"`` a rank whose model holds NaN/inf (see
            :class:`~wagma_rl.optim.DistributedOptimizer`).
        background: gossip on a thread while the next forward and backward pass compute; the
            next ``step()`` takes the result before its local step (as :class:`LocalSGD`'s).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, local_steps: int = 1,
                 comm: MPI.Comm | None = None, buffers: Iterable[torch.Tensor] | None = None,
                 timeout: float = DEFAULT_TIMEOUT, nonfinite: str = "raise", background: bool = False):
        super().__init__(optimizer, local_steps=local_steps, comm=comm, buffers=buffers, timeout=timeout,
                         nonfinite=nonfinite, background=background)
        self._scratch = None

    @property
    def neighbours(self) -> list[int]:
        """This rank's gossip partners."""
        return ring_neighbours(self.rank, self.world_size)

    def _exchange(self) -> tuple[int, ...]:
        # Gossip once: the mean of this model and the ring neighbours' (collective over them).
        self._scratch, dropped = ring_average(self._deadline, self._flat.array[: self._flat.numel],
                                              self._scratch, step=self._stats.steps,
                                              nonfinite=self.nonfinite)
        return dropped
