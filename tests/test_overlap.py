"""The overlapped global average (tests/mpi/overlap_cases.py) at 2, 3, 4 and 8 ranks."""
import pytest

from mpi_launch import mpi_pytest
from spec_launch import assert_spec_passed


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3, 4, 8])
def test_overlap_specification(nprocs):
    assert_spec_passed("tests/mpi/overlap_cases.py", nprocs)


@pytest.mark.mpi
def test_overlapped_global_average_on_pretended_nodes():
    """The overlapped global on the node-aware schedule (2 ranks per pretended node)."""
    mpi_pytest(4, "tests/mpi/overlap_cases.py", timeout=240,
               env={"WA_NODE_SIZE": "2", "WA_HIER_MIN_BYTES": "0"})
