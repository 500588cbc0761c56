"""native_coll's multi-rank specification (tests/mpi/native_coll_cases.py) at 1, 2, 3, 4 and 8 ranks."""
import pytest

from mpi_launch import mpi_pytest


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 8])
def test_native_coll_specification(nprocs):
    mpi_pytest(nprocs, "tests/mpi/native_coll_cases.py", timeout=240)
