"""Faults of a multi-rank job: a rank stopped (SIGSTOP) or stuck in env.step, a NaN in one
replica, a user's optimizer script in which one rank raises or produces NaN. The job never hangs:
it ends within averaging.timeout (the optimizers' timeout=), every surviving rank naming the rank
that did not answer (rank, host, pid), with no checkpoint written after the fault and nothing left
in /dev/shm. See docs/faults.md for the table."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mpi_launch import REPO, mpi_env, mpi_pytest, mpi_run, mpiexec_path, python_pids
from wagma_rl.job.checkpoint import CheckpointManager, load_checkpoint

pytestmark = pytest.mark.mpi

QUICK = "configs/quick_pointnav.yaml"
TIMEOUT = 5  # averaging.timeout of these runs (seconds)






def _shm_mappings(pid: int) -> set[str]:
    """The MPICH shared-memory files ``pid`` maps, as /proc shows them."""
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    return {line.split(None, 5)[5].strip() for line in text.splitlines()
            if "/dev/shm/mpich_shm" in line and len(line.split(None, 5)) == 6}


def _wait_checkpoint(proc: subprocess.Popen, run_dir: Path, timeout: float = 150) -> None:
    mgr = CheckpointManager(run_dir)
    deadline = time.monotonic() + timeout
    while mgr.latest() is None:
        if proc.poll() is not None:
            raise AssertionError(f"job ended ({proc.returncode}) early:\n{proc.communicate()[1][-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("no checkpoint in time")
        time.sleep(0.2)


def _finish(proc: subprocess.Popen, marker: str, limit: float) -> tuple[str, str, float]:
    """Wait for the job (at most ``limit`` s, else fail as a hang); return (stdout, stderr, seconds)."""
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        for pid in python_pids(marker):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        raise AssertionError("the job hung after the fault")
    leftover = python_pids(marker)
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"ranks left running: {leftover}"
    return out, err, time.monotonic() - t0


@pytest.mark.parametrize("nprocs", [2, 3])
def test_bounded_collectives(nprocs):
    mpi_pytest(nprocs, "tests/mpi/fault_deadline_cases.py", timeout=90)


def test_a_stopped_rank_ends_the_job_naming_it_without_a_new_checkpoint_or_shm_files(tmp_path):
    run_dir = tmp_path / "sigstop"
    proc = subprocess.Popen([mpiexec_path(), "-n", "2", sys.executable, "run_ddppo.py", "--config",
                             QUICK, f"run.dir={run_dir}", "run.total_frames=1000000",
                             f"averaging.timeout={TIMEOUT}"], cwd=REPO, env=mpi_env(150),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_checkpoint(proc, run_dir)
    pids = python_pids(str(run_dir))
    assert len(pids) == 2, pids
    # The segment's name is already gone while the job runs (unlinked after start-up)...
    segments = set().union(*(_shm_mappings(p) for p in pids))
    assert segments and all(s.endswith("(deleted)") for s in segments), segments
    victim = pids[1]
    os.kill(victim, signal.SIGSTOP)
    ckpts_at_stop = {p.name for p in CheckpointManager(run_dir).all()}
    out, err, took = _finish(proc, str(run_dir), limit=TIMEOUT + 60)
    print(f"stopped rank detected and job ended in {took:.1f} s")
    assert proc.returncode == 3, err[-3000:]
    assert f"pid {victim})" in err and "did not answer" in err and "Traceback" not in err, err[-3000:]
    log = (run_dir / "log.txt").read_text()
    assert "stopped: " in log and f"pid {victim}" in log.splitlines()[-1]
    after = CheckpointManager(run_dir).all()
    # Rank 0 may still be writing the checkpoint of the last sync point both ranks completed when
    # the victim stops (it verifies and is one checkpoint interval on: 2 updates x 2 ranks x 2
    # envs x 16 steps = 128 frames); anything later would come from a mixed state.
    new = sorted({p.name for p in after} - ckpts_at_stop)
    last_at_stop = max(int(n[5:17]) for n in ckpts_at_stop)
    assert new in ([], [f"ckpt_{last_at_stop + 128:012d}.pt"]), (sorted(ckpts_at_stop), new)
    assert load_checkpoint(after[-1])["frames"] > 0
    # ... so nothing is left in /dev/shm after this abnormal end.
    for s in segments:
        assert not Path(s.replace(" (deleted)", "")).exists()


def test_a_rank_stuck_in_env_step_ends_the_job_naming_it(tmp_path):
    run_dir = tmp_path / "stuck"
    t0 = time.monotonic()
    proc = mpi_run(2, ["tests/mpi/fault_run.py", "stuck_env", "1", "40", "--", "--config", QUICK,
                       f"run.dir={run_dir}", "run.total_frames=1000000", "averaging.name=preempt",
                       f"averaging.timeout={TIMEOUT}"], timeout=120)
    print(f"stuck rank: job ended {time.monotonic() - t0:.1f} s after launch")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "rank 1 (host" in proc.stderr and "did not answer" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "stopped: " in (run_dir / "log.txt").read_text()


def test_a_nan_in_one_replica_stops_every_rank_with_one_message(tmp_path):
    run_dir = tmp_path / "nan"
    proc = mpi_run(2, ["tests/mpi/fault_run.py", "nan", "1", "70", "--", "--config", QUICK,
                       f"run.dir={run_dir}", "run.total_frames=1000000",
                       f"averaging.timeout={TIMEOUT}"], timeout=120)
    assert proc.returncode == 4, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "non-finite values" in errors[0] and "rank(s) 1 " in errors[0], \
        proc.stderr[-3000:]
    assert "stopped: non-finite values" in (run_dir / "log.txt").read_text()
    for path in CheckpointManager(run_dir).all():  # every checkpoint kept is finite
        model = load_checkpoint(path)["model"]
        assert all(bool(torch.isfinite(v).all()) for v in model.values())


def _script(cases: list[str], fault: str) -> dict[tuple[str, int], str]:
    """tests/mpi/fault_optim_script.py at 2 ranks: each case's RESULT line by (case, rank)."""
    proc = mpi_run(2, ["tests/mpi/fault_optim_script.py", ",".join(cases), fault],
                   timeout=60 + 10 * len(cases))
    results = {}
    # Split on the marker, not on lines: two ranks' lines can reach mpiexec's stdout unseparated.
    for part in proc.stdout.split("RESULT rank=")[1:]:
        rank, case = part.split()[:2]
        results[(case.removeprefix("case="), int(rank))] = "RESULT rank=" + part.split("\n")[0]
    assert sorted(results) == sorted((c, r) for c in cases for r in (0, 1)), \
        proc.stdout[-3000:] + proc.stderr[-3000:]
    return results


