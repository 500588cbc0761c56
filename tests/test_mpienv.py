"""native_coll.mpienv: the MPI settings made before MPI starts (network module, waiting ranks)."""
from __future__ import annotations

import os
import re

import pytest

from mpi_launch import mpi_run
from native_coll.mpienv import OVERSUBSCRIBED, YIELD_VAR, local_ranks, with_netmod, with_yield


@pytest.mark.parametrize("env,ranks", [
    ({"MPI_LOCALNRANKS": "4"}, 4),                          # MPICH's Hydra
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, 3),               # Open MPI
    ({"SLURM_STEP_TASKS_PER_NODE": "8"}, 8),                # srun, even
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, 2),            # srun, 2 on each of 3 nodes
    ({"SLURM_STEP_TASKS_PER_NODE": "3,2"}, 3),              # srun, uneven: the first node's
    ({}, 0),
    ({"MPI_LOCALNRANKS": "x"}, 0),
])
def test_the_ranks_on_this_node_come_from_the_launcher(env, ranks):
    assert local_ranks(env) == ranks


def test_waits_sleep_only_where_ranks_outnumber_cores_and_the_user_did_not_choose():
    assert with_yield({"MPI_LOCALNRANKS": "4"}, cores=2) == {"MPI_LOCALNRANKS": "4", **OVERSUBSCRIBED}
    assert with_yield({"MPI_LOCALNRANKS": "2"}, cores=2) == {"MPI_LOCALNRANKS": "2"}
    assert with_yield({}, cores=2) == {}  # no launcher: a single process
    # The user chose one of them: none is changed.
    assert with_yield({"MPI_LOCALNRANKS": "4", YIELD_VAR: "0"}, cores=2) == \
        {"MPI_LOCALNRANKS": "4", YIELD_VAR: "0"}
    assert with_yield({"MPI_LOCALNRANKS": "4", "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "0"}, cores=2) == \
        {"MPI_LOCALNRANKS": "4", "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "0"}
    assert with_netmod({})["MPIR_CVAR_CH4_NETMOD"] == "ofi"


RANK = """
import os
import native_coll  # sets the MPI environment before MPI starts
from mpi4py import MPI
print(f"rank {MPI.COMM_WORLD.rank}: {os.environ.get('MPIR_CVAR_ENABLE_HEAVY_YIELD', 'unset')}")
"""


@pytest.mark.mpi
@pytest.mark.parametrize("extra,expected", [(1, "1"), (0, "unset")])
def test_ranks_launched_past_the_cores_sleep_when_they_yield(tmp_path, monkeypatch, extra,
                                                            expected):
    # Hydra tells each rank how many share the node; one more than the cores: every rank's MPI
    # starts with sleeping waits (a waiter on 2 cores: 2.2 CPU-s per 3 s polling, 0.3 sleeping;
    # the number depends on the load, so the setting is what is checked); as many as the cores:
    # MPICH's own polling stays.
    cores = len(os.sched_getaffinity(0))
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    for name in OVERSUBSCRIBED:  # the launching shell's choice would win
        monkeypatch.delenv(name, raising=False)
    proc = mpi_run(cores + extra, [str(script)], timeout=60,
                   env=dict.fromkeys(OVERSUBSCRIBED))  # (not the suite's own setting)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = sorted(re.findall(r"rank \d+: (1|unset)", proc.stdout))  # lines may interleave
    assert said == [expected] * (cores + extra), proc.stdout
