"""Multi-rank specification of wagma_rl.bounded_comm (run by tests/test_faults_mpi.py at 2 and 3
ranks): the bounded collectives give the blocking ones' results, and a rank that does not come
is named (rank, host, pid) on every other rank within the timeout, which then stops for good."""
from __future__ import annotations

import os
import socket
import time

import numpy as np
import pytest
from mpi4py import MPI

from wagma_rl.bounded_comm import BoundedComm, PeerTimeout

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


@pytest.fixture
def deadline():
    deadline = BoundedComm(COMM, timeout=10)
    yield deadline


def test_the_host_table_names_every_rank(deadline):
    mine = deadline.peers[RANK]
    assert (mine.rank, mine.host, mine.pid) == (RANK, socket.gethostname(), os.getpid())
    assert [p.pid for p in deadline.peers] == COMM.allgather(os.getpid())


def test_allreduce_bcast_and_objects_match_the_blocking_collectives(deadline):
    a = np.full(5, RANK + 1, dtype=np.float64)
    deadline.allreduce(a)
    assert a.tolist() == [SIZE * (SIZE + 1) / 2] * 5
    m = np.array([float(RANK)])
    deadline.allreduce(m, op=MPI.MAX)
    assert m[0] == SIZE - 1
    b = np.arange(3, dtype=np.float32) * (RANK + 1)
    deadline.bcast(b, root=SIZE - 1)
    assert b.tolist() == [0.0, SIZE, 2.0 * SIZE]
    assert deadline.allgather_obj({"r": RANK}) == [{"r": r} for r in range(SIZE)]
    assert deadline.bcast_obj(f"from {RANK}", root=0) == "from 0"
    r = np.array([float(RANK)])
    deadline.reduce_to(r, root=0)
    assert r[0] == (SIZE * (SIZE - 1) / 2 if RANK == 0 else RANK)


def test_exchange_moves_point_to_point_messages(deadline):
    right, left = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    got = np.zeros(2)
    deadline.exchange([(np.array([RANK, 7.0]), right)], [(got, left)])
    assert got.tolist() == [left, 7.0]


def test_a_rank_that_does_not_come_is_named_on_every_other_rank():
    deadline = BoundedComm(COMM, timeout=2)
    late = SIZE - 1
    if RANK == late:
        time.sleep(4)  # misses the barrier (as a stuck rank would) ...
        COMM.Barrier()  # ... then meets the others again on a plain barrier
        return
    t0 = time.monotonic()
    with pytest.raises(PeerTimeout) as info:
        deadline.barrier("test barrier")
    assert time.monotonic() - t0 < 2 + 1.5
    assert info.value.ranks == (late,)
    assert f"rank {late} (host {socket.gethostname()}, pid {deadline.peers[late].pid})" in str(info.value)
    with pytest.raises(RuntimeError, match="stopped after an earlier failure"):
        deadline.barrier()
    COMM.Barrier()
