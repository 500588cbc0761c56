"""The preempt mode's finished-workers counter (wagma_rl.distrib.FinishedCounter) on every rank,
both backends: shared memory (one node) and passive-target RMA (what runs across nodes)."""
from __future__ import annotations

import pytest
from mpi4py import MPI

from wagma_rl.distrib import FinishedCounter

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
ONE_NODE = len(set(COMM.allgather(MPI.Get_processor_name()))) == 1


@pytest.fixture(params=[True, False], ids=["shared", "rma"])
def counter(request):
    if request.param and not ONE_NODE:
        pytest.skip("a shared-memory window needs every rank on one node")
    c = FinishedCounter(COMM, shared=request.param)
    yield c
    c.free()


def test_shared_memory_is_used_exactly_when_all_ranks_share_a_node():
    c = FinishedCounter(COMM)
    try:
        assert c.shared == ONE_NODE
    finally:
        c.free()


def test_counts_are_exact_and_slots_alternate_across_rollouts(counter):
    for rollout in range(6):
        counter.reset_next(rollout)  # what rank 0 does at the first step of every rollout
        COMM.Barrier()
        assert counter.read(rollout) == 0  # cleared during the previous rollout
        COMM.Barrier()
        # Ranks finish one after another; each sees at least its own and its predecessors' adds.
        for r in range(SIZE):
            if r == RANK:
                counter.add(rollout)
                assert counter.read(rollout) >= r + 1
            COMM.Barrier()
        assert counter.read(rollout) == SIZE
        # The slot of the next rollout was cleared before anyone counts in it.
        assert counter.read(rollout + 1) == 0
        COMM.Barrier()


def test_concurrent_adds_are_not_lost(counter):
    counter.reset_next(-1)  # clear slot 0 ahead of rollout 0
    COMM.Barrier()
    for _ in range(50):
        counter.add(0)
    COMM.Barrier()
    assert counter.read(0) == 50 * SIZE
    COMM.Barrier()
