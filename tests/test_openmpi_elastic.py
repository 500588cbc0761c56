"""The elastic supervisor with Open MPI's ``mpirun`` as its launcher (wagma_rl.elastic, docs/mpi.md):
the survivors of a killed rank shrink in place and the supervisor keeps the launch, taking the slot
out and giving it back at a rejoin; what ULFM does not survive, a stopped rank (here rank 0, the
writer, after another rank was lost in place), is found by its heartbeat and ends the launch,
which goes on without it as on MPICH. One
host, 3 ranks of the quick PointNav job slowed to about 0.5 s per update; the whole node lost (PRRTE
ends the job) is in tests/test_openmpi_nodes.py."""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from mpi_launch import REPO, RunningTraining, mpi_env, stopped
from native_coll.mpiinfo import FT_LAUNCH_ARGS, openmpi_env
from openmpi_launch import OPY, OVENV, openmpi_missing
from run_log import assert_counters_exact
from wagma_rl.config import load_config
from wagma_rl.rl.config import DDPPOConfig

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(openmpi_missing() is not None, reason=str(openmpi_missing()))]

QUICK = "configs/quick_pointnav.yaml"
_quick = load_config(DDPPOConfig, REPO / QUICK)
STEP_FRAMES = _quick.ppo.num_steps * _quick.env.num_envs  # per rank and update


class OpenMPIElasticJob(RunningTraining):
    """``python -m wagma_rl.elastic`` (the Open MPI venv's) launching the quick job through
    ``mpirun --with-ft ulfm`` on ``hosts`` (``cluster``: on its first node, PRRTE reaching the others
    through the cluster's ssh-like launcher); the supervisor's lines collected as they come."""

    def __init__(self, run_dir: Path, hosts: str, total: int, *, rejoin_after: float = 1000,
                 dead_after: float = 10, cluster=None, on: str | None = None):
        self.run_dir, self.total = run_dir, total
        mpirun = [str(OVENV / "bin" / "mpirun"), *FT_LAUNCH_ARGS]
        mpirun += ["--oversubscribe"] if cluster is None else \
            ["--prtemca", "plm_ssh_agent", cluster.launcher]
        argv = [str(OPY), "-m", "wagma_rl.elastic", "--launcher", " ".join(mpirun), "--hosts", hosts,
                "--rejoin-after", str(rejoin_after), "--dead-after", str(dead_after),
                "--probe-timeout", "10", "--state-dir", str(run_dir.parent / "elastic"), "--",
                str(OPY), "run_ddppo.py", "--config", QUICK, f"run.dir={run_dir}",
                f"run.total_frames={total}", "averaging.timeout=60", "run.log_interval=1",
                "run.checkpoint_interval=4", "heterogeneity.stall_s=0.03",
                "heterogeneity.stall_prob=1.0"]
        env = openmpi_env(mpi_env(600))
        env.pop("MPIEXEC_TIMEOUT", None)
        if cluster is not None:
            argv = cluster.node_command(on or cluster.nodes[0], argv)
        super().__init__(argv, env=env, keep_lines=150,
                         context=lambda: f"--- log.txt\n{self.log()[-3000:]}")


    def rank_pid(self, rank: int) -> int:
        """The pid of the first launch's ``rank`` (from its heartbeat file)."""
        beat = self.run_dir.parent / "elastic" / f"beat_1_rank{rank}"
        return int(beat.read_text().split()[3])


