"""Numeric keys outside the range declared beside their field (``ranged``) are refused when the
config loads, in one line naming the key, by both entry points, before anything is written;
overrides may stand before, between or after the flags."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from mpi_launch import REPO
from wagma_rl.config import ConfigError, check_ranges, load_config, ranged
from wagma_rl.rl.config import DDPPOConfig
from wagma_rl.supervised.config import SupervisedConfig

RL = REPO / "configs" / "quick_pointnav.yaml"
SUPERVISED = REPO / "configs" / "resnet_shapes.yaml"


@pytest.mark.parametrize("schema,path,override,message", [
    (DDPPOConfig, RL, "averaging.outer_lr=0", "'averaging.outer_lr': must be > 0, got 0.0"),
    (DDPPOConfig, RL, "averaging.outer_momentum=1.5", "'averaging.outer_momentum': must be in [0, 1)"),
    (DDPPOConfig, RL, "averaging.outer_momentum=1", "'averaging.outer_momentum': must be in [0, 1)"),
    (DDPPOConfig, RL, "ppo.gamma=1.5", "'ppo.gamma': must be in [0, 1], got 1.5"),
    (DDPPOConfig, RL, "ppo.clip=-1", "'ppo.clip': must be > 0"),
    (DDPPOConfig, RL, "rollout.min_frac=2", "'rollout.min_frac': must be in [0, 1]"),
    (DDPPOConfig, RL, "rollout.max_env_steps=0.5", "'rollout.max_env_steps': must be >= 1"),
    (DDPPOConfig, RL, "eval.num_envs=0", "'eval.num_envs': must be >= 1, got 0"),
    (DDPPOConfig, RL, "eval.num_episodes=-3", "'eval.num_episodes': must be >= 0, got -3"),
    (SupervisedConfig, SUPERVISED, "train.batch_size=0", "'train.batch_size': must be >= 1"),
    (SupervisedConfig, SUPERVISED, "train.steps=-1", "'train.steps': must be >= 1, got -1"),
    (SupervisedConfig, SUPERVISED, "train.eval_every=-5", "'train.eval_every': must be >= 1"),
    (SupervisedConfig, SUPERVISED, "averaging.outer_momentum=1.5", "'averaging.outer_momentum'"),
    (SupervisedConfig, SUPERVISED, "averaging.timeout=0", "'averaging.timeout': must be > 0"),
    (SupervisedConfig, SUPERVISED, "averaging.local_steps=0", "'averaging.local_steps': must be >= 1"),
    (DDPPOConfig, RL, "averaging.group_size=0", "'averaging.group_size': must be >= 1, got 0"),
    (DDPPOConfig, RL, "averaging.sync_period=0", "'averaging.sync_period': must be >= 1, got 0"),
    (DDPPOConfig, RL, "averaging.sync_frac=0", "'averaging.sync_frac': must be in (0, 1], got 0.0"),
    (DDPPOConfig, RL, "averaging.overlap_sync_every=0", "'averaging.overlap_sync_every': must be >= 1"),
    (DDPPOConfig, RL, "ppo.num_steps=0", "'ppo.num_steps': must be >= 1, got 0"),
    (DDPPOConfig, RL, "ppo.lr=0", "'ppo.lr': must be > 0, got 0.0"),
    (DDPPOConfig, RL, "env.num_envs=0", "'env.num_envs': must be >= 1, got 0"),
    # The keys of the release before: translated first, then checked under their new name.
    (DDPPOConfig, RL, "distrib.outer_lr=0", "'averaging.outer_lr': must be > 0, got 0.0"),
    (DDPPOConfig, RL, "distrib.outer_momentum=1.5", "'averaging.outer_momentum': must be in [0, 1)"),
    (SupervisedConfig, SUPERVISED, "optim.micro_batches=0", "'averaging.micro_batches': must be >= 1"),
])
def test_a_value_outside_its_declared_range_is_refused_naming_the_key(schema, path, override,
                                                                      message):
    with pytest.raises(ConfigError) as info:
        load_config(schema, path, [override])
    assert message in str(info.value)


@pytest.mark.parametrize("schema,path,override", [
    (DDPPOConfig, RL, "ppo.gamma=1"), (DDPPOConfig, RL, "averaging.outer_momentum=0"),
    (DDPPOConfig, RL, "eval.num_episodes=0"), (SupervisedConfig, SUPERVISED, "train.eval_batches=0"),
])
def test_the_ends_a_range_includes_are_accepted(schema, path, override):
    load_config(schema, path, [override])


def test_the_range_forms_mean_what_they_say():
    @dataclass
    class Section:
        a: float = ranged(1.0, "(0, 1]")
        b: float = ranged(2.9, "< 3")
        c: float | None = ranged(None, "<= 3")

    check_ranges(Section())
    for bad in (Section(a=0.0), Section(b=3.0), Section(c=3.5)):
        with pytest.raises(ConfigError):
            check_ranges(bad)


@pytest.mark.parametrize("argv", [
    ["run_ddppo.py", "--config", str(RL)],
    ["-m", "wagma_rl.supervised", "--config", str(SUPERVISED)],
])
def test_an_entry_point_refuses_in_one_line_with_exit_2_and_writes_nothing(tmp_path, argv):
    bad = "ppo.gamma=2" if argv[0] == "run_ddppo.py" else "train.steps=-1"
    proc = subprocess.run([sys.executable, *argv, f"run.dir={tmp_path / 'run'}", bad],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and bad.split("=")[0] in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv,key", [
    (["run_ddppo.py", "run.total_frames=64", "--config", str(RL), "run.seed=7",
      "--print-config"], "total_frames: 64"),
    (["-m", "wagma_rl.supervised", "train.steps=3", "--config", str(SUPERVISED), "run.seed=7",
      "--print-config"], "steps: 3"),
])
def test_overrides_may_stand_before_between_and_after_the_flags(argv, key):
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert key in proc.stdout and "seed: 7" in proc.stdout


@pytest.mark.parametrize("schema,path,hint", [
    (DDPPOConfig, SUPERVISED, "python -m wagma_rl.supervised"),
    (SupervisedConfig, RL, "python run_ddppo.py"),
])
def test_the_other_entry_points_config_is_refused_naming_that_entry_point(schema, path, hint):
    with pytest.raises(ConfigError, match="is not a key of this job") as info:
        load_config(schema, path)
    assert hint in str(info.value)
