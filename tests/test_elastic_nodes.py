"""Training goes on without lost ranks and takes them back (wagma_rl.elastic), on the namespaced
cluster (2 nodes, n0 and n1; the supervisor on n0 unless a test says otherwise). Each test places
the fewest ranks its fault needs, since a rank's start costs about 3.5 CPU-s on the 2 test cores
(docs/testing.md): the node that dies holds 2 ranks (n0:1, n1:2), so a whole node of several ranks
is lost and given back; a cut link, one rank on each node (it cuts off a node whatever it holds);
rank 0's node, n0:1 beside n1:2 (the 2 left must end with identical replicas); a stopped rank, 2
ranks on each (a rank of n1 stopped, its node's other rank may go on). The supervisor runs the
quick PointNav job, slowed to about 0.5 s per update so that faults land mid-run, while a test
stops a rank, kills a node or cuts its link. Every case must finish its frame budget, with the
counters exact: WAGMA's lock-step rollouts are full, so every update adds ``num_steps x num_envs x
world`` frames, and the run's final update and frame counts follow from the state it went on from
and the world size of each launch. (The supervisor's cases without a cluster:
tests/test_elastic.py.)
"""
from __future__ import annotations

import fcntl
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from mpi_launch import REPO, RunningTraining, mpi_env, mpiexec_path, stopped
from run_log import assert_counters_exact
from wagma_rl.config import load_config
from wagma_rl.rl.config import DDPPOConfig

QUICK = "configs/quick_pointnav.yaml"
_quick = load_config(DDPPOConfig, REPO / QUICK)
STEP_FRAMES = _quick.ppo.num_steps * _quick.env.num_envs  # per rank and update
TIMEOUT = 10  # (start-up on 2 loaded cores takes several seconds: 5 s was seen to be too short)


# --------------------------------------------------------------------- on the namespaced nodes
class ElasticJob(RunningTraining):
    """The supervisor on ``on`` (n0) running the quick job with ``slots`` ranks on each node (e.g.
    ``{"n0": 1, "n1": 2}``: rank 0 on n0, ranks 1 and 2 on n1) for as many frames as ``updates``
    updates on all of them; its output collected as it comes. ``dead_after``: the supervisor's
    --dead-after (60 by default here: the tests of the survivors' timeout keep the heartbeats out
    of their way)."""

    def __init__(self, cluster, run_dir: Path, slots: dict[str, int], updates: int, *,
                 rejoin_after: float, on: str = "n0", dead_after: float = 60):
        self.run_dir = run_dir
        self.total = updates * STEP_FRAMES * sum(slots.values())
        launcher = f"{mpiexec_path()} -launcher ssh -launcher-exec {cluster.launcher}"
        hosts = ",".join(f"{node}:{n}" for node, n in slots.items())
        argv = [sys.executable, "-m", "wagma_rl.elastic", "--launcher", launcher,
                "--hosts", hosts, "--dead-after", str(dead_after),
                "--rejoin-after", str(rejoin_after), "--probe-timeout", "10", "--state-dir", str(run_dir.parent / "elastic"),
                "--", sys.executable, "run_ddppo.py", "--config", QUICK, f"run.dir={run_dir}",
                f"run.total_frames={self.total}", f"averaging.timeout={TIMEOUT}",
                "run.log_interval=1", "run.checkpoint_interval=4",
                "heterogeneity.stall_s=0.03", "heterogeneity.stall_prob=1.0"]
        super().__init__(cluster.node_command(on, argv), env=mpi_env(600), keep_lines=150,
                         context=lambda: f"--- log.txt\n{self.log()[-3000:]}")



def _rank_pids(cluster, node: str) -> list[int]:
    return [p for p in cluster.pids(node)
            if b"run_ddppo.py" in Path(f"/proc/{p}/cmdline").read_bytes()]


def _assert_counters_exact(job: ElasticJob) -> list[dict]:
    return assert_counters_exact(job.log(), step_frames=STEP_FRAMES, total=job.total)


def _report(fault: str, job: ElasticJob, t_fault: float, launches: list[dict]) -> None:
    """One row of docs/results/faults.md's elastic table (printed; run with -s): seconds from the fault
    to the first update without the lost ranks, the updates done again (since the state the job
    went on from), and seconds from the stop for a rejoin to the first update with every rank."""
    lines = job.log().splitlines()
    firsts = [(time.mktime(time.strptime(line[1:20], "%Y-%m-%d %H:%M:%S")), line)
              for line in lines if "] first update on " in line]
    to_first = firsts[0][0] - t_fault if firsts else float("nan")
    redone = launches[0]["end"][0] - launches[1]["start"][0]
    rejoin = [float(m.group(1)) for _, line in firsts
              if (m := re.search(r"([\d.]+) s after the job stopped for them", line))]
    print(f"\n| {fault} | {launches[0]['world']} -> {launches[1]['world']} | {to_first:.0f} | "
          f"{redone} | {f'{rejoin[0]:.0f}' if rejoin else '-'} |")


def _assert_left_behind_and_back(job: ElasticJob, fault: str, t_fault: float, loss: str,
                                 worlds: list[int]) -> None:
    """The job ran on every rank, then on n0's, then on every rank again (``worlds``), and
    finished with exact counters and identical replicas; ``loss`` is what log.txt says of the
    loss (a regular expression)."""
    assert job.result(300) == 0, job.output
    log = job.log()
    assert re.search(loss, log), log[-3000:]
    assert "n1 rejoined" in log, job.output
    launches = _assert_counters_exact(job)
    assert [item["world"] for item in launches] == worlds, launches
    assert f"replicas identical on all {worlds[-1]} ranks" in log
    _report(fault, job, t_fault, launches)


