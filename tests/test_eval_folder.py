"""run_ddppo.py --eval --checkpoint RUN_DIR --all-checkpoints: every checkpoint of a run folder,
oldest first, one row each (as habitat-baselines evaluates a checkpoint folder), with every
measure the env reports in the rows, the JSON results and TensorBoard."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from mpi_launch import REPO
from wagma_rl.job.checkpoint import CheckpointManager, load_checkpoint
from wagma_rl.job.tblog import read_scalars

QUICK = "configs/quick_pointnav.yaml"


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run_ddppo.py", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("evalfolder") / "run"
    proc = _run("--config", QUICK, f"run.dir={run_dir}", "run.total_frames=320")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_every_checkpoint_of_the_folder_gets_one_row_oldest_first(trained):
    proc = _run("--eval", "--checkpoint", str(trained), "--all-checkpoints",
                "eval.num_episodes=2", "eval.num_envs=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpts = CheckpointManager(trained).all()
    assert len(ckpts) >= 2
    table = trained / "eval_val_sampled_2ep.csv"
    rows = list(csv.DictReader(table.open()))
    assert [r["checkpoint"] for r in rows] == [p.name for p in ckpts]
    assert [int(r["frames"]) for r in rows] == [load_checkpoint(p)["frames"] for p in ckpts]
    assert all(r["episodes"] == "2" for r in rows)
    for r, path in zip(rows, ckpts):
        result = json.loads((trained / f"eval_{path.stem}_val_sampled_2ep.json").read_text())
        assert r["spl"] == f"{result['spl']:.6g}"
        # the embedded simulator's other measure reaches the row, the JSON and TensorBoard
        assert r["path_length"] == f"{result['measures']['path_length']:.6g}"
    events = read_scalars(trained / "eval" / "sampled")
    assert sorted(step for step, _ in events["eval/path_length"]) == \
        [load_checkpoint(p)["frames"] for p in ckpts]


def test_all_checkpoints_without_a_run_folder_is_refused_in_one_line(trained):
    newest = CheckpointManager(trained).latest()
    proc = _run("--eval", "--checkpoint", str(newest), "--all-checkpoints")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "run_ddppo.py: error: --all-checkpoints needs --eval and --checkpoint RUN_DIR (a run "
        "folder) (see run_ddppo.py --help)"]


def test_eval_maps_puts_top_down_maps_of_the_first_episodes_in_tensorboard(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    newest = CheckpointManager(trained).latest()
    proc = _run("--eval", "--checkpoint", str(newest), "eval.num_episodes=3", "eval.maps=2",
                "eval.deterministic=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    acc = EventAccumulator(str(trained / "eval" / "deterministic"),
                           size_guidance={"images": 0}).Reload()
    assert sorted(acc.Tags()["images"]) == ["eval/map_0", "eval/map_1"]
    frames = load_checkpoint(newest)["frames"]
    assert [e.step for e in acc.Images("eval/map_0")] == [frames]
    log = (trained / "eval_log.txt").read_text()
    assert "eval/map_0 is episode " in log and "eval/map_1 is episode " in log
