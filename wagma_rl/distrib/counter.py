"""A shared count of workers that finished their rollout, kept in an MPI RMA window."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from wagma_rl.bounded_comm import BoundedComm

__all__ = ["FinishedCounter"]


class FinishedCounter:
    """Per-rollout counters in a window on rank 0, updated with MPI atomics.

    Two slots alternate between rollouts: rollout ``k`` counts in slot ``k % 2``. Rank 0 clears
    slot ``(k + 1) % 2`` at the start of rollout ``k``; by then every worker has added to it (in
    rollout ``k - 1``, before the collective that ended that update), and nobody reads it again
    before rollout ``k + 1``, which starts after a collective rank 0 only enters once it cleared
    it. So no reset can race an increment, unlike a single counter cleared after the update.

    Every worker reads the count after every environment step, so reads must be cheap. When all
    ranks share a node (``shared=None`` detects it) the window is shared memory: a read is a memory
    barrier and an aligned 8-byte load (microseconds), while increments and resets stay MPI atomics.
    Across nodes a read is an atomic fetch from rank 0 inside one passive-target epoch held for the
    counter's lifetime. Construction and :meth:`free` are collective. With a ``deadline``, remote
    operations are request-based and waited on against it, so a stopped rank 0 is reported instead
    of hanging the rollout.
    """

    _DT = MPI.INT64_T

    def __init__(self, comm: MPI.Comm, *, shared: bool | None = None, deadline: BoundedComm | None = None):
        self.comm = comm
        self.deadline = deadline
        self.rank = comm.Get_rank()
        if shared is None:
            node = comm.Split_type(MPI.COMM_TYPE_SHARED)
            local = node.Get_size()
            node.Free()
            shared = bool(comm.allreduce(local, op=MPI.MIN) == comm.Get_size())
        self.shared = shared
        nbytes = 2 * self._DT.Get_size() if self.rank == 0 else 0
        if shared:
            self.win = MPI.Win.Allocate_shared(nbytes, self._DT.Get_size(), comm=comm)
            mem, _ = self.win.Shared_query(0)
        else:
            self.win = MPI.Win.Allocate(nbytes, self._DT.Get_size(), comm=comm)
            mem = self.win.tomemory() if self.rank == 0 else None
        self._slots = np.frombuffer(mem, dtype=np.int64) if mem is not None else None
        if self.rank == 0:
            self._slots[:] = 0
        self._one = np.ones(1, dtype=np.int64)
        self._zero = np.zeros(1, dtype=np.int64)
        self._out = np.zeros(1, dtype=np.int64)
        if deadline is not None:
            deadline.barrier("preemption counter start-up")
        else:
            comm.Barrier()
        self.win.Lock_all()

    def add(self, rollout: int) -> None:
        """Count this worker as finished with rollout ``rollout``."""
        if self.deadline is not None:
            # A fetching accumulate completes only once done at rank 0: bounded, and no Flush.
            req = self.win.Rget_accumulate([self._one, self._DT], [self._out, self._DT], 0,
                                           target=[rollout % 2, 1, self._DT], op=MPI.SUM)
            self.deadline.wait([req], peers=(0,), what="preemption counter update (rank 0)")
            return
        self.win.Accumulate([self._one, self._DT], 0, target=[rollout % 2, 1, self._DT], op=MPI.SUM)
        self.win.Flush(0)

    def read(self, rollout: int) -> int:
        """How many workers have finished rollout ``rollout`` so far (atomic read)."""
        if self.shared:
            self.win.Sync()  # memory barrier: see increments completed by other ranks
            return int(self._slots[rollout % 2])
        if self.deadline is not None:
            req = self.win.Rget_accumulate([self._zero, self._DT], [self._out, self._DT], 0,
                                           target=[rollout % 2, 1, self._DT], op=MPI.NO_OP)
            self.deadline.wait([req], peers=(0,), what="preemption counter read (rank 0)")
            return int(self._out[0])
        self.win.Fetch_and_op([self._zero, self._DT], [self._out, self._DT], 0,
                              target_disp=rollout % 2, op=MPI.NO_OP)
        self.win.Flush(0)
        return int(self._out[0])

    def reset_next(self, rollout: int) -> None:
        """On rank 0: clear the slot that rollout ``rollout + 1`` will count in."""
        if self.rank != 0:
            return
        self.win.Accumulate([self._zero, self._DT], 0, target=[(rollout + 1) % 2, 1, self._DT],
                            op=MPI.REPLACE)
        self.win.Flush(0)  # rank 0's own memory: completes locally

    def free(self) -> None:
        """Release the window (collective)."""
        if self.win != MPI.WIN_NULL:
            self.win.Unlock_all()
            self.win.Free()
