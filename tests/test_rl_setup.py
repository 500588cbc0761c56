"""What the trainer's setup decides and hands the environments: how a rank collects (the
Collection table and its refusals) and each rank's shard of episodes and scenes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import envs
from wagma_rl.config import ConfigError, load_config
from wagma_rl.rl.config import DDPPOConfig
from wagma_rl.rl.setup import Collection, check_config, decide_collection, make_envs

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


CPU, GPU = torch.device("cpu"), torch.device("cuda", 1)


@pytest.mark.parametrize("settings, run_device, decided", [
    ([], CPU, Collection("lockstep", "inprocess", None)),
    ([], GPU, Collection("lockstep", "inprocess", GPU)),  # auto: the batch simulator on the GPU
    (["rollout.mode=ver"], CPU, Collection("ver", "process", None)),
    (["rollout.mode=ver"], GPU, Collection("ver", "process", None)),  # VER keeps numpy
    (["rollout.mode=ver", "env.workers=inprocess"], CPU, Collection("ver", "inprocess", None)),
    (["env.workers=process"], GPU, Collection("lockstep", "process", None)),
    (["env.backend=habitat"], GPU, Collection("lockstep", "process", None, "habitat")),
    (["env.device=numpy"], GPU, Collection("lockstep", "inprocess", None)),
    (["env.device=cpu"], GPU, Collection("lockstep", "inprocess", CPU)),
    (["env.device=cuda"], GPU, Collection("lockstep", "inprocess", GPU)),  # the rank's own GPU
    (["env.device=cpu", "env.options={compile: true}"], GPU,
     Collection("lockstep", "inprocess", CPU, compiled=True)),
    (["env.device=cuda:0"], CPU, Collection("lockstep", "inprocess", torch.device("cuda", 0))),
])
def test_the_collection_is_decided_once_from_the_config_and_the_runs_device(settings, run_device,
                                                                              decided):
    cfg = load_config(DDPPOConfig, QUICK, settings)
    assert decide_collection(cfg, run_device) == decided


@pytest.mark.parametrize("settings, message", [
    (["env.device=tpu"], "config key 'env.device': 'tpu' is not where the simulator can run; use "
                         "auto, numpy, cpu, cuda or cuda:N"),
    (["env.device=cpu", "rollout.mode=ver"], "config key 'env.device': cpu runs the embedded batch "
     "simulator, which steps all of a rank's envs together in this process: it needs "
     "rollout.mode=lockstep, got ver (or set env.device=numpy)"),
    (["env.device=cuda", "env.backend=habitat"], "config key 'env.device': cuda runs the embedded "
     "batch simulator, which steps all of a rank's envs together in this process: it needs "
     "env.backend=pointnav, got habitat (or set env.device=numpy)"),
    (["env.device=cpu", "env.sensors=[depth, rgb]"], "config key 'env.device': cpu runs the batch "
     "simulator, which renders depth only; env.sensors asks for rgb: leave it [depth] (or set "
     "env.device=numpy)"),
    (["env.device=cuda:0", "env.workers=process"], "config key 'env.device': cuda:0 runs the batch "
     "simulator in the trainer's process; env.workers=process runs envs in worker processes: set "
     "env.workers=inprocess (or set env.device=numpy)"),
])
def test_a_collection_no_rank_can_run_is_refused_in_one_line(settings, message):
    cfg = load_config(DDPPOConfig, QUICK, settings)
    for refuse in (lambda: decide_collection(cfg, CPU), lambda: check_config(cfg, world_size=1)):
        with pytest.raises(ConfigError) as refused:
            refuse()
        assert str(refused.value) == message


@pytest.mark.parametrize("fields, message", [
    (("preempt", "inprocess"), "rollout.mode must be 'lockstep' or 'ver', got 'preempt'"),
    (("lockstep", "threads"), "env.workers must be 'inprocess' or 'process', got 'threads'"),
    (("ver", "inprocess", CPU), "rollout.mode='ver' steps each env on its own; the device batch "
     "simulator steps all of a rank's envs together: use rollout.mode=lockstep, or "
     "env.device=numpy for VER"),
    (("lockstep", "process", CPU), "the device batch simulator runs in the trainer's process; "
     "env.workers=process runs envs in worker processes: set env.workers=inprocess, or "
     "env.device=numpy"),
])
def test_a_collection_built_by_hand_that_no_collector_runs_is_a_value_error(fields, message):
    with pytest.raises(ValueError) as refused:
        Collection(*fields)
    assert str(refused.value) == message


def test_the_first_log_lines_words_for_a_collection():
    assert Collection("ver", "process").describe() == "ver rollouts, process envs, simulator numpy"
    assert (Collection("lockstep", "inprocess", GPU).describe()
            == "lockstep rollouts, inprocess envs, simulator cuda:1")
    assert (Collection("lockstep", "process", backend="habitat").describe()
            == "lockstep rollouts, process envs, simulator habitat-sim")
    assert (Collection("lockstep", "inprocess", GPU, compiled=True).describe()
            == "lockstep rollouts, inprocess envs, simulator cuda:1, compiled cast")