OPTIMIZERS = ["allreduce", "allreduce_node", "local_sgd", "dpsgd", "wagma", "nonblocking",
              "nonblocking_dpsgd"]
DROP = ["allreduce", "allreduce_node", "wagma"]


@pytest.fixture(scope="module")
def nan_results():
    """Every NaN case in one 2-rank launch: they end cleanly, every rank agreeing, so one job runs
    them one after another (a launch of each cost ~9 CPU-s, mostly start-up). Each case's RESULT
    line by (case, rank); a case is ``OPTIMIZER`` (nonfinite="raise") or ``OPTIMIZER:drop``."""
    return _script(OPTIMIZERS + [f"{o}:drop" for o in DROP], "nan")


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_rank_raising_in_a_user_script_does_not_hang_the_others(optimizer):
    results = _script([optimizer], "raise")
    assert "RuntimeError" in results[(optimizer, 1)]
    survivor = results[(optimizer, 0)]
    assert "PeerTimeout ranks=[1]" in survivor and "rank 1 (host" in survivor, survivor


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_nan_on_one_rank_raises_the_same_error_on_every_rank(optimizer, nan_results):
    lines = [nan_results[(optimizer, rank)] for rank in (0, 1)]
    for line in lines:
        assert "NonFiniteError ranks=[1]" in line, line
    assert lines[0].split("msg=")[1] == lines[1].split("msg=")[1]


@pytest.mark.parametrize("optimizer", DROP)
def test_drop_leaves_the_nan_out_and_training_goes_on(optimizer, nan_results):
    lines = [nan_results[(f"{optimizer}:drop", rank)] for rank in (0, 1)]
    for line in lines:
        assert "finished finite=True" in line, line
    assert "dropped=1" in lines[1]
