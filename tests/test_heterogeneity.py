"""Emulated heterogeneity (wagma_rl.heterogeneity): slow ranks and the two stall models, the same
``heterogeneity:`` section in the trainer's and the supervised jobs' configs, and the wrapper that
applies it around a vector environment's steps."""

import time
from pathlib import Path

import numpy as np
import pytest

import envs
from wagma_rl.config import ConfigError, load_config
from wagma_rl.heterogeneity import (Heterogeneity, HeterogeneityConfig, HeterogeneousVectorEnv,
                                    check_heterogeneity)
from wagma_rl.rl.config import DDPPOConfig
from wagma_rl.rl.setup import check_config
from wagma_rl.supervised import SupervisedConfig, train

REPO = Path(__file__).resolve().parents[1]
QUICK = REPO / "configs" / "quick_pointnav.yaml"


def het(rank=0, world_size=4, **keys) -> Heterogeneity:
    return Heterogeneity(HeterogeneityConfig(**keys), rank=rank, world_size=world_size)


def _sleeps(monkeypatch):
    calls = []
    monkeypatch.setattr(time, "sleep", calls.append)
    return calls


class TestSlowRanks:
    def test_a_slow_rank_sleeps_slowdown_minus_one_times_its_work(self):
        assert het(rank=1, slow_ranks=[1], slowdown=3.0).delay(0.2, step=0) == pytest.approx(0.4)

    def test_the_other_ranks_do_not_sleep(self):
        assert het(rank=0, slow_ranks=[1], slowdown=3.0).delay(0.2, step=0) == 0.0

    def test_everything_is_off_by_default(self):
        h = het()
        assert not h.active and all(h.delay(1.0, step=s) == 0.0 for s in range(50))


class TestAgreedStalls:
    def test_every_rank_agrees_on_the_stalled_ranks_and_they_are_1_to_stall_ranks(self):
        hs = [het(rank=r, stall_s=0.5, stall_ranks=2, seed=3) for r in range(4)]
        for step in range(50):
            stalled = [r for r in range(4) if hs[r].delay(0.1, step=step) > 0]
            assert stalled == hs[0].agreed_stalls(step) and 1 <= len(stalled) <= 2
            assert all(hs[r].delay(0.1, step=step) == 0.5 for r in stalled)

    def test_the_schedule_depends_only_on_seed_and_step(self):
        # A resumed job (a new object) continues the same schedule; another seed gives another.
        a, b = het(stall_s=0.5, stall_ranks=2, seed=3), het(stall_s=0.5, stall_ranks=2, seed=3)
        assert [a.agreed_stalls(s) for s in range(30)] == [b.agreed_stalls(s) for s in range(30)]
        other = het(stall_s=0.5, stall_ranks=2, seed=4)
        assert [a.agreed_stalls(s) for s in range(30)] != [other.agreed_stalls(s) for s in range(30)]

    def test_stall_ranks_above_the_world_size_stall_at_most_every_rank(self):
        assert all(het(world_size=1, stall_s=0.5, stall_ranks=3).agreed_stalls(s) == [0]
                   for s in range(10))

    def test_a_micro_batch_sleeps_its_fraction_of_the_stall(self):
        h = het(world_size=1, stall_s=0.4, stall_ranks=1)
        assert h.delay(0.0, step=7, fraction=0.25) == pytest.approx(0.1)

    def test_work_outside_the_steps_never_stalls(self):
        assert het(world_size=1, stall_s=0.4, stall_ranks=1).delay(0.3) == 0.0


class TestIndependentStalls:
    def test_probability_one_stalls_every_rank_at_every_step(self):
        assert all(het(rank=r, stall_s=0.25, stall_prob=1.0).delay(0.0, step=s) == 0.25
                   for r in range(4) for s in range(20))

    def test_each_rank_draws_on_its_own_at_the_configured_rate(self):
        steps = 400
        pattern = np.array([[het(rank=r, stall_s=1.0, stall_prob=0.5, seed=5).stalled(s)
                             for s in range(steps)] for r in range(4)])
        # Binomial(400, 0.5): 200 +- 10; the bounds are 5 standard deviations.
        assert all(150 <= n <= 250 for n in pattern.sum(axis=1))
        # Independent ranks: no two ranks share their schedule.
        assert len({row.tobytes() for row in pattern}) == 4

    def test_the_draw_of_a_step_is_repeatable(self):
        h = het(rank=2, stall_s=1.0, stall_prob=0.3, seed=9)
        assert [h.stalled(s) for s in range(40)] == [h.stalled(s) for s in range(40)]


