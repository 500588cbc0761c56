"""native_coll's multi-rank specification (tests/mpi/native_coll_cases.py) at 1, 2, 3, 4 and 8 ranks,
and the node-aware schedule (tests/mpi/hier_cases.py) on pretended nodes."""
import pytest

from spec_launch import assert_spec_passed


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 8])
def test_native_coll_specification(nprocs):
    assert_spec_passed("tests/mpi/native_coll_cases.py", nprocs)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 4, 6, 8])
def test_node_aware_schedule(nprocs):
    """tests/mpi/hier_cases.py: bitwise results of the node-aware schedule on pretended nodes."""
    assert_spec_passed("tests/mpi/hier_cases.py", nprocs)


@pytest.mark.mpi
def test_native_coll_specification_on_pretended_nodes():
    """The whole specification again at 8 ranks with 2 per pretended node and no size threshold,
    so every group and global over several nodes takes the node-aware schedule
    (tests/mpi/native_coll_pretended_cases.py, in the 8-rank launch; an odd number of nodes:
    hier_cases.py at 6 ranks; real nodes: tests/test_cluster.py)."""
    assert_spec_passed("tests/mpi/native_coll_pretended_cases.py", 8)
