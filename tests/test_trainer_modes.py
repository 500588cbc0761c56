"""The trainer's five distributed modes at 2 and 4 ranks (tests/mpi/trainer_modes.py on every rank):
frame counts, TensorBoard scalars, checkpoints and resume, identical replicas, preemption, and the
per-update trace; the finished counter at 1-4 ranks and the per-worker view at 2."""
from __future__ import annotations

import functools

import pytest

from mpi_launch import assert_module_passed, mpi_pytest, mpi_pytest_shared

pytestmark = pytest.mark.mpi

MODES, COUNTER, VIEW = ("tests/mpi/trainer_modes.py", "tests/mpi/counter_cases.py",
                        "tests/mpi/worker_view_cases.py")

# VER collection and the trace are per-rank machinery the rank count does not change: VER runs at
# 2 ranks (with the averaging and the preempting mode; a gradient allreduce is the same whatever
# the collection), the trace at 3 (below). At 4 ranks the modes with their own wire (WAGMA in both
# global modes, preemption, gossip) run across the two namespaced nodes instead
# (tests/test_cluster.py, as root), the MPI-allreduce modes here: `make test` stays inside its time.
# The other modules at the same rank count run in the same launch (the ranks start once: about
# 2.5 CPU-s a rank each time); each test asserts its own module's outcome in it.
LAUNCHES = {2: ([MODES, COUNTER, VIEW], "not TestVerAllreduce and not TestTrace"),
            3: ([MODES, COUNTER], "TestWagma or TestTrace or counter_cases"),
            4: ([MODES, COUNTER], "TestAllreduce or TestLocalSgd or counter_cases")}


@pytest.fixture(scope="module")
def launch():
    """The shared launch at a rank count of LAUNCHES, made once (tests/conftest.py keeps this
    file's tests in one worker)."""
    return functools.lru_cache(maxsize=None)(
        lambda nprocs: mpi_pytest_shared(nprocs, LAUNCHES[nprocs][0], timeout=420,
                                         select=LAUNCHES[nprocs][1]))


@pytest.mark.parametrize("nprocs", [2, 4], ids=["2", "4"])
def test_trainer_modes(nprocs, launch):
    assert_module_passed(launch(nprocs), MODES)


def test_wagma_with_a_group_size_that_does_not_divide_the_ranks(launch):
    # 3 ranks in groups of 2: the collective forms one group of 3 (group_of's rule).
    assert_module_passed(launch(3), MODES)


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_finished_counter(nprocs, launch):
    if nprocs == 1:
        mpi_pytest(1, COUNTER, timeout=120)
    else:
        assert_module_passed(launch(nprocs), COUNTER)


def test_the_per_worker_view_shows_each_workers_env_step_times_and_stalls(launch):
    # Lock-step and VER collection; 2 ranks show a stalled rank beside a steady one.
    assert_module_passed(launch(2), VIEW)
