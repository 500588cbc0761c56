"""Faults a user meets on one process: damaged checkpoints, diverged models, config mistakes, a
full disk, a second run on the same folder, Ctrl-C. Each ends in one line naming what was wrong and
what to do (no traceback), a non-zero exit, the reason in log.txt, and the run's good checkpoints
intact. The multi-rank faults are in test_faults_mpi.py; docs/faults.md has the table."""
from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from in_process import run_here
from mpi_launch import REPO, mpi_env
from wagma_rl.job.checkpoint import CheckpointError, CheckpointManager, load_checkpoint
from wagma_rl.bounded_comm import BoundedComm
from wagma_rl.job.exits import describe_failure
from wagma_rl.optim.finite import NonFiniteError, is_finite
from wagma_rl.job.runlock import RunLock, RunLocked

QUICK = "configs/quick_pointnav.yaml"




def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python run_ddppo.py ARGS`` as a user runs it (one process)."""
    return subprocess.run([sys.executable, "run_ddppo.py", *map(str, args)], cwd=REPO, env=mpi_env(150),
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished one-process run with three checkpoints (frames 128, 192, 256)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    proc = run_cli("--config", QUICK, f"run.dir={run_dir}", "run.total_frames=256")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(CheckpointManager(run_dir).all()) == 3
    return run_dir


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(finished_run, dst)
    (dst / "log.txt").write_text("")
    return dst


# ------------------------------------------------------------------------- damaged checkpoints
def _truncate(path: Path) -> str:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return "truncated"


def _garbage(path: Path) -> str:
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    return "cannot be read"


def _bitflip(path: Path) -> str:
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    return "checksum mismatch"


@pytest.mark.parametrize("damage", [_truncate, _garbage, _bitflip], ids=["truncated", "garbage", "bitflip"])
def test_resume_skips_a_damaged_newest_checkpoint_naming_it(run_copy, damage, capsys):
    mgr = CheckpointManager(run_copy)
    newest, previous = mgr.all()[-1], mgr.all()[-2]
    why = damage(newest)
    proc = run_here(capsys, "--resume", run_copy, "run.total_frames=288")
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (run_copy / "log.txt").read_text()
    assert f"skipped checkpoint: checkpoint {str(newest)!r}" in log and why in log
    assert f"resumed from {previous}" in log


def test_resume_with_no_checkpoint_that_verifies_is_one_message(run_copy, capsys):
    for path in CheckpointManager(run_copy).all():
        _truncate(path)
    log = (run_copy / "log.txt").read_text()
    proc = run_here(capsys, "--resume", run_copy)
    assert_one_line_error(proc, 2, "none of its 3 checkpoints verifies")
    assert (run_copy / "log.txt").read_text() == log  # a refused start: the log as it was


def test_a_checkpoint_with_nonfinite_weights_is_never_written(tmp_path):
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(CheckpointError, match=r"non-finite values .* in model\.w"):
        mgr.save({"model": {"w": torch.tensor([1.0, float("nan")])}}, step=1)
    assert mgr.all() == []


def test_a_checkpoint_from_before_checksums_still_loads(tmp_path):
    path = tmp_path / "ckpt_000000000001.pt"
    torch.save({"update": 3}, path)
    assert load_checkpoint(path)["update"] == 3


def test_a_diverged_model_stops_the_run_and_keeps_the_last_good_checkpoint(run_copy, capsys):
    mgr = CheckpointManager(run_copy)
    before = {p.name: p.read_bytes() for p in mgr.all()}
    proc = run_here(capsys, "--resume", run_copy, "ppo.lr=1e12", "run.total_frames=2000")
    assert_one_line_error(proc, 4, "non-finite values", "Lower the learning rate")
    assert {p.name: p.read_bytes() for p in mgr.all()} == before
    assert "stopped: non-finite values" in (run_copy / "log.txt").read_text()


@pytest.mark.parametrize("override, named", [("averaging.name=allreduce", "averaging.name=wagma"),
                                             ("policy.hidden_size=64", "policy.hidden_size=32")])
def test_resuming_with_another_mode_or_model_is_one_message(run_copy, override, named, capsys):
    proc = run_here(capsys, "--resume", run_copy, override)
    assert_one_line_error(proc, 2, named, "start a new run")


# ----------------------------------------------------------------------------- config mistakes
@pytest.mark.parametrize("override, named", [
    ("ppo.lr=-0.001", "ppo.lr"), ("policy.hidden_size=0", "policy.hidden_size"),
    ("run.device=tpu", "run.device"), ("env.options={bogus_option: 1}", "bogus_option")])
def test_a_config_mistake_is_one_line_naming_the_key(tmp_path, override, named, capsys):
    proc = run_here(capsys, "--config", QUICK, f"run.dir={tmp_path / 'r'}", override)
    assert_one_line_error(proc, 2, named)


def test_an_unwritable_run_folder_is_one_line_naming_it(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    proc = run_here(capsys, "--config", QUICK, f"run.dir={blocker / 'run'}")
    assert_one_line_error(proc, 2, str(blocker / "run"), "run.dir")


def test_resume_of_a_missing_folder_names_that_folder(tmp_path, capsys):
    missing = tmp_path / "no_such_run"
    proc = run_here(capsys, "--resume", missing)
    assert_one_line_error(proc, 2, f"--resume {str(missing)!r}: no such run folder")


def test_a_broken_eval_episodes_file_is_one_line_naming_it(finished_run, tmp_path, capsys):
    bad = tmp_path / "episodes.json.gz"
    bad.write_bytes(gzip.compress(b'{"episodes": [{"id": 1}]'))
    proc = run_here(capsys, "--eval", "--checkpoint", CheckpointManager(finished_run).latest(),
                   f"eval.episodes={bad}")
    assert_one_line_error(proc, 2, str(bad), "not a Habitat episode file")


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 384 KiB file system (mounted as root; skipped elsewhere): the first checkpoint fills it."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("full-disk test needs root to mount a small tmpfs")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=384k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_disk_is_one_line_and_the_run_stops(small_tmpfs, capsys):
    run_dir = small_tmpfs / "run"
    proc = run_here(capsys, "--config", QUICK, f"run.dir={run_dir}", "run.tensorboard=false")
    assert_one_line_error(proc, 2, "No space left on device", "free space")


# ------------------------------------------------------------------------- one run per folder
def test_a_second_run_on_the_same_folder_is_refused_naming_the_holder(tmp_path):
    with RunLock(tmp_path / "run"):  # held by this process: the second run is another one
        proc = run_cli("--config", QUICK, f"run.dir={tmp_path / 'run'}")
    assert_one_line_error(proc, 2, "in use by another run", f"pid {os.getpid()}")
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_lock_left_by_a_dead_run_is_taken_over(tmp_path):
    lock = RunLock(tmp_path)
    lock.path.parent.mkdir(parents=True, exist_ok=True)
    lock.path.write_text('{"host": "gone", "pid": 999999, "started": "yesterday"}\n')
    with lock:
        assert lock.stale == {"host": "gone", "pid": 999999, "started": "yesterday"}
        with pytest.raises(RunLocked, match=f"pid {os.getpid()}"):
            RunLock(tmp_path).acquire()
    RunLock(tmp_path).acquire().release()  # released: free again


def test_a_lost_rank_that_still_holds_the_lock_on_this_host_is_ended_and_no_one_else(tmp_path):
    """Job.shrink's fence (wagma_rl.job.lifecycle): the lock's holder is ended only when it is
    one of the lost ranks and on this host; a live holder that was not lost, or one on another
    host, is left alone. (The multi-rank case: test_openmpi.py's stopped rank 0.)"""
    import socket
    from wagma_rl.bounded_comm import Peer
    from wagma_rl.job.lifecycle import _end_lost_holder
    stopped = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        here = {"host": socket.gethostname(), "pid": stopped.pid}
        lost = (Peer(0, "n0", stopped.pid),)
        assert _end_lost_holder(dict(here, host="elsewhere"), lost) is None
        assert _end_lost_holder(here, (Peer(0, "n0", os.getpid() + 1_000_000),)) is None
        assert stopped.poll() is None  # untouched so far
        assert _end_lost_holder(here, lost) == lost[0]
        assert stopped.wait(timeout=10) == -signal.SIGKILL
    finally:
        stopped.kill()
        stopped.wait()


# ------------------------------------------------------------------------------------ Ctrl-C
def _start_long_run(run_dir: Path) -> subprocess.Popen:
    # Slow steps (0.8 s per update) leave time between two Ctrl-C before the next synced update.
    return subprocess.Popen([sys.executable, "run_ddppo.py", "--config", QUICK, f"run.dir={run_dir}",
                             "run.total_frames=1000000", "heterogeneity.stall_s=0.05",
                             "heterogeneity.stall_prob=1.0"], cwd=REPO, env=mpi_env(150),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_checkpoint(proc, run_dir: Path, timeout: float = 120) -> None:
    mgr = CheckpointManager(run_dir)
    deadline = time.monotonic() + timeout
    while mgr.latest() is None:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.2)


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start_long_run(run_dir)
    _wait_for_checkpoint(proc, run_dir)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert "Ctrl-C: saving a checkpoint" in out
    assert "stopped by signal" in (run_dir / "log.txt").read_text()
    assert load_checkpoint(CheckpointManager(run_dir).latest())["update"] >= 1


def test_a_second_ctrl_c_exits_at_once_with_one_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start_long_run(run_dir)
    _wait_for_checkpoint(proc, run_dir)
    proc.send_signal(signal.SIGINT)
    for line in proc.stdout:  # the first one was taken (two at once would arrive as one)
        if line.startswith("Ctrl-C"):
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert "second Ctrl-C" in err
    assert "stopped: interrupted" in (run_dir / "log.txt").read_text()


# ------------------------------------------------------------------------------ building blocks
def test_is_finite_finds_one_nan_or_inf_and_accepts_an_overflowing_sum():
    x = torch.zeros(1000)
    assert is_finite(x)
    x[500] = float("nan")
    assert not is_finite(x)
    x[500] = float("-inf")
    assert not is_finite(x.numpy())
    assert is_finite(torch.full((10,), 3e38))  # the sum overflows; every value is finite


def test_nonfinite_error_names_ranks_and_step():
    exc = NonFiniteError([1, 3], 17, "gradients")
    assert exc.ranks == (1, 3) and exc.step == 17
    assert "gradients of rank(s) 1, 3 at step 17" in str(exc)
    assert describe_failure(exc)[0] == "nonfinite"


def test_deadline_on_one_rank_knows_its_host_and_pid():
    from mpi4py import MPI
    deadline = BoundedComm(MPI.COMM_SELF, timeout=5)
    assert deadline.peers[0].pid == os.getpid() and deadline.peers[0].rank == 0
    a = np.arange(4, dtype=np.float32)
    deadline.allreduce(a)
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert deadline.allgather_obj({"x": 1}) == [{"x": 1}] and deadline.bcast_obj("y") == "y"
    deadline.free()
    with pytest.raises(ValueError, match="timeout"):
        BoundedComm(MPI.COMM_SELF, timeout=0)


def test_the_collective_refuses_a_nonfinite_buffer_when_asked_and_stays_usable():
    from mpi4py import MPI
    from native_coll import WaitAvoidingAllreduce
    buf = np.ones(8, dtype=np.float32)
    with WaitAvoidingAllreduce(MPI.COMM_SELF, buf, group_size=1, sync_period=2) as wa:
        buf[3] = np.inf
        with pytest.raises(FloatingPointError, match="not contributed to iteration 0"):
            wa.allreduce(late="merge", check_finite=True)
        assert wa.iteration == 0
        buf[3] = 1.0
        assert wa.allreduce(late="merge", check_finite=True).iteration == 0 and buf.tolist() == [1.0] * 8


def test_a_lock_taken_over_is_logged_as_host_pid_and_start_not_as_a_dict(tmp_path):
    from wagma_rl.config import load_config
    from wagma_rl.rl.config import DDPPOConfig
    from wagma_rl.rl.trainer import train

    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text('{"host": "gone", "pid": 999999, "started": "yesterday"}\n')
    cfg = load_config(DDPPOConfig, REPO / "configs" / "quick_pointnav.yaml",
                      [f"run.dir={run}", "run.total_frames=32"])
    train(cfg)
    log = (run / "log.txt").read_text()
    assert ("took over the lock of a run that ended without releasing it (host gone, pid 999999, "
            "started yesterday)") in log
    assert "{" not in log.split("took over the lock")[1].splitlines()[0]
