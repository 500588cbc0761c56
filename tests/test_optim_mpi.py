"""Multi-rank tests of wagma_rl.optim: the modules under tests/mpi/ run on 2, 3 and 4 ranks (in
the launches they share with the collective's specification: tests/spec_launch.py)."""
import pytest

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
