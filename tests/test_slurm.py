"""SLURM as users run it: a real slurmctld and slurmd on this machine (started by
cluster/slurm/up.sh) run scripts/slurm/train.sbatch as written.

- ranks started by ``srun --mpi=pmi2`` form one MPI world (an allreduce over them is exact);
- the sbatch job trains to completion;
- ``--signal=USR1@N`` makes the run save a checkpoint and requeue its job, and the requeued job
  resumes from that checkpoint and ends with the uninterrupted run's update and frame counters;
- ``scancel`` makes the run save a checkpoint and exit cleanly.

The cluster needs root (up.sh installs Debian's slurm-wlm and munge with apt-get when they are
missing and starts the daemons); where it cannot be had, these tests skip and say why.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mpi_launch import REPO
from native_coll.mpiinfo import openmpi_env
from openmpi_launch import OVENV, openmpi_missing
from run_log import assert_counters_exact
from wagma_rl.job.checkpoint import CheckpointManager, load_checkpoint
from wagma_rl.config import load_config
from wagma_rl.job.launch import launch_problem
from wagma_rl.rl.config import DDPPOConfig
from wagma_rl.job.signals import StopSignals

UP = REPO / "cluster" / "slurm" / "up.sh"
DOWN = REPO / "cluster" / "slurm" / "down.sh"
SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
ELASTIC_SBATCH = REPO / "scripts" / "slurm" / "train_elastic.sbatch"
QUICK = "configs/quick_pointnav.yaml"

# The training jobs: the quick config on 2 ranks whose every environment step sleeps 0.1 s, so a
# run lasts about a minute of wall time on little CPU: long enough for SLURM's warning signal,
# which slurmctld sends at its 30-second timer, to land mid-run.
RANKS = 2
UPDATES = 30
_quick = load_config(DDPPOConfig, REPO / QUICK)
# Every rollout is full in wagma mode, so every update adds the same frames.
FRAMES_PER_UPDATE = _quick.ppo.num_steps * _quick.env.num_envs * RANKS
FRAMES = UPDATES * FRAMES_PER_UPDATE
TRAIN_ARGS = ["--config", QUICK, f"run.total_frames={FRAMES}", "heterogeneity.stall_s=0.1",
              "heterogeneity.stall_prob=1.0"]
# sbatch options override the file's #SBATCH lines (2 nodes x 8 ranks) to fit the test node.
RESOURCES = ["--nodes=1", f"--ntasks={RANKS}", f"--ntasks-per-node={RANKS}", "--cpus-per-task=1"]
# --time=3 --signal=USR1@130: slurmctld sends the signal at its first 30-s tick at least
# 3 min - 130 s - 30 s = 20 s into the job, so 20-50 s in: after the ranks have installed their
# handlers (at 10 s, as --time=2 --signal=USR1@80 allowed, a CI run's ranks were not up yet and
# died of the signal) and before the run ends (30 updates of 16 steps stalled 0.1 s each: 48 s
# of stalls alone).
USR1_OPTIONS = ["--time=3", "--signal=USR1@130"]
FINAL_STATES = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


class Slurm:
    """Commands against the test cluster (its SLURM_CONF; this venv's python first on PATH, as an
    activated environment has it, so the jobs' ``python`` is this one)."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.env = dict(os.environ)
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        self.env.update(SLURM_CONF=str(state_dir / "etc" / "slurm.conf"), PYTHONUNBUFFERED="1",
                        OMP_NUM_THREADS="1", PATH=path)

    def run(self, *argv: str, timeout: float = 60.0,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run(argv, env={**self.env, **(env or {})}, cwd=REPO,
                              capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}"
        return proc

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...)."""
        line = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", line))

    def logs(self) -> str:
        """The daemons' last log lines, for failure messages."""
        out = []
        for name in ("slurmctld", "slurmd"):
            path = self.state_dir / "log" / f"{name}.log"
            lines = path.read_text(errors="replace").splitlines()[-15:] if path.exists() else []
            out.append(f"--- {name}.log (last lines)\n" + "\n".join(lines))
        return "\n".join(out)


class Job:
    """One submission of scripts/slurm/train.sbatch, its output file and run folder."""

    def __init__(self, slurm: Slurm, base: Path, name: str, *options: str, script: Path = SBATCH,
                 env: dict[str, str] | None = None, train_args: list[str] = TRAIN_ARGS):
        self.slurm, self.name = slurm, name
        self.run_dir = base / name
        self.out = base / f"{name}.out"
        self.id = slurm.run("sbatch", "--parsable", f"--job-name={name}", f"--output={self.out}",
                            f"--chdir={REPO}", *RESOURCES, *options, str(script), *train_args,
                            f"run.dir={self.run_dir}", env=env).stdout.strip().split(";")[0]

    def log(self) -> str:
        path = self.run_dir / "log.txt"
        return path.read_text() if path.exists() else ""

    def describe(self) -> str:
        out = self.out.read_text(errors="replace") if self.out.exists() else "(no output file)"
        return (f"job {self.name} ({self.id}): {self.slurm.job(self.id)}\n"
                f"--- output\n{out[-4000:]}\n{self.slurm.logs()}")

    def wait(self, done, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n"
                             f"{self.describe()}")

    def wait_end(self, timeout: float) -> dict[str, str]:
        """Wait until the job has ended for good; return its scontrol fields."""
        self.wait(lambda: self.slurm.job(self.id)["JobState"] in FINAL_STATES,
                  f"job {self.name} to end", timeout)
        return self.slurm.job(self.id)

    def final_counters(self) -> tuple[int, int]:
        """(update, frames) of the run's newest checkpoint."""
        latest = CheckpointManager(self.run_dir).latest()
        assert latest is not None, f"no checkpoint in {self.run_dir}\n{self.describe()}"
        state = load_checkpoint(latest)
        return int(state["update"]), int(state["frames"])


def _give_requeued_job_time(slurm: Slurm, job: Job, stop: threading.Event) -> None:
    """Once the job has been requeued, raise its time limit: the resumed allocation then runs to
    the end, as a job whose remaining work fits in one allocation does (with the test's 3-minute
    limit it would get the warning signal again 20-50 s in and requeue once more)."""
    while not stop.is_set():
        info = slurm.job(job.id)
        if int(info.get("Restarts", "0")) >= 1:
            slurm.run("scontrol", "update", f"JobId={job.id}", "TimeLimit=10")
            return
        if info["JobState"] in FINAL_STATES:
            return
        time.sleep(0.25)


def _ranks(job: Job, launchers: bytes) -> list[int]:
    """The pids of ``job``'s ranks (not its launcher's or supervisor's processes)."""
    return [int(p) for p in subprocess.run(["pgrep", "-f", f"run_ddppo.py .*run.dir={job.run_dir}"],
                                           capture_output=True, text=True).stdout.split()
            if not re.search(launchers, Path(f"/proc/{p}/cmdline").read_bytes())]


def _kill_a_rank_once_training(job: Job, launchers: bytes) -> threading.Thread:
    """A thread that SIGKILLs one of ``job``'s ranks once its first checkpoint is logged (from
    the fixture: the test that checks the outcome comes after the others', when the job may be
    done); ``job.killed`` gets the ranks it saw."""
    job.killed = []

    def kill() -> None:
        end = time.monotonic() + 300
        while time.monotonic() < end and "checkpoint " not in job.log():
            time.sleep(0.2)
        job.killed = _ranks(job, launchers)
        if job.killed:
            os.kill(max(job.killed), signal.SIGKILL)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A one-node cluster (10 CPUs declared, so the five 2-rank jobs of ``runs`` run side by side),
    torn down at the end of the session."""
    if os.geteuid() != 0:
        pytest.skip("SLURM tests need root: cluster/slurm/up.sh installs slurm-wlm/munge and "
                    "starts slurmd (run make test as root)")
    state = tmp_path_factory.mktemp("slurm")
    proc = subprocess.run(["bash", str(UP), str(state)], capture_output=True, text=True,
                          env={**os.environ, "WAGMA_SLURM_CPUS": "10"}, timeout=900)
    if proc.returncode == 3:
        pytest.skip(f"SLURM tests skipped: {proc.stderr.strip().splitlines()[-1]}")
    if proc.returncode != 0:
        pytest.fail(f"cluster/slurm/up.sh failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    yield Slurm(state)
    pids = {name: int((state / "run" / f"{name}.pid").read_text())
            for name in ("munged", "slurmctld", "slurmd")}
    down = subprocess.run(["bash", str(DOWN), str(state)], capture_output=True, text=True,
                          timeout=300)
    assert down.returncode == 0, down.stderr
    assert not state.exists() and not [n for n, p in pids.items() if Path(f"/proc/{p}").exists()]


ELASTIC_UPDATES = 40


@pytest.fixture(scope="module")
def runs(slurm, tmp_path_factory):
    """The five training jobs (2 CPUs each of the node's 10), side by side rather than one test
    after another: uninterrupted, warned by --signal=USR1@N, the one the scancel test cancels,
    submitted together; then, once they train, the two elastic jobs that lose a rank, through
    srun and through Open MPI's mpirun (their start-up would slow the others', and the usr1
    job's ranks must be up before SLURM's warning comes)."""
    base = tmp_path_factory.mktemp("slurm_runs")
    jobs = {"uninterrupted": Job(slurm, base, "uninterrupted"),
            "usr1": Job(slurm, base, "usr1", *USR1_OPTIONS),
            # (a budget it never reaches: on a loaded machine the jobs' starts took so long that
            # the scancel job had finished its 30 updates before the test could cancel it)
            "scancel": Job(slurm, base, "scancel",
                           train_args=[*TRAIN_ARGS, f"run.total_frames={10 * FRAMES}"])}
    stop = threading.Event()
    watcher = threading.Thread(target=_give_requeued_job_time, args=(slurm, jobs["usr1"], stop),
                               daemon=True)
    watcher.start()
    for job in jobs.values():
        job.wait(lambda job=job: "update=" in job.log()
                 or slurm.job(job.id)["JobState"] in FINAL_STATES,
                 f"job {job.name}'s first update", timeout=300)
    jobs["elastic"] = Job(slurm, base, "elastic", script=ELASTIC_SBATCH,
                          env={"ELASTIC_ARGS": "--rejoin-after 10 --probe-timeout 30"},
                          train_args=[*TRAIN_ARGS,
                                      f"run.total_frames={ELASTIC_UPDATES * FRAMES_PER_UPDATE}",
                                      # (a killed rank is met at once, by the MPI error; the
                                      # timeout only must not call a slow rank lost at load 10)
                                      "averaging.timeout=30", "run.log_interval=1"])
    if openmpi_missing() is None:
        env = openmpi_env({"PATH": f"{OVENV / 'bin'}{os.pathsep}{slurm.env['PATH']}",
                           "ELASTIC_LAUNCHER": f"{OVENV / 'bin' / 'mpirun'} --with-ft ulfm",
                           "ELASTIC_ARGS": "--rejoin-after 10 --probe-timeout 30"})
        jobs["openmpi_elastic"] = Job(slurm, base, "openmpi_elastic", script=ELASTIC_SBATCH, env=env,
                                      train_args=[*TRAIN_ARGS, "run.log_interval=1",
                                                  f"run.total_frames={ELASTIC_UPDATES * FRAMES_PER_UPDATE}"])
        _kill_a_rank_once_training(jobs["openmpi_elastic"], rb"mpirun|prterun|prted|wagma_rl.elastic")
    yield jobs
    stop.set()
    watcher.join(timeout=10)


# --------------------------------------------------------------------------- without a cluster
def test_srun_without_pmi_is_named_with_the_fix():
    env = {"SLURM_STEP_NUM_TASKS": "4"}
    assert "srun --mpi=pmi2" in launch_problem(1, env)
    assert launch_problem(4, env) is None  # the ranks found each other
    assert launch_problem(1, {}) is None  # not under srun
    assert launch_problem(1, {"SLURM_STEP_NUM_TASKS": "1"}) is None  # one task is a world of one


def test_a_run_that_asked_for_a_requeue_outlives_the_requeues_sigterm():
    # scontrol requeue SIGTERMs every rank; one killed before MPI_Finalize would leave MPICH's
    # shared-memory segment for the requeued job to hang on (the USR1 test below catches that).
    before = signal.getsignal(signal.SIGTERM)
    try:
        StopSignals().install().uninstall(ignore_term=True)
        os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        StopSignals().install().uninstall()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # put back as it found it
    finally:
        signal.signal(signal.SIGTERM, before)


def test_down_leaves_a_folder_that_up_did_not_make_alone(tmp_path):
    (tmp_path / "keep.txt").write_text("not a cluster")
    proc = subprocess.run(["bash", str(DOWN), str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr == (f"cluster/slurm/down.sh: error: {tmp_path} was not made by "
                           "cluster/slurm/up.sh (no .wagma-slurm in it); not touching it\n")
    assert (tmp_path / "keep.txt").exists()


# ------------------------------------------------------------------------------ on the cluster
def test_up_on_a_cluster_that_is_up_changes_nothing(slurm):
    pid_files = sorted((slurm.state_dir / "run").glob("*.pid"))
    before = [p.read_text() for p in pid_files]
    proc = subprocess.run(["bash", str(UP), str(slurm.state_dir)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "already up" in proc.stdout, proc.stderr
    assert [p.read_text() for p in pid_files] == before and len(before) == 3


def test_srun_pmi2_starts_ranks_that_form_one_world(slurm):
    code = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
            "print(c.Get_rank(), c.Get_size(), c.allreduce(c.Get_rank() + 1), flush=True)")
    out = slurm.run("srun", "--mpi=pmi2", "--ntasks=4", "python", "-c", code, timeout=300).stdout
    rows = sorted(tuple(map(int, line.split())) for line in out.split("\n") if line.strip())
    assert rows == [(r, 4, 1 + 2 + 3 + 4) for r in range(4)]


def test_srun_without_pmi_stops_with_one_line_naming_the_fix(slurm):
    proc = subprocess.run(["srun", "--mpi=none", "--ntasks=2", "python", "run_ddppo.py", "--config",
                           QUICK], env=slurm.env, cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("run_ddppo.py:")]
    assert errors == ["run_ddppo.py: error: srun started 2 tasks but MPI sees a world of 1 in "
                      "each: srun gave them no PMI that this MPI reads; launch with "
                      "'srun --mpi=pmi2' (see docs/cluster.md)"]


# The scancel test comes first of the four: its job must still be training when it is cancelled.
@pytest.mark.slow
def test_scancel_saves_a_checkpoint_and_exits_cleanly(slurm, runs):
    job = runs["scancel"]
    job.wait(lambda: "update=" in job.log(), "the scancel job's first update", timeout=600)
    slurm.run("scancel", job.id)
    info = job.wait_end(timeout=300)
    assert info["JobState"] == "CANCELLED", job.describe()
    log = job.log()
    assert "stopped by signal at update " in log, job.describe()
    done = re.findall(r"done: update (\d+), frames (\d+)", log)
    assert len(done) == 1
    update, frames = map(int, done[0])
    assert 0 < update < 10 * UPDATES
    assert job.final_counters() == (update, frames)
    out = job.out.read_text()
    # No rank failed or had to be killed (SLURM sends SIGKILL KillWait = 30 s after SIGTERM).
    assert "Killed" not in out and "exit code" not in out and "Traceback" not in out, job.describe()


# Second: the elastic job must still be training when its rank is killed (the two below only
# wait for their jobs' ends, by then mostly passed).
@pytest.mark.slow
def test_an_elastic_job_that_loses_a_rank_finishes_without_a_requeue(runs):
    total = ELASTIC_UPDATES * FRAMES_PER_UPDATE
    job = runs["elastic"]
    job.wait(lambda: "checkpoint " in job.log(), "a first checkpoint", timeout=300)
    ranks = _ranks(job, rb"srun|wagma_rl.elastic")
    assert len(ranks) == RANKS, (ranks, job.describe())
    os.kill(max(ranks), signal.SIGKILL)
    t_kill = time.time()
    info = job.wait_end(timeout=600)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0"), \
        job.describe()
    log = job.log()
    assert "elastic: " in log and "rejoined" in log, job.describe()
    launches = assert_counters_exact(log, step_frames=FRAMES_PER_UPDATE // RANKS, total=total)
    assert [item["world"] for item in launches] == [2, 1, 2], (launches, job.describe())
    assert "replicas identical on all 2 ranks" in log
    # docs/results/faults.md's row (run with -s): seconds from the kill to the first update on 1 rank, and
    # from the stop for the rejoin to the first update on 2.
    firsts = [(time.mktime(time.strptime(line[1:20], "%Y-%m-%d %H:%M:%S")), line)
              for line in log.splitlines() if "] first update on " in line]
    rejoin = re.search(r"([\d.]+) s after the job stopped", firsts[-1][1]).group(1)
    print(f"\n| a rank killed (SLURM, srun) | 2 -> 1 | {firsts[0][0] - t_kill:.0f} | "
          f"{launches[0]['end'][0] - launches[1]['start'][0]} | {float(rejoin):.0f} |")


@pytest.mark.slow
@pytest.mark.skipif(openmpi_missing() is not None, reason=str(openmpi_missing()))
def test_an_open_mpi_job_under_slurm_survives_a_lost_rank_in_place_and_takes_it_back(runs):
    """scripts/slurm/train_elastic.sbatch with ELASTIC_LAUNCHER=mpirun (the Open MPI venv's, ULFM
    on) in the allocation: a killed rank costs no relaunch (the survivor shrinks in place and the
    supervisor keeps the launch), the slot comes back at a rejoin, the allocation never requeues."""
    total = ELASTIC_UPDATES * FRAMES_PER_UPDATE
    job = runs["openmpi_elastic"]  # (a rank is killed by the fixture once it trains)
    info = job.wait_end(timeout=600)
    assert len(job.killed) == RANKS, (job.killed, job.describe())
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0"), \
        job.describe()
    log, out = job.log(), job.out.read_text(errors="replace")
    assert re.search(r"continuing in place on 1 rank\b", log), job.describe()
    assert "the job went on in place without rank" in out and "rejoined" in log, job.describe()
    launches = assert_counters_exact(log, step_frames=FRAMES_PER_UPDATE // RANKS, total=total)
    assert [(item["world"], bool(item.get("in_place"))) for item in launches] == \
        [(2, False), (1, True), (2, False)], (launches, job.describe())
    assert "replicas identical on all 2 ranks" in log


@pytest.mark.slow
def test_sbatch_job_trains_to_completion(runs):
    job = runs["uninterrupted"]
    info = job.wait_end(timeout=600)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0"), \
        job.describe()
    assert job.final_counters() == (UPDATES, FRAMES)
    assert job.log().splitlines()[-1].endswith(f"done: update {UPDATES}, frames {FRAMES}")


@pytest.mark.slow
def test_usr1_checkpoints_requeues_and_the_job_resumes_to_the_uninterrupted_end(runs):
    job = runs["usr1"]
    info = job.wait_end(timeout=900)
    assert (info["JobState"], info["Restarts"]) == ("COMPLETED", "1"), job.describe()
    lines = job.log().splitlines()
    # The first allocation saved, then requeued; the second resumed from exactly that checkpoint.
    asked = [i for i, line in enumerate(lines)
             if line.endswith(f"SIGUSR1: requeued SLURM job {job.id}")]
    resumed = [m.groups() for line in lines
               if (m := re.search(r"resumed from (\S+): update (\d+), frames (\d+)$", line))]
    assert len(asked) == 1 and len(resumed) == 1, job.describe()
    saved = [line.split(" checkpoint ")[1] for line in lines[:asked[0]] if " checkpoint " in line]
    path, update, frames = resumed[0]
    assert path == saved[-1]
    assert 0 < int(update) < UPDATES and int(frames) == int(update) * FRAMES_PER_UPDATE
    # ... and ended where the run that was never interrupted ended.
    runs["uninterrupted"].wait_end(timeout=600)
    assert job.final_counters() == runs["uninterrupted"].final_counters() == (UPDATES, FRAMES)