class TestSettings:
    @pytest.mark.parametrize("key,value,message", [
        ("slowdown", 0.5, "heterogeneity.slowdown"),
        ("stall_s", -1.0, "heterogeneity.stall_s"),
        ("stall_prob", 2.0, "heterogeneity.stall_prob"),
        ("stall_ranks", -1, "heterogeneity.stall_ranks"),
        ("slow_ranks", [4], "heterogeneity.slow_ranks"),
    ])
    def test_a_bad_value_is_refused_naming_the_key(self, key, value, message):
        with pytest.raises(ConfigError, match=message):
            check_heterogeneity(HeterogeneityConfig(**{key: value}), world_size=4)

    def test_the_trainer_checks_the_section_before_any_work(self):
        cfg = load_config(DDPPOConfig, QUICK, ["heterogeneity.slow_ranks=[3]"])
        with pytest.raises(ConfigError, match="heterogeneity.slow_ranks"):
            check_config(cfg, world_size=2)

    def test_a_supervised_job_checks_the_section_before_any_work(self, tmp_path):
        cfg = load_config(SupervisedConfig, REPO / "configs/resnet_shapes.yaml",
                          ["heterogeneity.stall_prob=1.5", f"run.dir={tmp_path}"])
        with pytest.raises(ConfigError, match="heterogeneity.stall_prob"):
            train(cfg)
        assert not (tmp_path / "config.yaml").exists()

    def test_both_stacks_have_the_same_section(self):
        assert type(load_config(DDPPOConfig).heterogeneity) is HeterogeneityConfig
        assert type(load_config(SupervisedConfig).heterogeneity) is HeterogeneityConfig

    @pytest.mark.parametrize("schema,override,moved,new", [
        (DDPPOConfig, "env.slowdown=2", "env.slowdown", "'heterogeneity.slowdown'"),
        (DDPPOConfig, "env.slow_ranks=[1]", "env.slow_ranks", "'heterogeneity.slow_ranks'"),
        (DDPPOConfig, "env.step_delay_s=1", "env.step_delay_s", "'heterogeneity.stall_s'"),
        (DDPPOConfig, "env.step_delay_prob=0.1", "env.step_delay_prob", "'heterogeneity.stall_prob'"),
        (SupervisedConfig, "straggler.mode=random", "straggler",
         "the 'heterogeneity' section (straggler mode random: stall_ranks=max_ranks"),
    ])
    def test_the_old_keys_name_their_new_place(self, schema, override, moved, new):
        with pytest.raises(ConfigError) as err:
            load_config(schema, None, [override])
        assert str(err.value).startswith(f"config key '{moved}' has moved: use {new}")


def _venv(rank=0, world_size=1, first_step=0, **keys):
    inner = envs.PointNavVectorEnv(2, scenes="trivial", depth_size=8)
    return HeterogeneousVectorEnv(inner, het(rank=rank, world_size=world_size, **keys),
                                  first_step=first_step)


class TestVectorEnvWrapper:
    def test_off_by_default_it_never_sleeps(self, monkeypatch):
        venv = _venv()
        calls = _sleeps(monkeypatch)
        venv.reset()
        for _ in range(20):
            venv.step(np.array([1, 2]))
        assert calls == []

    def test_a_slow_rank_stretches_every_step_and_reset_by_the_factor(self, monkeypatch):
        venv = _venv(rank=0, world_size=2, slow_ranks=[0], slowdown=3.0)
        calls = _sleeps(monkeypatch)
        start = time.perf_counter()
        venv.reset()
        assert len(calls) == 1 and 0 < calls[0] <= 2.0 * (time.perf_counter() - start)
        start = time.perf_counter()
        venv.step(np.array([1, 2]))
        assert len(calls) == 2 and 0 < calls[1] <= 2.0 * (time.perf_counter() - start)

    def test_a_stall_adds_stall_s_to_a_step_and_nothing_to_a_reset(self, monkeypatch):
        venv = _venv(stall_s=0.25, stall_prob=1.0)
        calls = _sleeps(monkeypatch)
        venv.reset()
        assert calls == []
        venv.step(np.array([1, 2]))
        venv.step(np.array([0, 2]))               # an episode ends and auto-resets: still one stall
        assert calls == [0.25, 0.25]

    def test_steps_count_from_first_step(self, monkeypatch):
        venv = _venv(rank=1, world_size=2, first_step=5, stall_s=1.0, stall_prob=0.5, seed=2)
        calls = _sleeps(monkeypatch)
        venv.reset()
        for _ in range(30):
            venv.step(np.array([1, 2]))
        expect = het(rank=1, world_size=2, stall_s=1.0, stall_prob=0.5, seed=2)
        assert len(calls) == sum(expect.stalled(5 + i) for i in range(30)) > 0
        assert venv.steps == 35

    def test_it_is_still_the_batched_environment(self):
        venv = _venv()
        obs, _ = venv.reset(seed=0)
        assert obs["depth"].shape == (2, 8, 8, 1) and venv.num_envs == 2
        assert isinstance(venv.unwrapped, envs.PointNavVectorEnv)


