"""The non-finite guard of native_coll (tests/mpi/nonfinite_result_cases.py) at 1, 2, 3 and 4 ranks."""
import pytest

from mpi_launch import mpi_pytest


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_nonfinite_result_specification(nprocs):
    mpi_pytest(nprocs, "tests/mpi/nonfinite_result_cases.py", timeout=240)


@pytest.mark.mpi
def test_nonfinite_result_specification_on_pretended_nodes():
    """The guard on the node-aware schedule (2 ranks per pretended node, no size threshold)."""
    mpi_pytest(4, "tests/mpi/nonfinite_result_cases.py", timeout=240,
               env={"WA_NODE_SIZE": "2", "WA_HIER_MIN_BYTES": "0"})
