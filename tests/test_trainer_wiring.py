"""The trainer's wiring of finished pieces on one rank: the habitat envs' rank, job size and
renderer GPU (the rank's, or the one env.options chooses, said in the log) and the measures the envs report beyond success,
SPL and distance, as TensorBoard scalars."""
from __future__ import annotations

import math

import pytest
import torch

import wagma_rl.rl.trainer as trainer
from mpi_launch import REPO
from wagma_rl.config import load_config
from wagma_rl.job.tblog import read_scalars
from wagma_rl.rl.config import DDPPOConfig
from wagma_rl.rl.setup import decide_collection

QUICK = REPO / "configs" / "quick_pointnav.yaml"


def _asked_of_habitat(monkeypatch, device: torch.device, *settings: str) -> tuple[dict, str | None]:
    """What the trainer asks make_envs for (habitat is not run) and the note it returns."""
    asked: dict = {}

    def make_envs(cfg, **kwargs):
        asked.update(kwargs)
        return "venv"
    monkeypatch.setattr(trainer, "make_envs", make_envs)
    monkeypatch.setattr(trainer, "HeterogeneousVectorEnv", lambda venv, *a, **k: venv)
    cfg = load_config(DDPPOConfig, QUICK, ["env.backend=habitat", *settings])
    venv, note = trainer._make_train_envs(cfg, decide_collection(cfg, device), rank=2,
                                          world_size=4, seed=0, first_step=0, device=device)
    assert venv == "venv"
    return asked, note


@pytest.mark.parametrize("workers", ["process", "inprocess"])
def test_habitat_envs_render_on_the_ranks_gpu_in_worker_processes_and_in_process(monkeypatch,
                                                                                 workers):
    asked, note = _asked_of_habitat(monkeypatch, torch.device("cuda", 1), f"env.workers={workers}")
    assert asked["gpu_device_id"] == 1 and note is None
    assert (asked.get("workers") == "process") == (workers == "process")
    assert (asked["rank"], asked["world_size"]) == (2, 4)  # (their share of episodes and scenes)
    asked, _ = _asked_of_habitat(monkeypatch, torch.device("cuda"), f"env.workers={workers}")
    assert asked["gpu_device_id"] == 0  # (cuda without an index: the first GPU)


def test_habitat_envs_on_a_cpu_rank_keep_habitats_own_gpu_choice(monkeypatch):
    asked, note = _asked_of_habitat(monkeypatch, torch.device("cpu"))
    assert "gpu_device_id" not in asked and note is None


def test_a_renderer_gpu_chosen_in_env_options_wins_and_the_note_says_so(monkeypatch):
    asked, note = _asked_of_habitat(monkeypatch, torch.device("cuda", 1),
                                    "env.options={gpu_device_id: 3}")
    assert asked["gpu_device_id"] == 3
    assert note.startswith("env.options sets the habitat renderer's GPU (gpu_device_id=3)")
    assert "rank's GPU 1" in note


def test_the_measures_the_embedded_env_reports_are_tensorboard_scalars(tmp_path):
    # The embedded simulator reports path_length and collided besides success, SPL and distance.
    cfg = load_config(DDPPOConfig, QUICK, [f"run.dir={tmp_path / 'run'}", "run.total_frames=512",
                                           "env.max_episode_steps=20"])
    trainer.train(cfg)
    scalars = read_scalars(tmp_path / "run")
    for name in ("path_length", "collided"):
        values = [v for _, v in scalars.get(f"metrics/{name}", [])]
        assert values and all(math.isfinite(v) for v in values), sorted(scalars)
    # A path of at most 20 forward steps of 0.25 m; collided is a fraction of episodes.
    assert all(0 < v <= 20 * 0.25 + 1e-6 for _, v in scalars["metrics/path_length"])
    assert all(0 <= v <= 1 for _, v in scalars["metrics/collided"])
