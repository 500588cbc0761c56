"""Multi-rank supervised runs (tests/mpi/supervised_cases.py under mpiexec)."""
import pytest

from mpi_launch import mpi_pytest

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [2])
def test_supervised_runs_with_every_optimizer(nprocs):
    # The same launch checks that a group larger than the job shrinks to it, said in one log
    # line (its own launch cost about 9 CPU-s, mostly the ranks' start).
    mpi_pytest(nprocs, "tests/mpi/supervised_cases.py", timeout=180)
