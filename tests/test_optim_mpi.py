"""Multi-rank tests of wagma_rl.optim: the modules under tests/mpi/ run on 2, 3 and 4 ranks."""
import pytest

from mpi_launch import mpi_pytest

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_synchronous_optimizers(nprocs):
    mpi_pytest(nprocs, "tests/mpi/optim_cases.py", timeout=120)


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_wait_avoiding_optimizers(nprocs):
    mpi_pytest(nprocs, "tests/mpi/optim_wagma_cases.py", timeout=180)


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_outer_optimizer(nprocs):
    mpi_pytest(nprocs, "tests/mpi/optim_outer_cases.py", timeout=180)


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_low_precision_global_exchange(nprocs):
    mpi_pytest(nprocs, "tests/mpi/precision_cases.py", timeout=180)


@pytest.mark.parametrize("nprocs", [2, 4])
def test_nonblocking_gradient_buckets(nprocs):
    mpi_pytest(nprocs, "tests/mpi/optim_nonblocking_buckets_cases.py", timeout=120)


@pytest.mark.parametrize("nprocs", [2, 4])
def test_background_model_averages(nprocs):
    mpi_pytest(nprocs, "tests/mpi/optim_background_cases.py", timeout=120)
