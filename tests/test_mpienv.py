"""native_coll.mpienv: the MPI settings made before MPI starts (network module, waiting ranks,
single-copy transfers)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from mpi_launch import REPO, mpi_run
from native_coll.mpienv import (CMA_VAR, OVERSUBSCRIBED, YIELD_VAR, cma_allowed, local_ranks, with_cma,
                                with_netmod, with_yield)


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


def test_single_copy_transfers_follow_the_probe_on_a_shared_node_unless_the_user_chose():
    yes, no = (lambda: True), (lambda: False)
    assert with_cma({"MPI_LOCALNRANKS": "4"}, probe=yes) == {"MPI_LOCALNRANKS": "4", CMA_VAR: "1"}
    assert with_cma({"MPI_LOCALNRANKS": "4"}, probe=no) == {"MPI_LOCALNRANKS": "4", CMA_VAR: "0"}
    # One rank on this node, or no launcher: nothing to copy between ranks, nothing probed.
    assert with_cma({"MPI_LOCALNRANKS": "1"}, probe=yes) == {"MPI_LOCALNRANKS": "1"}
    assert with_cma({}, probe=yes) == {}
    # The user's choice stands either way.
    assert with_cma({"MPI_LOCALNRANKS": "4", CMA_VAR: "0"}, probe=yes)[CMA_VAR] == "0"
    assert with_cma({"MPI_LOCALNRANKS": "4", CMA_VAR: "1"}, probe=no)[CMA_VAR] == "1"


# A rank that peers may not read: without CAP_SYS_PTRACE (dropped from the bounding set, so root
# loses it too at exec) and marked non-dumpable, a same-user peer's process_vm_readv gets EPERM,
# as under Yama's ptrace_scope 1 or a container that forbids tracing.
FORBID = ["setpriv", "--bounding-set", "-sys_ptrace", "--"]
NONDUMPABLE = "import ctypes; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n"  # PR_SET_DUMPABLE 0
needs_forbid = pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0,
                                  reason="needs root and util-linux's setpriv to forbid the reads")


def _probe(prefix: list[str], code: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([*prefix, sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, check=True).stdout.strip()


@needs_forbid
def test_the_probe_says_whether_sibling_processes_may_read_each_other():
    ask = "from native_coll.mpienv import cma_allowed; print(cma_allowed())"
    assert cma_allowed() is True  # root: CAP_SYS_PTRACE
    assert _probe(FORBID, ask) == "True"  # same user, dumpable
    assert _probe(FORBID, NONDUMPABLE + ask) == "False"
    assert _probe([], NONDUMPABLE + ask) == "True"  # root may still


CMA_RANK = """
import ctypes, os, sys
if os.environ.get("RANK_NONDUMPABLE"):
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
import numpy as np
import native_coll  # sets the MPI environment before MPI starts
from mpi4py import MPI
comm = MPI.COMM_WORLD
x = np.full(4 << 20, comm.rank + 1, np.float32)  # 16 MiB: MPICH's large-message path
y = np.empty_like(x)
comm.Allreduce(x, y)
ok = bool((y == comm.size * (comm.size + 1) // 2).all())
sys.stdout.write(f"rank {comm.rank}: cma={os.environ.get('MPIR_CVAR_CH4_CMA_ENABLE', 'unset')} "
                 f"sum={'exact' if ok else 'wrong'}\\n")
"""


@pytest.mark.mpi
@needs_forbid
@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_copy_once_where_they_may_and_twice_where_they_may_not(tmp_path, ranks):
    from mpi_launch import mpi_command, mpi_env
    script = tmp_path / "rank.py"
    script.write_text(CMA_RANK)
    base = mpi_env(60, {CMA_VAR: None})

    def launch(prefix, **env):
        return subprocess.run([*prefix, *mpi_command(ranks, [str(script)])], cwd=REPO,
                              env={**base, **env}, capture_output=True, text=True, timeout=90)

    def said(proc):
        return sorted(re.findall(r"rank \d+: (cma=\w+ sum=\w+)", proc.stdout))

    allowed = launch([])
    assert allowed.returncode == 0 and said(allowed) == ["cma=1 sum=exact"] * ranks, \
        allowed.stdout + allowed.stderr
    # Ranks that may not read each other: the probe leaves MPICH's double copy, and the sums stay exact.
    forbidden = launch(FORBID, RANK_NONDUMPABLE="1")
    assert forbidden.returncode == 0 and said(forbidden) == ["cma=0 sum=exact"] * ranks, \
        forbidden.stdout + forbidden.stderr
    if ranks > 2:
        return
    # What the probe prevents: the same ranks told to read each other fail at the first large
    # message (at 3 ranks one raises and the others wait until Hydra's timeout ends them).
    forced = launch(FORBID, RANK_NONDUMPABLE="1", MPIEXEC_TIMEOUT="30", **{CMA_VAR: "1"})
    assert forced.returncode != 0 and "process_vm_readv failed" in forced.stdout + forced.stderr, \
        forced.stdout + forced.stderr


LOOP = "tests/programs/collective_loop.py"


@pytest.mark.mpi
@pytest.mark.parametrize("cma", ["1", "0"])
def test_a_rank_killed_during_large_averages_is_named_and_the_job_ends(cma):
    # The single copy reads the sender's memory: a sender killed mid-transfer must not hang or
    # crash its peers any other way than with it off. 3 ranks form one group, so every average
    # needs rank 2; 16 MiB models go through the large-message path.
    from mpi_launch import Running, mpi_command, mpi_env
    timeout = 5.0
    job = Running(mpi_command(3, [LOOP, "100000", str(timeout), str(4 << 20)],
                              mpiexec_args=("-disable-auto-cleanup",)),
                  env=mpi_env(60, {CMA_VAR: cma}))
    job.wait_until(lambda: sum(line.startswith("ready ") for line in job.lines) >= 3,
                   "start of every rank", 60)
    pids = dict(map(int, line.split()[1:3]) for line in job.lines if line.startswith("ready "))
    time.sleep(1.5)  # (some averages done: the loop prints nothing per average)
    os.kill(pids[2], signal.SIGKILL)
    job.result(timeout + 20)  # ends: the survivors time out, or Hydra ends them on the loss
    assert "Traceback" not in job.output and "process_vm_readv" not in job.output, job.output
    # Each survivor that reports names, in its one line, the peers its average waited for (timed
    # out) or lost (MPI saw the connection break), with their pids: rank 2, or the other
    # survivor where Hydra had ended that one first. Hydra ends
    # the survivors when a rank dies by a signal, at a moment of its own (in about half the runs
    # here, with the single copy on and off alike, at once: then nobody reports).
    for rank, line in re.findall(r"^rank ([01]) on \S+: (.*)$", job.output, re.M):
        named = re.findall(r"rank (\d) \(host \S+, pid (\d+)\)", line.split("missing: ")[-1])
        assert ("did not answer" in line or "broke" in line) and named, job.output
        assert all(int(r) != int(rank) and pids[int(r)] == int(pid) for r, pid in named), job.output
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX", job.output
