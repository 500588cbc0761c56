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


# MPICH's cliques split the machine's ranks into two "nodes" (odd and even ranks) for
# MPI_COMM_TYPE_SHARED: 4 and 6 ranks make two even nodes, 3 ranks nodes of 2 and 1.
@pytest.mark.parametrize("nprocs", [4, 6])
def test_shared_memory_sum_across_nodes_is_hierarchical(nprocs):
    mpi_pytest(nprocs, "tests/mpi/optim_node_cliques_cases.py", timeout=90, select="TestEvenNodes",
               env={"MPIR_CVAR_NUM_CLIQUES": "2"})


def test_shared_memory_sum_refuses_uneven_nodes():
    mpi_pytest(3, "tests/mpi/optim_node_cliques_cases.py", timeout=60, select="uneven",
               env={"MPIR_CVAR_NUM_CLIQUES": "2"})
