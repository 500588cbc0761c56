"""The project's multi-rank specifications across two namespaced nodes (2 nodes x 2 ranks, TCP
between the nodes): the same modules that run on one machine, so shared memory cannot hide a
progress or protocol bug. The nodes come from cluster/netns.py (the `cluster` fixture)."""
import pytest

from mpi_launch import mpi_pytest

pytestmark = [pytest.mark.mpi, pytest.mark.cluster]


def test_collective_specification_across_nodes(cluster):
    mpi_pytest(4, "tests/mpi/native_coll_cases.py", timeout=240, cluster=cluster)


def test_synchronous_optimizers_across_nodes(cluster):
    mpi_pytest(4, "tests/mpi/optim_cases.py", timeout=180, cluster=cluster)


def test_wait_avoiding_optimizers_across_nodes(cluster):
    mpi_pytest(4, "tests/mpi/optim_wagma_cases.py", timeout=180, cluster=cluster)


def test_finished_counter_across_nodes(cluster):
    mpi_pytest(4, "tests/mpi/counter_cases.py", timeout=120, cluster=cluster)


def test_trainer_modes_with_resume_across_nodes(cluster):
    mpi_pytest(4, "tests/mpi/trainer_modes.py", timeout=300, cluster=cluster)