def test_a_killed_rank_is_survived_in_place_and_its_slot_comes_back_at_a_rejoin(tmp_path):
    # 3 ranks; rank 1 killed once update 4 is logged. The survivors shrink in place: the
    # supervisor says so and does not relaunch; 5 s later it tries the host again, asks the job
    # to stop at its next synchronised update, and relaunches it on all 3 slots.
    job = OpenMPIElasticJob(tmp_path / "run", "localhost:3", 24 * 3 * STEP_FRAMES, rejoin_after=5)
    job.wait_for(r"update=4 ", 120)
    victim = job.rank_pid(1)
    os.kill(victim, signal.SIGKILL)
    t_kill = time.monotonic()
    job.wait_until(lambda: any("went on in place" in line for line in job.lines),
                   "the supervisor's in-place line", 120)
    to_in_place = time.monotonic() - t_kill
    assert job.result(300) == 0, job.output
    said = "\n".join(job.lines)
    assert re.search(r"elastic \[.*\]: the job went on in place without rank 1 \(localhost\)", said), said
    log = job.log()
    assert re.search(rf"lost rank 1 \(host [^,]+, pid {victim}\): continuing in place on 2 ranks", log), log[-3000:]
    assert "localhost rejoined" in log, log[-3000:]
    launches = assert_counters_exact(log, step_frames=STEP_FRAMES, total=job.total)
    assert [(item["world"], bool(item.get("in_place"))) for item in launches] == \
        [(3, False), (2, True), (3, False)], launches
    # only the rejoin relaunched (the supervisor's own lines; the job's log repeats them)
    assert [line for line in job.lines if line.startswith("elastic [") and "relaunching on" in line] \
        == [line for line in job.lines if line.startswith("elastic [") and "rejoined" in line], said
    assert "replicas identical on all 3 ranks" in log
    rejoin = re.search(r"first update on 3 ranks ([\d.]+) s after the job stopped for them", log)
    # docs/results/faults.md's row (run with -s)
    print(f"\n| Open MPI, a rank killed | 3 -> 2 in place -> 3 | {to_in_place:.1f} (the supervisor "
          f"read the in-place record) | 0 | {rejoin.group(1) if rejoin else '-'} |")


def test_after_a_loss_in_place_a_stopped_rank_0_is_found_by_its_heartbeat_and_the_last_goes_on(
        tmp_path):
    # ULFM reports dead processes, not stopped ones. Rank 2 is killed first: the job goes on in
    # place on 2 ranks, renumbered. Then rank 0 (the log, the checkpoints, the run lock) is
    # SIGSTOPped. Its heartbeat stops; the supervisor's verdict (--dead-after 10 s, the default)
    # names launch rank 0, which the survivor finds by host and pid in its new numbering: it
    # saves the last synchronised state and records the loss, the supervisor ends the launch (the
    # stopped process with it) and relaunches on the one slot left.
    job = OpenMPIElasticJob(tmp_path / "run", "localhost:3", 12 * 3 * STEP_FRAMES)
    job.wait_for(r"update=4 ", 120)
    os.kill(job.rank_pid(2), signal.SIGKILL)
    job.wait_until(lambda: any("went on in place" in line for line in job.lines),
                   "the supervisor's in-place line", 120)
    victim = job.rank_pid(0)
    with stopped(victim) as t_stop:
        job.wait_for(r"first update on 1 rank ", 240)
        to_first = time.time() - t_stop
        assert job.result(240) == 0, job.output
    said = "\n".join(job.lines)
    assert re.search(rf"rank 0 \(host \S+, pid {victim}\): no heartbeat for 10 s", said), said
    log = job.log()
    assert re.search(r"elastic: lost rank 0 \(localhost; dead: no heartbeat .*\(found by rank 1\); "
                     r"the survivors saved update \d+", log), log[-3000:]
    launches = assert_counters_exact(log, step_frames=STEP_FRAMES, total=job.total)
    assert [(item["world"], bool(item.get("in_place"))) for item in launches] == \
        [(3, False), (2, True), (1, False)], launches
    assert to_first < 60  # the heartbeat decided (10 s), not averaging.timeout (60 s)
    print(f"\n| Open MPI, rank 0 SIGSTOPped after a loss in place | 3 -> 2 in place -> 1 "
          f"(relaunch) | {to_first:.1f} | {launches[1]['end'][0] - launches[2]['start'][0]} | - |")
