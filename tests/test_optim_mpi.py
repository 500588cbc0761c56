"""Multi-rank tests of wagma_rl.optim: the modules under tests/mpi/ run on 2, 3 and 4 ranks (in
the launches they share with the collective's specification: tests/spec_launch.py)."""
import pytest

from mpi_launch import mpi_pytest
from spec_launch import assert_spec_passed

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_synchronous_optimizers(nprocs):
    assert_spec_passed("tests/mpi/optim_cases.py", nprocs)


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_wait_avoiding_optimizers(nprocs):
    assert_spec_passed("tests/mpi/optim_wagma_cases.py", nprocs)


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_outer_optimizer(nprocs):
    assert_spec_passed("tests/mpi/optim_outer_cases.py", nprocs)


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_low_precision_global_exchange(nprocs):
    assert_spec_passed("tests/mpi/precision_cases.py", nprocs)


@pytest.mark.parametrize("nprocs", [2, 4])
def test_nonblocking_gradient_buckets(nprocs):
    assert_spec_passed("tests/mpi/optim_nonblocking_buckets_cases.py", nprocs)


@pytest.mark.parametrize("nprocs", [2, 4])
def test_background_model_averages(nprocs):
    assert_spec_passed("tests/mpi/optim_background_cases.py", nprocs)


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_gradients_summed_in_shared_memory(nprocs):
    assert_spec_passed("tests/mpi/optim_node_cases.py", nprocs)


def test_shared_memory_sum_refuses_ranks_on_several_nodes():
    # MPICH's cliques split the machine's 4 ranks into two "nodes" of 2 for MPI_COMM_TYPE_SHARED.
    mpi_pytest(4, "tests/mpi/optim_node_cliques_cases.py", timeout=60,
               env={"MPIR_CVAR_NUM_CLIQUES": "2"})
