"""A shared count of workers that finished their rollout, kept in an MPI RMA window."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

__all__ = ["FinishedCounter"]


class FinishedCounter:
    """Per-rollout counters in a window on rank 0, updated with passive-target atomics.

    Two slots alternate between rollouts: rollout ``k`` counts in slot ``k % 2``. Rank 0 clears
    slot ``(k + 1) % 2`` at the start of rollout ``k``; by then every worker has added to it (in
    rollout ``k - 1``, before the collective that ended that update), and nobody reads it again
    before rollout ``k + 1``, which starts after a collective rank 0 only enters once it cleared
    it. So no reset can race an increment, unlike a single counter cleared after the update.
    Construction and :meth:`free` are collective.
    """

    _DT = MPI.INT64_T

    def __init__(self, comm: MPI.Comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        nbytes = 2 * self._DT.Get_size() if self.rank == 0 else 0
        self.win = MPI.Win.Allocate(nbytes, self._DT.Get_size(), comm=comm)
        if self.rank == 0:
            np.frombuffer(self.win.tomemory(), dtype=np.int64)[:] = 0
        self._one = np.ones(1, dtype=np.int64)
        self._zero = np.zeros(1, dtype=np.int64)
        self._out = np.zeros(1, dtype=np.int64)
        comm.Barrier()

    def add(self, rollout: int) -> None:
        """Count this worker as finished with rollout ``rollout``."""
        self.win.Lock(0, MPI.LOCK_SHARED)
        self.win.Accumulate([self._one, self._DT], 0, target=[rollout % 2, 1, self._DT], op=MPI.SUM)
        self.win.Unlock(0)

    def read(self, rollout: int) -> int:
        """How many workers have finished rollout ``rollout`` so far (atomic read)."""
        self.win.Lock(0, MPI.LOCK_SHARED)
        self.win.Fetch_and_op([self._zero, self._DT], [self._out, self._DT], 0,
                              target_disp=rollout % 2, op=MPI.NO_OP)
        self.win.Unlock(0)
        return int(self._out[0])

    def reset_next(self, rollout: int) -> None:
        """On rank 0: clear the slot that rollout ``rollout + 1`` will count in."""
        if self.rank != 0:
            return
        self.win.Lock(0, MPI.LOCK_EXCLUSIVE)
        self.win.Put([self._zero, self._DT], 0, target=[(rollout + 1) % 2, 1, self._DT])
        self.win.Unlock(0)

    def free(self) -> None:
        """Release the window (collective)."""
        if self.win != MPI.WIN_NULL:
            self.win.Free()
