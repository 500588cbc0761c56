"""What the trainer's setup hands the environments: each rank's shard of episodes and scenes."""
from __future__ import annotations

from pathlib import Path

import pytest

import envs
from wagma_rl.config import load_config
from wagma_rl.rl.config import DDPPOConfig
from wagma_rl.rl.setup import make_envs

QUICK = Path(__file__).resolve().parents[1] / "configs/quick_pointnav.yaml"


@pytest.fixture
def asked(monkeypatch):
    """The backend, env count and options make_envs passes to envs.make_vector_env."""
    got = []
    monkeypatch.setattr(envs, "make_vector_env",
                        lambda backend, num_envs, **options: got.append((backend, num_envs, options)))
    return got


@pytest.mark.parametrize("workers", ["inprocess", "process"])
def test_habitat_envs_get_the_rank_and_world_size_as_their_shard(asked, workers):
    cfg = load_config(DDPPOConfig, QUICK, ["env.backend=habitat",
                                           "env.options={scene_split: global}"])
    more = {} if workers == "inprocess" else {"workers": "process"}
    make_envs(cfg, rank=2, world_size=4, num_envs=1, split="train", seed=7, **more)
    backend, num_envs, options = asked[0]
    assert (backend, num_envs) == ("habitat", 1)
    assert (options["shard_index"], options["num_shards"]) == (2, 4)
    assert options["scene_split"] == "global"


def test_embedded_in_process_envs_take_no_shard(asked):
    cfg = load_config(DDPPOConfig, QUICK, [])
    make_envs(cfg, rank=1, world_size=2, num_envs=2, split="train", seed=7)
    assert "shard_index" not in asked[0][2] and "num_shards" not in asked[0][2]


def test_embedded_worker_processes_get_the_rank_and_world_size_as_their_shard(asked):
    cfg = load_config(DDPPOConfig, QUICK, [])
    make_envs(cfg, rank=1, world_size=2, num_envs=2, split="train", seed=7, workers="process")
    assert (asked[0][2]["shard_index"], asked[0][2]["num_shards"]) == (1, 2)