@pytest.fixture
def healthy(cluster):
    yield cluster
    for node in cluster.nodes:
        cluster.link(node, up=True)
        for pid in cluster.pids(node):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.mpi
@pytest.mark.cluster
def test_a_stopped_rank_is_left_behind_and_the_survivors_finish(healthy, tmp_path):
    job = ElasticJob(healthy, tmp_path / "run", {"n0": 2, "n1": 2}, 20, rejoin_after=1000)
    job.wait_for(r"update=6 ", 120)
    victim = _rank_pids(healthy, "n1")[-1]
    with stopped(victim) as t_stop:
        assert job.result(240) == 0, job.output
    log = job.log()
    assert re.search(rf"stopped: .*pid {victim}.*The survivors saved the state", log), log[-3000:]
    launches = _assert_counters_exact(job)
    assert [item["world"] for item in launches][0] == 4 and 2 <= launches[-1]["world"] <= 3
    assert f"replicas identical on all {launches[-1]['world']} ranks" in log
    _report("a rank SIGSTOPped", job, t_stop, launches)


@pytest.mark.mpi
@pytest.mark.cluster
def test_a_dead_node_is_left_behind_and_rejoins_when_it_answers(healthy, tmp_path):
    # n1 holds 2 of the 3 ranks: the node lost and given back is one of several ranks.
    job = ElasticJob(healthy, tmp_path / "run", {"n0": 1, "n1": 2}, 30, rejoin_after=10)
    # The node dies: every process on it, then its link.
    job.wait_for(r"update=6 ", 120)
    t_fault = time.time()
    for pid in healthy.pids("n1"):
        os.kill(pid, signal.SIGKILL)
    healthy.link("n1", up=False)
    job.wait_for(r"training wagma on 1 rank\b", 120)
    time.sleep(3)
    healthy.link("n1", up=True)  # the node is back
    # (Either Hydra's mpiexec fails as the node's proxy goes and ends every rank, and the
    # supervisor finds n1 gone by trying it; or the link is down before n0 hears of the deaths,
    # and the survivors time out and record the loss: which one comes first is a race.)
    _assert_left_behind_and_back(job, "a node dies (processes killed, link down)", t_fault,
                                 r"elastic: (the job ended .*n1 did not answer|lost rank 1 \(n1[;)])",
                                 [3, 1, 3])


@pytest.mark.mpi
@pytest.mark.cluster
def test_a_link_cut_past_the_timeout_goes_on_without_the_node_then_takes_it_back(healthy, tmp_path):
    # One rank per node: the cut takes the node out whatever it holds (the dead-node test above
    # loses and takes back a node of 2 ranks).
    job = ElasticJob(healthy, tmp_path / "run", {"n0": 1, "n1": 1}, 30, rejoin_after=10)
    job.wait_for(r"update=6 ", 120)
    healthy.link("n1", up=False)
    t_fault = time.time()
    job.wait_for(r"training wagma on 1 rank\b", 120)
    healthy.link("n1", up=True)
    _assert_left_behind_and_back(job, f"a link cut past the {TIMEOUT} s timeout", t_fault,
                                 r"stopped: .*host n1.*The survivors saved the state", [2, 1, 2])


@pytest.mark.mpi
@pytest.mark.cluster
def test_losing_rank_0s_node_does_not_end_the_run_though_its_lock_outlives_it(healthy, tmp_path):
    """n0 (rank 0) dies; the supervisor runs on n1, with ranks 1 and 2. The run folder's lock
    outlives rank 0 as it does on NFS until the dead client's lease expires (here the folder is
    local, where the kernel drops it at once: the test holds it in the dead client's place for a
    few seconds after the supervisor starts waiting). The run goes on on n1 and finishes, frames
    counted once. Default --dead-after: the heartbeats, the survivors' timeout or Hydra may find
    the loss first; each is a way on."""
    job = ElasticJob(healthy, tmp_path / "run", {"n0": 1, "n1": 2}, 16, rejoin_after=1000,
                     on="n1", dead_after=10)
    job.wait_for(r"update=6 ", 120)
    lock = os.open(job.run_dir / ".lock", os.O_RDONLY)
    try:
        for pid in healthy.pids("n0"):
            os.kill(pid, signal.SIGKILL)
        healthy.link("n0", up=False)
        end = time.monotonic() + 10
        while True:  # (the kernel drops rank 0's lock as it exits; the "server" keeps it)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < end, "rank 0's lock was not released"
                time.sleep(0.01)
        job.wait_until(lambda: any("is still held" in line for line in job.lines),
                       "wait for the lock by the supervisor", 120)
        time.sleep(3)  # the lease expires
    finally:
        os.close(lock)
    assert job.result(240) == 0, job.output
    log = job.log()
    assert re.search(r"elastic: waited [\d.]+ s for the run lock; relaunching on 2 ranks \(n1:2\)",
                     log), log[-3000:]
    launches = _assert_counters_exact(job)
    assert [item["world"] for item in launches] == [3, 2], launches
    assert "replicas identical on all 2 ranks" in log
