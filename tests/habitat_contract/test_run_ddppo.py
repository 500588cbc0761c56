"""``run_ddppo.py`` with ``env.backend=habitat`` as a user runs it: a short training run on the
exported scenes with 2 envs per rank, each in its own worker process (the stand-in simulator,
like habitat-sim, runs one per process), then ``--eval`` of its checkpoint on the exported val
episodes with 2 envs, also in worker processes (``env.workers: auto`` picks them for habitat in
both)."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, STANDINS


def _run(args, cwd):
    env = {**os.environ, "PYTHONPATH": f"{STANDINS}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(REPO / "run_ddppo.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def trained(exported, tmp_path_factory):
    """Two updates of the quick config on the exported train episodes: (config, checkpoint)."""
    root = tmp_path_factory.mktemp("habitat_run")
    config = yaml.safe_load((REPO / "configs" / "quick_pointnav.yaml").read_text())
    config["run"].update(dir=str(root / "run"), total_frames=64, checkpoint_interval=1,
                         log_interval=1)
    config["env"].update(backend="habitat", scenes="default", num_envs=2,
                         options={"episodes": exported["data_path"],
                                  "scenes_dir": exported["scenes_dir"]})
    config["averaging"] = {**config.get("averaging", {}), "name": "allreduce"}
    config["eval"] = {"split": "val", "num_envs": 2, "num_episodes": 0}
    path = root / "habitat.yaml"
    path.write_text(yaml.safe_dump(config))
    train = _run(["--config", str(path)], root)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    ckpts = sorted((root / "run" / "checkpoints").glob("*.pt"))
    assert ckpts, train.stdout[-3000:]
    return path, ckpts[-1]


@pytest.fixture(scope="module")
def evaluated(trained):
    """``--eval`` of the checkpoint on the val set, with a video and a map of its first episode
    (one run serves both tests: each start imports habitat in 3 processes)."""
    config, ckpt = trained
    ev = _run(["--eval", "--checkpoint", str(ckpt), "eval.video=1", "eval.maps=1"],
              config.parent)
    assert ev.returncode == 0, ev.stdout[-3000:] + ev.stderr[-3000:]
    return ev


def test_eval_of_a_habitat_trained_checkpoint_runs_the_val_set_once(trained, evaluated):
    config, ckpt = trained
    ev = evaluated
    assert "val/val.json.gz: episodes=3 " in ev.stdout
    result = json.loads((config.parent / "run" / f"eval_{ckpt.stem}_val_sampled.json").read_text())
    assert result["episodes"] == 3.0 and 0.0 <= result["success"] <= 1.0
    assert result["distance_to_goal"] > 0.0


def test_eval_on_a_missing_episode_file_is_a_one_line_error(trained):
    config, ckpt = trained
    missing = config.parent / "nowhere" / "{split}.json.gz"
    ev = _run(["--config", str(config), "--eval", "--checkpoint", str(ckpt),
               f"eval.episodes={missing}"], config.parent)
    assert ev.returncode == 2, ev.stderr[-3000:]
    # (gym 0.23, which habitat-lab imports, prints a deprecation notice first.)
    last = ev.stderr.strip().splitlines()[-1]
    assert last.startswith("run_ddppo.py: error:") and "Traceback" not in ev.stderr
    assert "nowhere/val.json.gz" in last


def test_eval_video_and_maps_of_a_habitat_checkpoint_come_from_habitats_top_down_map(
        trained, evaluated):
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config, ckpt = trained
    run = config.parent / "run"
    result = json.loads((run / f"eval_{ckpt.stem}_val_sampled.json").read_text())
    (row,) = result["videos"]
    assert os.path.basename(row["file"]) == (
        f"episode={row['episode']}-ckpt={int(ckpt.stem.split('_')[1])}-"
        f"success={row['success']:.2f}-spl={row['spl']:.2f}.gif")
    with Image.open(row["file"]) as gif:  # maps through the worker processes' infos
        assert gif.n_frames == row["steps"] + 1
    acc = EventAccumulator(str(run / "eval" / "sampled"), size_guidance={"images": 0}).Reload()
    assert sorted(acc.Tags()["images"]) == ["eval/map_0", "eval/video_0"]
