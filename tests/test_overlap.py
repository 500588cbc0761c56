"""The overlapped global average (tests/mpi/overlap_cases.py) at 2, 3, 4 and 8 ranks."""
import pytest

from mpi_launch import mpi_pytest


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3, 4, 8])
def test_overlap_specification(nprocs):
    mpi_pytest(nprocs, "tests/mpi/overlap_cases.py", timeout=240)