def test_the_trainer_stalls_every_vector_step_of_its_rollouts(tmp_path, monkeypatch):
    from wagma_rl.rl.trainer import train as train_rl
    cfg = load_config(DDPPOConfig, QUICK, [f"run.dir={tmp_path}", "averaging.name=allreduce",
                                           "run.total_frames=512", "heterogeneity.stall_s=0.0123",
                                           "heterogeneity.stall_prob=1.0"])
    calls = _sleeps(monkeypatch)
    result = train_rl(cfg)
    assert calls.count(0.0123) == sum(result.rollout_steps) == 512 // cfg.env.num_envs


def env_het(rank=0, world_size=2, num_envs=4, **keys) -> Heterogeneity:
    return Heterogeneity(HeterogeneityConfig(**keys), rank=rank, world_size=world_size,
                         num_envs=num_envs)


class TestSlowEnvs:
    def test_a_slow_env_stretches_its_whole_step_including_the_emulated_simulator_time(self):
        h = env_het(slow_envs=[2], env_slowdown=3.0, env_step_s=0.01)
        # step = work 0.002 + simulator 0.01; the slow env takes 3x that: sleeps 0.036 - 0.002
        assert h.env_delay(2, 0.002, step=0) == pytest.approx(0.01 + 2 * 0.012)
        assert h.env_delay(1, 0.002, step=0) == pytest.approx(0.01)

    def test_env_stalls_are_drawn_per_rank_env_and_step(self):
        h = env_het(env_stall_s=0.5, env_stall_prob=0.3, seed=4)
        stalls = np.array([[h.env_delay(e, 0.0, step=s) for s in range(400)] for e in range(4)])
        assert set(np.unique(stalls)) == {0.0, 0.5}
        assert 0.2 < (stalls > 0).mean() < 0.4
        assert not (stalls[0] == stalls[1]).all()  # envs draw their own
        again = env_het(env_stall_s=0.5, env_stall_prob=0.3, seed=4)
        assert again.env_delay(3, 0.0, step=17) == stalls[3, 17]

    def test_a_lock_step_rank_waits_for_its_slowest_env(self, monkeypatch):
        inner = envs.PointNavVectorEnv(3, scenes="trivial", depth_size=8)
        venv = HeterogeneousVectorEnv(inner, env_het(num_envs=3, slow_envs=[1], env_slowdown=5.0,
                                                     env_step_s=0.01))
        venv.reset()
        calls = _sleeps(monkeypatch)
        venv.step(np.array([1, 2, 3]))
        assert len(calls) == 1 and calls[0] >= 0.05  # env 1's 5 x 0.01, not the sum of three

    def test_envs_that_sleep_in_their_workers_are_not_slept_again_by_the_rank(self, monkeypatch):
        inner = envs.PointNavVectorEnv(3, scenes="trivial", depth_size=8)
        venv = HeterogeneousVectorEnv(inner, env_het(num_envs=3, env_step_s=0.01), envs_inside=True)
        venv.reset()
        calls = _sleeps(monkeypatch)
        venv.step(np.array([1, 2, 3]))
        assert calls == []

    def test_slow_envs_outside_the_rank_are_refused_by_name(self):
        with pytest.raises(ConfigError, match="heterogeneity.slow_envs.*env.num_envs is 4"):
            check_heterogeneity(HeterogeneityConfig(slow_envs=[4]), world_size=2, num_envs=4)

    def test_a_job_without_envs_refuses_the_env_keys(self):
        with pytest.raises(ConfigError, match="this job has none"):
            check_heterogeneity(HeterogeneityConfig(env_step_s=0.01), world_size=2)


@pytest.mark.parametrize("key,value", [("env_stall_s", 0.5), ("env_step_s", 0.01),
                                       ("slow_envs", [0]), ("env_slowdown", 2.0)])
def test_a_jobs_env_key_without_envs_is_refused_by_the_key_it_set(key, value):
    # A supervised job has no envs; the message names the key the config set.
    with pytest.raises(ConfigError, match=f"heterogeneity.{key}'"):
        check_heterogeneity(HeterogeneityConfig(**{key: value}), world_size=2, num_envs=None)
