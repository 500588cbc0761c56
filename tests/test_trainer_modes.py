"""The trainer's five distributed modes at 2 and 4 ranks (tests/mpi/trainer_modes.py on every rank):
frame counts, TensorBoard scalars, checkpoints and resume, identical replicas, preemption, and the
per-update trace."""
from __future__ import annotations

import pytest

from mpi_launch import mpi_pytest

pytestmark = pytest.mark.mpi


# VER collection and the trace are per-rank machinery the rank count does not change: VER runs at
# 2 ranks (with the averaging and the preempting mode; a gradient allreduce is the same whatever
# the collection), the trace at 3 (below). At 4 ranks the modes with their own wire (WAGMA in both
# global modes, preemption, gossip) run across the two namespaced nodes instead
# (tests/test_cluster.py, as root), the MPI-allreduce modes here: `make test` stays inside its time.
@pytest.mark.parametrize("nprocs,select", [(2, "not TestVerAllreduce and not TestTrace"),
                                           (4, "TestAllreduce or TestLocalSgd")],
                         ids=["2", "4"])
def test_trainer_modes(nprocs, select):
    mpi_pytest(nprocs, "tests/mpi/trainer_modes.py", timeout=240, select=select)


def test_wagma_with_a_group_size_that_does_not_divide_the_ranks():
    # 3 ranks in groups of 2: the collective forms one group of 3 (group_of's rule).
    mpi_pytest(3, "tests/mpi/trainer_modes.py", timeout=240, select="TestWagma or TestTrace")


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_finished_counter(nprocs):
    mpi_pytest(nprocs, "tests/mpi/counter_cases.py", timeout=120)


def test_the_per_worker_view_shows_each_workers_env_step_times_and_stalls():
    # Lock-step and VER collection; 2 ranks show a stalled rank beside a steady one.
    mpi_pytest(2, "tests/mpi/worker_view_cases.py", timeout=240)
