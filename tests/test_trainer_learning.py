"""It learns: on the trivial scene set a short one-process run beats a random policy clearly."""
from __future__ import annotations

import numpy as np
import pytest

from mpi_launch import REPO
from wagma_rl.config import load_config
from wagma_rl.rl.config import DDPPOConfig
from wagma_rl.rl.setup import make_envs
from wagma_rl.rl.trainer import train

FRAMES = 16384


def random_policy_success(cfg: DDPPOConfig, episodes: int = 40) -> float:
    envs = make_envs(cfg, rank=0, num_envs=4, split="train", seed=123)
    envs.reset(seed=123)
    rng = np.random.default_rng(0)
    done = []
    while len(done) < episodes:
        _, _, term, trunc, infos = envs.step(rng.integers(0, 4, size=4))
        done += [float(infos["success"][i]) for i in np.flatnonzero(np.logical_or(term, trunc))]
    envs.close()
    return float(np.mean(done))


@pytest.mark.slow
def test_success_rises_clearly_above_a_random_policy_within_a_frame_budget(tmp_path):
    cfg = load_config(DDPPOConfig, REPO / "configs" / "quick_pointnav.yaml",
                      [f"run.dir={tmp_path / 'learn'}", f"run.total_frames={FRAMES}",
                       "env.num_envs=4", "ppo.num_steps=64", "ppo.ppo_epoch=2",
                       "policy.hidden_size=64", "run.checkpoint_interval=1000",
                       "run.stats_window=40"])
    baseline = random_policy_success(cfg)
    result = train(cfg)
    assert result.frames >= FRAMES
    success = result.last_stats["success"]
    assert success >= baseline + 0.15, f"success {success:.2f} vs random {baseline:.2f}"
