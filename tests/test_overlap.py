"""The overlapped global average (tests/mpi/overlap_cases.py) at 2, 3, 4 and 8 ranks."""
import pytest

from spec_launch import assert_spec_passed


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3, 4, 8])
def test_overlap_specification(nprocs):
    assert_spec_passed("tests/mpi/overlap_cases.py", nprocs)


@pytest.mark.mpi
def test_overlapped_global_average_on_pretended_nodes():
    """The overlapped global on the node-aware schedule (2 ranks per pretended node:
    tests/mpi/overlap_pretended_cases.py, in the 4-rank launch)."""
    assert_spec_passed("tests/mpi/overlap_pretended_cases.py", 4)
