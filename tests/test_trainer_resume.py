"""Resuming a run folder as a user does with run_ddppo.py: a refused resume leaves the folder as
it was, so the plain resume that follows still works."""
from __future__ import annotations

import subprocess
import sys

from in_process import run_here
from mpi_launch import REPO, mpi_env

QUICK = "configs/quick_pointnav.yaml"


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, "run_ddppo.py", *args], cwd=REPO, env=mpi_env(150),
                          capture_output=True, text=True, timeout=timeout)


def test_a_refused_resume_leaves_the_run_folder_as_it_was(tmp_path, capsys):
    run_dir = tmp_path / "run"
    first = _run("--config", QUICK, f"run.dir={run_dir}", "run.total_frames=128")
    assert first.returncode == 0, first.stderr[-2000:]
    saved = (run_dir / "config.yaml").read_text()
    refused = run_here(capsys, "--resume", run_dir, "policy.hidden_size=64", "run.total_frames=256")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert (run_dir / "config.yaml").read_text() == saved
    again = _run("--resume", str(run_dir), "run.total_frames=256")
    assert again.returncode == 0, again.stderr[-2000:]
