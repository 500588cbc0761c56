"""The project's multi-rank specifications across two namespaced nodes (2 nodes x 2 ranks, TCP
between the nodes): the same modules that run on one machine, so shared memory cannot hide a
progress or protocol bug. The nodes come from cluster/netns.py (the `cluster` fixture)."""
import json
import subprocess
import sys

import pytest

from cluster import netns
from mpi_launch import REPO, assert_module_passed, mpi_pytest_shared, mpi_run
from native_coll.mpienv import OVERSUBSCRIBED

pytestmark = [pytest.mark.mpi, pytest.mark.cluster]

# The specification modules that run as they are across the nodes share one launch: the 4 ranks
# start once instead of once per module (each start cost about 14 CPU-s and 10-15 s of the
# cluster worker's path). Each test below asserts its own module's outcome in it. The node-aware
# schedule runs on the layout MPI reports (WA_TEST_REAL_NODES, read by that module alone). The
# trainer's modes with a wire of their own over the network (WAGMA in both global modes,
# preemption, gossip) come last; the MPI-allreduce modes, VER's collection and the trace inside a
# rank run on one node at 4 ranks (tests/test_trainer_modes.py), the synchronous optimizers across
# nodes here.
HIER, MODES = "tests/mpi/hier_cases.py", "tests/mpi/trainer_modes.py"
NODE_SUM = "tests/mpi/optim_node_cliques_cases.py::TestEvenNodes"
SHARED = ["tests/mpi/native_coll_cases.py", "tests/mpi/overlap_cases.py",
          "tests/mpi/optim_cases.py", "tests/mpi/optim_wagma_cases.py",
          "tests/mpi/counter_cases.py", HIER, NODE_SUM,
          *(f"{MODES}::{cls}" for cls in ("TestWagma", "TestWagmaOverlap", "TestPreempt",
                                           "TestDpsgd"))]


@pytest.fixture(scope="module")
def shared_launch(cluster):
    # Each namespaced node counts 2 ranks on its 2 cores, so MPICH would poll without pause, but
    # the nodes share this machine's 2 cores with each other and the suite's other workers:
    # sleeping waits, as on one machine (tests/mpi_launch.py). The fault tests across nodes keep
    # each rank's own rule (their timing was measured so).
    return mpi_pytest_shared(4, SHARED, cluster=cluster,
                             env={"WA_TEST_REAL_NODES": "1", **OVERSUBSCRIBED})


def test_collective_specification_across_nodes(shared_launch):
    assert_module_passed(shared_launch, "tests/mpi/native_coll_cases.py")


def test_overlapped_global_average_across_nodes(shared_launch):
    assert_module_passed(shared_launch, "tests/mpi/overlap_cases.py")


def test_synchronous_optimizers_across_nodes(shared_launch):
    assert_module_passed(shared_launch, "tests/mpi/optim_cases.py")


def test_wait_avoiding_optimizers_across_nodes(shared_launch):
    assert_module_passed(shared_launch, "tests/mpi/optim_wagma_cases.py")


def test_shared_memory_gradient_sum_across_nodes_is_hierarchical(shared_launch):
    assert_module_passed(shared_launch, NODE_SUM)


def test_finished_counter_across_nodes(shared_launch):
    assert_module_passed(shared_launch, "tests/mpi/counter_cases.py")


def test_trainer_modes_with_resume_across_nodes(shared_launch):
    assert_module_passed(shared_launch, MODES)


def test_mpich_ucx_between_hosts_is_refused_with_the_fix(cluster):
    # UCX stalls the engine's polled messages between hosts (docs/cluster.md): with the network
    # module left to MPICH's default, every rank gets the message instead of a hang.
    proc = mpi_run(4, ["tests/programs/netmod_refusal.py"], timeout=60, cluster=cluster,
                   env={"MPIR_CVAR_CH4_NETMOD": ""})
    refused = [line for line in proc.stdout.splitlines() if ": refused: " in line]
    assert len(refused) == 4, proc.stdout + proc.stderr
    assert all("export MPIR_CVAR_CH4_NETMOD=ofi" in line for line in refused)


def test_the_ofi_module_constructs_on_both_nodes(cluster):
    proc = mpi_run(4, ["tests/programs/netmod_refusal.py"], timeout=60, cluster=cluster)
    assert sorted(proc.stdout.split("\n")[:-1]) == [f"rank {r}: constructed" for r in range(4)]


def test_node_aware_schedule_across_nodes(shared_launch):
    # MPI says which ranks share a node here: two nodes of two, so the node-aware schedule runs.
    assert_module_passed(shared_launch, HIER)


def test_the_soak_counts_its_runs_and_writes_a_raw_file(tmp_path):
    # cluster/soak.py makes two nodes of its own; one stress run is its whole path at the
    # smallest size.
    if (why := netns.available()):
        pytest.skip(f"no namespaced nodes here: {why}")
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "cluster.soak", "--stress", "1", "--train", "0",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "| stress | 1 | 1 | 0 | 0 |" in proc.stdout
    raw = json.loads(out.read_text())
    assert raw["rows"] == [{"case": "stress", "runs": 1, "median_s": raw["runs"][0]["seconds"],
                            "pass": 1, "fail": 0, "hang": 0}]
    assert [r["status"] for r in raw["runs"]] == ["pass"] and raw["facts"]["commit"]
