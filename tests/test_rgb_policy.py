"""RGB beside depth (env.sensors=[depth, rgb]): the config key, the policy's channels, the
rollout storage's uint8 buffer, a short training run whose checkpoint evaluates, and checkpoints of
the other camera set refused in one line."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from wagma_rl.config import ConfigError, load_config
from wagma_rl.job.checkpoint import CheckpointManager, load_checkpoint
from wagma_rl.rl.config import DDPPOConfig
from wagma_rl.rl.evaluate import evaluate
from wagma_rl.rl.policy import PointNavPolicy
from wagma_rl.rl.setup import build_policy, check_config, obs_to_torch
from wagma_rl.rl.storage import RolloutStorage

QUICK = Path(__file__).resolve().parents[1] / "configs/quick_pointnav.yaml"
RGB = ["env.sensors=[depth, rgb]"]


def small_policy(sensors=("depth", "rgb")) -> PointNavPolicy:
    return PointNavPolicy(depth_size=16, sensors=sensors, hidden_size=8, base_planes=4,
                          resnet_layers=(1,))


def test_the_encoder_reads_rgb_over_255_beside_depth_and_trains_on_both():
    torch.manual_seed(0)
    policy = small_policy()
    assert policy.encoder.stem[0].weight.shape[1] == 4
    n = 3
    depth = torch.rand(n, 16, 16, 1)
    rgb = torch.randint(0, 256, (n, 16, 16, 3)).float()
    visual = torch.cat([depth, rgb], -1)
    x = policy._channels(visual)
    assert torch.equal(x[:, 0], depth[..., 0]) and torch.equal(x[:, 1:], rgb.permute(0, 3, 1, 2) / 255)
    goal = torch.rand(n, 2)
    logits, values, _ = policy(visual, goal, torch.full((n,), -1), torch.zeros(n),
                               policy.initial_state(n))
    (logits.sum() + values.sum()).backward()
    stem = policy.encoder.stem[0].weight.grad
    assert stem.shape == (4, 4, 5, 5) and bool((stem[:, 1:].abs().sum((1, 2, 3)) > 0).all())


def test_the_policy_refuses_an_observation_without_the_rgb_channels():
    policy = small_policy()
    with pytest.raises(ValueError, match=r"reads sensors \['depth', 'rgb'\] \(4 channels\); the "
                                         r"observation has 1"):
        policy(torch.rand(2, 16, 16, 1), torch.rand(2, 2), torch.full((2,), -1), torch.zeros(2),
               policy.initial_state(2))


def test_obs_to_torch_puts_rgb_values_after_depth():
    obs = {"depth": np.full((2, 4, 4, 1), 0.5, np.float32),
           "rgb": np.arange(96, dtype=np.uint8).reshape(2, 4, 4, 3),
           "pointgoal_with_gps_compass": np.zeros((2, 2), np.float32)}
    visual, _ = obs_to_torch(obs, torch.device("cpu"))
    assert visual.shape == (2, 4, 4, 4) and visual.dtype == torch.float32
    assert torch.equal(visual[..., 0], torch.full((2, 4, 4), 0.5))
    assert torch.equal(visual[..., 1:], torch.arange(96).reshape(2, 4, 4, 3).float())


def test_storage_keeps_rgb_as_uint8_and_gives_it_back_exactly():
    st = RolloutStorage(num_steps=2, num_envs=2, depth_shape=(4, 4, 1), num_recurrent_layers=1,
                        hidden_size=3)
    first = torch.cat([torch.rand(2, 4, 4, 1), torch.randint(0, 256, (2, 4, 4, 3)).float()], -1)
    st.set_first(depth=first, goal=torch.zeros(2, 2))
    assert st.depth.shape == (3, 2, 4, 4, 1) and st.depth.dtype == torch.float32
    assert st.rgb.shape == (3, 2, 4, 4, 3) and st.rgb.dtype == torch.uint8
    nxt = torch.cat([torch.rand(2, 4, 4, 1), torch.randint(0, 256, (2, 4, 4, 3)).float()], -1)
    for _ in range(2):
        st.insert(actions=torch.zeros(2, dtype=torch.long), log_probs=torch.zeros(2),
                  values=torch.zeros(2), rewards=torch.zeros(2), next_depth=nxt,
                  next_goal=torch.zeros(2, 2), next_hidden=torch.zeros(1, 2, 3),
                  next_masks=torch.ones(2))
    assert torch.equal(st.current()["depth"], nxt)
    batch = next(st.mini_batches(torch.zeros(2, 2), torch.zeros(2, 2), 1))
    assert batch.depth.shape == (4, 4, 4, 4)
    # Time-major (T*n): step 0 of the batch's envs (in its random order), then step 1.
    got = batch.depth.view(2, 2, 4, 4, 4)
    order = [0, 1] if torch.equal(got[0, 0], first[0]) else [1, 0]
    assert torch.equal(got[0], first[order]) and torch.equal(got[1], nxt[order])
    st.after_update()
    assert torch.equal(st.current()["depth"], nxt)


def test_storage_of_depth_alone_has_no_rgb_buffer():
    st = RolloutStorage(num_steps=2, num_envs=2, depth_shape=(4, 4, 1), num_recurrent_layers=1,
                        hidden_size=3)
    st.set_first(depth=torch.rand(2, 4, 4, 1), goal=torch.zeros(2, 2))
    assert st.rgb is None and st.depth.shape == (3, 2, 4, 4, 1)


@pytest.mark.parametrize("sensors, error", [
    ("[rgb]", r"env.sensors': \['rgb'\] is not a camera set the policy reads; use \[depth\] or "
              r"\[depth, rgb\]"),
    ("[depth, infrared]", r"\['depth', 'infrared'\] is not a camera set"),
])
def test_an_unknown_camera_set_is_refused_in_one_line(sensors, error):
    cfg = load_config(DDPPOConfig, QUICK, [f"env.sensors={sensors}"])
    with pytest.raises(ConfigError, match=error):
        check_config(cfg, 1)


def test_rgb_on_the_batch_simulator_is_refused_and_auto_picks_the_numpy_one():
    cfg = load_config(DDPPOConfig, QUICK, RGB + ["env.device=cpu"])
    with pytest.raises(ConfigError, match="renders depth only; env.sensors asks for rgb"):
        check_config(cfg, 1)
    from wagma_rl.rl.setup import env_device
    auto = load_config(DDPPOConfig, QUICK, RGB)
    assert env_device(auto, torch.device("cuda", 0)) is None


def test_rgb_without_the_visual_encoder_is_refused():
    cfg = load_config(DDPPOConfig, QUICK, RGB + ["policy.use_depth=false"])
    with pytest.raises(ConfigError, match="set policy.use_depth=true or env.sensors=\\[depth\\]"):
        check_config(cfg, 1)


@pytest.mark.parametrize("trained, asked", [([], RGB), (RGB, [])])
def test_a_checkpoint_of_the_other_cameras_is_refused_in_one_line(tmp_path, trained, asked):
    saved = build_policy(load_config(DDPPOConfig, QUICK, trained))
    ckpt = CheckpointManager(tmp_path).save({"model": saved.state_dict()}, step=0)
    cfg = load_config(DDPPOConfig, QUICK, asked)
    want = "['depth', 'rgb']" if trained else "['depth']"
    with pytest.raises(ConfigError) as exc:
        evaluate(cfg, ckpt, log=False)
    assert "\n" not in str(exc.value)
    assert f"it was trained with env.sensors={want}" in str(exc.value)
    assert "evaluate without --config" in str(exc.value)


def test_a_short_rgb_run_trains_and_its_checkpoint_evaluates(tmp_path):
    from wagma_rl.rl.trainer import train

    cfg = load_config(DDPPOConfig, QUICK, RGB + [f"run.dir={tmp_path / 'rgb'}",
                                                 "run.total_frames=64", "eval.num_episodes=2",
                                                 "eval.num_envs=2"])
    before = {k: v.clone() for k, v in build_policy(cfg).state_dict().items()}
    result = train(cfg)
    assert result.frames >= 64 and result.checkpoint is not None
    model = load_checkpoint(result.checkpoint)["model"]
    assert model["encoder.stem.0.weight"].shape[1] == 4
    assert any(not torch.equal(model[k], before[k]) for k in before)
    stats = evaluate(cfg, result.checkpoint, log=False)
    assert stats["episodes"] == 2


def test_resuming_with_the_other_cameras_names_the_checkpoints_sensors(tmp_path):
    from wagma_rl.rl.resume import resume_problem

    trained = load_config(DDPPOConfig, QUICK, [])
    ckpt = {"model": build_policy(trained).state_dict(), "config": {"env": {"sensors": ["depth"]}}}
    cfg = load_config(DDPPOConfig, QUICK, RGB)
    problem = resume_problem(ckpt, tmp_path / "ckpt.pt", cfg, build_policy(cfg))
    assert "encoder.stem.0.weight: (4, 1, 5, 5) there, (4, 4, 5, 5) here" in problem
    assert "it was trained with env.sensors=['depth']" in problem and "\n" not in problem


def test_sensors_among_the_env_options_are_refused_for_env_sensors():
    cfg = load_config(DDPPOConfig, QUICK, ["env.options={sensors: [depth, rgb]}"])
    with pytest.raises(ConfigError, match=r"'env.options.sensors': the cameras are chosen by "
                                          r"env.sensors .* move it there"):
        check_config(cfg, 1)


def test_storage_keeps_rgb_per_env_when_envs_step_on_their_own():
    # VER: env 1 completes a step without env 0; its RGB lands in its own next slot.
    st = RolloutStorage(num_steps=2, num_envs=2, depth_shape=(2, 2, 4), num_recurrent_layers=1,
                        hidden_size=3)
    st.set_first(depth=torch.zeros(2, 2, 2, 4), goal=torch.zeros(2, 2))
    st.act(actions=torch.zeros(1, dtype=torch.long), log_probs=torch.zeros(1),
           values=torch.zeros(1), next_hidden=torch.zeros(1, 1, 3), env_ids=[1])
    seen = torch.cat([torch.full((1, 2, 2, 1), 0.25), torch.full((1, 2, 2, 3), 200.0)], -1)
    st.complete(rewards=torch.zeros(1), next_depth=seen, next_goal=torch.zeros(1, 2),
                next_masks=torch.ones(1), env_ids=[1])
    assert st.lengths.tolist() == [0, 1]
    assert torch.equal(st.rgb[1, 1], torch.full((2, 2, 3), 200, dtype=torch.uint8))
    assert torch.equal(st.current([1])["depth"], seen)
    assert torch.equal(st.current([0])["depth"], torch.zeros(1, 2, 2, 4))
