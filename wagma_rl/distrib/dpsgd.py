"""D-PSGD in the trainer (the WAGMA paper's decentralised baseline): ring gossip after every update."""
from __future__ import annotations

import time

from mpi4py import MPI

from wagma_rl.optim import DPSGD

from .periodic import PeriodicGlobalStrategy

__all__ = ["DpsgdStrategy"]


class DpsgdStrategy(PeriodicGlobalStrategy):
    """Every worker runs its whole PPO update locally, then averages its model with its two ring
    neighbours (:class:`wagma_rl.optim.DPSGD`, a blocking exchange: a worker waits for its
    neighbours but not for the rest). Every ``sync_period``-th update the average is global
    (gossip with periodic global averaging, as WAGMA's global sync).
    """

    name = "dpsgd"

    def wrap_optimizer(self, optimizer, *, buffers=None):
        # local_steps=0: the PPO mini-batch steps stay local; _between() gossips once per update.
        self.optimizer = DPSGD(optimizer, local_steps=0, comm=self.comm, buffers=buffers,
                               timeout=self.timeout)
        return self.optimizer

    def _between(self) -> tuple[float, float, tuple[int, ...]]:
        peers = self.optimizer.neighbours
        # A zero-byte handshake first, so waiting for a slow neighbour is timed apart from the
        # model transfer that follows.
        t0 = time.perf_counter()
        reqs = [self.comm.Irecv([None, 0, MPI.BYTE], source=p, tag=29) for p in peers]
        reqs += [self.comm.Isend([None, 0, MPI.BYTE], dest=p, tag=29) for p in peers]
        self.deadline.wait(reqs, peers=peers, what="the ring neighbours' handshake")
        t1 = time.perf_counter()
        self.optimizer.average()
        return t1 - t0, time.perf_counter() - t1, tuple(sorted([self.rank, *peers]))
