"""``eval.video=N``: the first N evaluation episodes as animated GIFs (depth beside the top-down
map, one frame per step and a last one, as habitat-baselines writes them) named by episode,
checkpoint, success and SPL, and as TensorBoard images; the recorder on scripted episodes that
succeed."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from mpi_launch import REPO
from wagma_rl.job.checkpoint import CheckpointManager, load_checkpoint

QUICK = "configs/quick_pointnav.yaml"
NAME = re.compile(r"^episode=(.+)-ckpt=(\d+)-success=(\d\.\d\d)-spl=(\d\.\d\d)\.gif$")


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run_ddppo.py", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def _frames(path) -> int:
    with Image.open(path) as gif:
        return gif.n_frames


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("evalvideo") / "run"
    proc = _run("--config", QUICK, f"run.dir={run_dir}", "run.total_frames=64")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return CheckpointManager(run_dir).latest()


def test_eval_video_writes_the_first_episodes_as_gifs_named_by_their_measures(checkpoint):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc = _run("--eval", "--checkpoint", str(checkpoint), "eval.num_episodes=3",
                "eval.num_envs=2", "eval.video=2", "eval.deterministic=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = checkpoint.parents[1]
    gifs = sorted((run_dir / "eval" / "videos" / "val_deterministic").glob("*.gif"))
    assert len(gifs) == 2
    result = json.loads((run_dir / "eval_ckpt_{}_val_deterministic_3ep.json".format(
        checkpoint.stem.split("_")[1])).read_text())
    rows = {row["file"]: row for row in result["videos"]}
    assert sorted(rows) == [str(g) for g in gifs]
    frames = load_checkpoint(checkpoint)["frames"]
    for gif in gifs:
        row = rows[str(gif)]
        episode, ckpt, success, spl = NAME.match(gif.name).groups()
        assert (episode, int(ckpt)) == (row["episode"], frames)
        assert (success, spl) == (f"{row['success']:.2f}", f"{row['spl']:.2f}")
        # the env's own step count: its first observation, one frame per step, the last
        assert row["steps"] >= 1 and _frames(gif) == row["steps"] + 1
    acc = EventAccumulator(str(run_dir / "eval" / "deterministic"),
                           size_guidance={"images": 0}).Reload()
    assert sorted(acc.Tags()["images"]) == ["eval/video_0", "eval/video_1"]
    assert [e.step for e in acc.Images("eval/video_0")] == [frames]


def test_a_negative_eval_video_is_refused_in_one_line(checkpoint):
    proc = _run("--eval", "--checkpoint", str(checkpoint), "eval.video=-1")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "eval.video" in lines[0] and ">= 0" in lines[0], proc.stderr


def test_maps_and_videos_where_no_map_can_be_had_are_refused_in_one_line(checkpoint):
    # the embedded simulator in a worker process: its state is not in the evaluating process
    proc = _run("--eval", "--checkpoint", str(checkpoint), "eval.num_episodes=1",
                "eval.num_envs=1", "eval.video=1", "env.workers=process")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "run_ddppo.py: error: eval.maps=0, eval.video=1: this env (pointnav, ProcessVectorEnv) "
        "gives no top-down map (the embedded simulator in this process, or habitat's "
        "top_down_map measure): set both to 0, or run the embedded simulator's eval envs in "
        "this process (env.workers=inprocess)"]


def _greedy(obs):
    """Turn towards the goal, walk, STOP within 0.15 m (the trivial scenes are open rooms)."""
    dist, angle = obs["pointgoal_with_gps_compass"][:, 0], obs["pointgoal_with_gps_compass"][:, 1]
    return np.where(dist < 0.15, 0, np.where(np.abs(angle) < np.deg2rad(6), 1,
                                              np.where(angle > 0, 2, 3)))


def test_recorded_videos_carry_the_success_and_spl_the_env_reported(tmp_path):
    from envs.pointnav.vector_env import PointNavVectorEnv
    from wagma_rl.rl.eval_video import (CAPTION_ROWS, FRAME_HEIGHT, EpisodeRecorder, video_name,
                                        write_gif)
    from wagma_rl.rl.metrics import episode_measures

    env = PointNavVectorEnv(2, scenes="trivial", split="val", seed=3, depth_size=16,
                            max_episode_steps=200, sensors=("depth", "rgb"))
    recorder = EpisodeRecorder(env, maps=1, videos=2)
    obs, infos = env.reset(seed=3)
    first = {str(e): obs["rgb"][i] for i, e in enumerate(infos["episode_id"])}
    recorder.started(obs, infos)
    ended = []
    while not recorder.done:
        obs, _, term, trunc, infos = env.step(_greedy(obs))
        dones = term | trunc
        ended += [episode_measures(infos, i) | {"steps": int(infos["elapsed_steps"][i])}
                  for i in np.flatnonzero(dones)]
        recorder.stepped(obs, dones, dones, infos, lambda i: episode_measures(infos, i))
    assert [v.measures["success"] for v in recorder.videos] == [1.0, 1.0]
    for video, reported in zip(recorder.videos, ended):
        assert video.steps == reported["steps"] and len(video.frames) == reported["steps"] + 1
        name = video_name(video.episode, "ckpt_000000000640.pt", video.measures)
        assert name == (f"episode={video.episode}-ckpt=640-success=1.00-"
                        f"spl={reported['spl']:.2f}.gif") and reported["spl"] > 0
        # depth, RGB and map panels, FRAME_HEIGHT rows each: the first frame's RGB is the
        # episode's first observation scaled 8x
        assert video.frames[0].shape[0] == FRAME_HEIGHT + CAPTION_ROWS
        np.testing.assert_array_equal(video.frames[0][:FRAME_HEIGHT, FRAME_HEIGHT:2 * FRAME_HEIGHT],
                                      first[video.episode].repeat(8, 0).repeat(8, 1))
        write_gif(tmp_path / name, video.frames)
        assert _frames(tmp_path / name) == len(video.frames)
    assert len(recorder.maps) == 1 and recorder.maps[0][0] == recorder.videos[0].episode
