"""A training run whose env worker dies or hangs (run_ddppo.py, envs in worker processes, the
embedded simulator): one line naming the env, its pid and its episode, no traceback, exit status
5 (wagma_rl.job.exits.EXIT_CODES["env"], which the elastic supervisor relaunches after); the
other ranks find that rank lost and save their state as for any lost rank."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpi_launch import REPO, mpi_env, mpiexec_path, python_pids
from wagma_rl.job.checkpoint import CheckpointManager, load_checkpoint
from wagma_rl.job.exits import EXIT_CODES

QUICK = "configs/quick_pointnav.yaml"
TIMEOUT = 8  # averaging.timeout: the pool's step timeout and the ranks' wait for each other


def _start(run_dir: Path, ranks: int) -> subprocess.Popen:
    # -disable-auto-cleanup, as the elastic supervisor launches: Hydra lets the other ranks run
    # on after one exits, so that they save their state.
    cmd = [mpiexec_path(), "-disable-auto-cleanup", "-n", str(ranks), sys.executable,
           "run_ddppo.py", "--config", QUICK, f"run.dir={run_dir}", "run.total_frames=1000000",
           "env.workers=process", f"averaging.timeout={TIMEOUT}"]
    return subprocess.Popen(cmd, cwd=REPO, env=mpi_env(150), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_for_checkpoint(proc: subprocess.Popen, run_dir: Path) -> None:
    mgr = CheckpointManager(run_dir)
    deadline = time.monotonic() + 120
    while mgr.latest() is None:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended ({proc.returncode}) before its first checkpoint:"
                                 f"\n{proc.stdout.read()[-4000:]}")
        if time.monotonic() > deadline:
            _end(proc)
            raise AssertionError(f"no checkpoint within 120 s:\n{proc.stdout.read()[-4000:]}")
        time.sleep(0.2)


def _workers(rank_pid: int) -> list[int]:
    """The env worker processes of a rank (its children running the pool's worker program)."""
    kids = []
    for listing in Path(f"/proc/{rank_pid}/task").glob("*/children"):
        kids += [int(p) for p in listing.read_text().split()]
    return sorted(p for p in kids if b"_exec_worker" in _cmdline(p))


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _running(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (not gone, not a zombie)."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out


def _end(proc: subprocess.Popen, timeout: float = 90) -> str:
    """The job's output once it ended (killed, with its output, past ``timeout``)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the job did not end within {timeout} s:\n{out[-6000:]}")
    return out


def _error_line(out: str, pattern: str) -> str:
    lines = [ln for ln in out.splitlines() if re.search(pattern, ln)]
    assert len(lines) == 1, out[-6000:]
    return lines[0]


@pytest.mark.mpi
@pytest.mark.slow
def test_a_killed_worker_is_one_line_exit_5_and_the_other_rank_saves_its_state(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, 2)
    _wait_for_checkpoint(proc, run_dir)
    rank_pid = python_pids(str(run_dir))[-1]
    workers = _workers(rank_pid)
    victim = workers[1]
    os.kill(victim, signal.SIGKILL)
    out = _end(proc)
    line = _error_line(out, r"run_ddppo\.py: error \(rank \d\): env 1 ")
    assert re.search(rf"env 1 \(pid {victim}, (in|after) episode '[^']+'\) died during step "
                     r"\(killed by SIGKILL\)", line), line
    assert "exit status 5" in line and "Traceback" not in out and "uncaught" not in out, out
    failed = int(re.search(r"rank (\d)", line).group(1))
    # The other rank found that rank lost after its timeout and saved the last synchronised update.
    other = _error_line(out, r"run_ddppo\.py: error \(rank \d\): .*survivors saved")
    assert f"rank {1 - failed}" in other, other
    ckpt = load_checkpoint(CheckpointManager(run_dir).latest())
    assert [r["rank"] for r in ckpt["lost"]["ranks"]] == [failed]
    assert proc.returncode != 0
    assert len(workers) == 2 and not python_pids(str(run_dir)) and not _running(workers)


@pytest.mark.slow
def test_a_hung_worker_is_one_line_naming_it_and_exit_5_with_no_worker_left(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, 1)
    _wait_for_checkpoint(proc, run_dir)
    rank_pid = python_pids(str(run_dir))[0]
    workers = _workers(rank_pid)
    os.kill(workers[0], signal.SIGSTOP)  # hung inside its simulator, as far as the pool can tell
    out = _end(proc)
    line = _error_line(out, r"run_ddppo\.py: error \(rank 0\): ")
    assert re.search(rf"env 0 \(pid {workers[0]}, (in|after) episode '[^']+'\) did not finish a "
                     rf"step within {TIMEOUT} s", line), line
    assert proc.returncode == EXIT_CODES["env"] == 5 and "Traceback" not in out, out
    log = (run_dir / "log.txt").read_text()
    assert re.search(rf"stopped: env 0 \(pid {workers[0]}, .*did not finish a step", log), \
        log[-2000:]
    assert len(workers) == 2 and not _running(workers) and not python_pids(str(run_dir))


def test_an_env_worker_error_is_kind_env_written_by_the_rank_that_met_it():
    from envs import EnvWorkerError
    from wagma_rl.job.exits import describe_failure, exit_code, failure_writer

    exc = EnvWorkerError("env 0 (pid 7, in episode 'a') died during step (exit code 1); the "
                         "environment pool is closed", env_ids=[0], pids=[7], episodes=["a"])
    kind, line = describe_failure(exc)
    assert kind == "env" and exit_code(kind) == 5 and "\n" not in line
    assert line.startswith(str(exc) + ". This rank stopped")
    assert failure_writer(exc, 3, 4)  # rank 3 alone knows of its worker
