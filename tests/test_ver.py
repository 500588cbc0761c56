"""Variable experience rollouts (VER): per-env segments in the rollout storage, GAE and the PPO
losses over them, the VER collector over an env pool with a virtual clock, and the cut-off rule."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from wagma_rl.rl.collect import CutoffRule, VERCollector, make_collector
from wagma_rl.rl.metrics import EnvStepTimes, EpisodeWindow
from wagma_rl.rl.policy import PointNavPolicy
from wagma_rl.rl.ppo import compute_gae, ppo_losses, ppo_update
from wagma_rl.rl.setup import Collection
from wagma_rl.rl.storage import RolloutStorage

SIZE = 16


def _policy():
    torch.manual_seed(0)
    return PointNavPolicy(depth_size=SIZE, hidden_size=8, base_planes=4, resnet_layers=(1,),
                          ngroups=2)


def _storage(pol, *, num_steps, n):
    st = RolloutStorage(num_steps=num_steps, num_envs=n, depth_shape=(SIZE, SIZE, 1),
                        num_recurrent_layers=pol.num_recurrent_layers, hidden_size=8)
    st.set_first(depth=torch.rand(n, SIZE, SIZE, 1), goal=torch.rand(n, 2))
    return st


class VirtualPool:
    """An env pool with ``step_async``/``step_wait_any`` and a virtual clock: env i's step takes
    ``step_s[i]`` virtual seconds; ``step_wait_any`` returns every in-flight env that finishes
    first (ties together). Observations are the env's step count; reward 1 per step; an episode
    ends every ``episode_len`` steps of an env."""

    def __init__(self, step_s, *, episode_len=1000):
        self.step_s = np.asarray(step_s, dtype=float)
        self.num_envs = len(step_s)
        self.in_flight = np.zeros(self.num_envs, dtype=bool)
        self.finish = np.zeros(self.num_envs)
        self.clock = 0.0
        self.steps = np.zeros(self.num_envs, dtype=np.int64)
        self.episode_len = episode_len
        self.sent = []

    def step_async(self, actions, env_ids):
        env_ids = np.asarray(env_ids)
        assert not self.in_flight[env_ids].any(), "a step sent to an env already stepping"
        self.in_flight[env_ids] = True
        self.finish[env_ids] = self.clock + self.step_s[env_ids]
        self.sent.append((env_ids.copy(), np.asarray(actions).copy()))

    def step_wait_any(self, *, within=None, **_):
        if not self.in_flight.any():
            raise RuntimeError("nothing in flight")
        first = self.finish[self.in_flight].min()
        if within is not None and first > self.clock + within:
            self.clock += within
            k = 0
            return (np.zeros(0, np.int64), {"depth": np.zeros((0, SIZE, SIZE, 1), np.float32),
                    "pointgoal_with_gps_compass": np.zeros((0, 2), np.float32)},
                    np.zeros(0, np.float32), np.zeros(0, bool), np.zeros(0, bool), {})
        ids = np.flatnonzero(self.in_flight & (self.finish == first))
        self.clock = first
        self.in_flight[ids] = False
        self.steps[ids] += 1
        k = len(ids)
        obs = {"depth": np.full((k, SIZE, SIZE, 1), 0.5, np.float32),
               "pointgoal_with_gps_compass": np.stack([self.steps[ids], ids], 1).astype(np.float32)}
        done = self.steps[ids] % self.episode_len == 0
        infos = {"success": done, "spl": done * 1.0, "distance_to_goal": np.zeros(k)}
        return ids, obs, np.ones(k, np.float32), done, np.zeros(k, bool), infos


class RecordingStrategy:
    """collect_more as the base strategy's (ends the rollout at num_steps), recording its calls."""

    def __init__(self):
        self.calls, self.ended = [], []

    def collect_more(self, steps_done, num_steps):
        self.calls.append(steps_done)
        return steps_done < num_steps

    def end_rollout(self, steps_done, num_steps):
        self.ended.append(steps_done)


def _collect(step_s, *, num_steps=6, max_env_steps=2.0, cutoff="full", min_batch=1,
             env_times=None):
    pol = _policy()
    pool = VirtualPool(step_s)
    col = VERCollector(pool, num_steps=num_steps, max_env_steps=max_env_steps, cutoff=cutoff,
                       min_batch=min_batch, env_times=env_times, clock=lambda: pool.clock)
    st = _storage(pol, num_steps=col.storage_steps(), n=len(step_s))
    strategy = RecordingStrategy()
    got = col.collect(pol, st, strategy, EpisodeWindow(len(step_s), 10), torch.device("cpu"))
    return got, st, pool, strategy, col, pol


class TestVariableStorage:
    def test_envs_complete_their_steps_at_their_own_slots(self):
        st = _storage(_policy(), num_steps=4, n=3)
        for ids in ([0, 1, 2], [0], [0, 2]):
            k = len(ids)
            st.act(actions=torch.full((k,), 2), log_probs=torch.zeros(k), values=torch.zeros(k),
                   next_hidden=torch.zeros(1, k, 8), env_ids=ids)
            st.complete(rewards=torch.tensor(ids, dtype=torch.float32) + 10 * st.lengths[ids],
                        next_depth=torch.zeros(k, SIZE, SIZE, 1), next_goal=torch.zeros(k, 2),
                        next_masks=torch.ones(k), env_ids=ids)
        assert st.lengths.tolist() == [3, 1, 2]
        # env 0's rewards at slots 0, 1, 2; env 2's at 0, 1; env 1's at 0 only
        assert st.rewards[:3, 0].tolist() == [0.0, 10.0, 20.0]
        assert st.rewards[:2, 2].tolist() == [2.0, 12.0]
        assert st.rewards[:1, 1].tolist() == [1.0]
        assert st.valid_mask().tolist() == [[1, 1, 1], [1, 0, 1], [1, 0, 0]]
        # one env a mini-batch: each ends at its own env's last step, no padding run through
        adv = torch.zeros(3, 3)
        batches = list(st.mini_batches(adv, adv, 3, generator=torch.Generator().manual_seed(0)))
        assert sorted(b.actions.shape[0] for b in batches) == [1, 2, 3]
        assert all(b.valid.tolist() == [1.0] * b.actions.shape[0] for b in batches)
        # two batches: each as long as its longest env, the others padded
        batches = list(st.mini_batches(adv, adv, 2, generator=torch.Generator().manual_seed(0)))
        envs = torch.randperm(3, generator=torch.Generator().manual_seed(0)).chunk(2)
        assert [b.actions.shape[0] for b in batches] == [
            int(st.lengths[idx].max()) * len(idx) for idx in envs]
        assert [int(b.valid.sum()) for b in batches] == [int(st.lengths[idx].sum()) for idx in envs]

    def test_after_update_carries_each_envs_pending_step_to_slot_zero(self):
        st = _storage(_policy(), num_steps=4, n=2)
        st.act(actions=torch.tensor([1, 3]), log_probs=torch.tensor([-0.5, -1.5]),
               values=torch.tensor([0.25, 0.75]), next_hidden=torch.zeros(1, 2, 8))
        st.complete(rewards=torch.zeros(2), next_depth=torch.zeros(2, SIZE, SIZE, 1),
                    next_goal=torch.tensor([[1.0, 2.0], [3.0, 4.0]]), next_masks=torch.ones(2))
        # env 1 takes a second step and leaves a third pending; env 0 leaves its second pending
        st.act(actions=torch.tensor([2, 2]), log_probs=torch.tensor([-0.1, -0.2]),
               values=torch.tensor([5.0, 6.0]), next_hidden=torch.ones(1, 2, 8))
        st.complete(rewards=torch.zeros(1), next_depth=torch.zeros(1, SIZE, SIZE, 1),
                    next_goal=torch.tensor([[7.0, 8.0]]), next_masks=torch.ones(1), env_ids=[1])
        st.act(actions=torch.tensor([0]), log_probs=torch.tensor([-0.3]), values=torch.tensor([9.0]),
               next_hidden=torch.ones(1, 1, 8), env_ids=[1])
        st.after_update()
        assert st.lengths.tolist() == [0, 0]
        assert st.actions[0].tolist() == [2, 0] and st.values[0].tolist() == [5.0, 9.0]
        assert st.goal[0].tolist() == [[1.0, 2.0], [7.0, 8.0]]
        assert st.prev_actions[0].tolist() == [1, 2]

    def test_a_full_env_refuses_another_step(self):
        st = _storage(_policy(), num_steps=1, n=2)
        for _ in range(2):
            st.act(actions=torch.zeros(1, dtype=torch.long), log_probs=torch.zeros(1),
                   values=torch.zeros(1), next_hidden=torch.zeros(1, 1, 8), env_ids=[0])
            if st.lengths[0] == 1:
                with pytest.raises(RuntimeError, match="full"):
                    st.complete(rewards=torch.zeros(1), next_depth=torch.zeros(1, SIZE, SIZE, 1),
                                next_goal=torch.zeros(1, 2), next_masks=torch.ones(1), env_ids=[0])
                return
            st.complete(rewards=torch.zeros(1), next_depth=torch.zeros(1, SIZE, SIZE, 1),
                        next_goal=torch.zeros(1, 2), next_masks=torch.ones(1), env_ids=[0])


class TestGAEOverVariableSegments:
    def test_each_segment_bootstraps_from_the_value_after_its_own_last_step(self):
        # env 0: 3 steps, an episode ends after step 1; env 1: 1 step (cut), bootstrap values[1].
        g, lam = 0.5, 0.5
        rewards = torch.tensor([[1.0, 2.0], [1.0, 99.0], [1.0, 99.0]])
        values = torch.tensor([[0.5, 1.0], [0.5, 4.0], [0.5, 99.0], [2.0, 99.0]])
        not_done = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
        adv, ret = compute_gae(rewards, values, not_done, gamma=g, lam=lam,
                               lengths=torch.tensor([3, 1]))
        # env 0 by hand: d2 = 1 + .5*2 - .5 = 1.5; d1 = 1 + 0 - .5 = .5 (episode ends);
        # d0 = 1 + .5*.5 - .5 = .75; A2 = 1.5, A1 = .5, A0 = .75 + .25*.5 = .875
        assert adv[:, 0].tolist() == [0.875, 0.5, 1.5]
        # env 1: d0 = 2 + .5*4 - 1 = 3; its padded slots get 0
        assert adv[:, 1].tolist() == [3.0, 0.0, 0.0]
        assert ret[0].tolist() == [1.375, 4.0]

    def test_equal_lengths_give_the_lock_step_result(self):
        g = torch.Generator().manual_seed(1)
        r, v, nd = torch.rand(5, 3, generator=g), torch.rand(6, 3, generator=g), \
            (torch.rand(5, 3, generator=g) > 0.3).float()
        a1, r1 = compute_gae(r, v, nd, gamma=0.99, lam=0.95)
        a2, r2 = compute_gae(r, v, nd, gamma=0.99, lam=0.95, lengths=torch.tensor([5, 5, 5]))
        assert torch.equal(a1, a2) and torch.equal(r1, r2)


def test_masked_losses_equal_the_losses_of_the_valid_samples_alone():
    g = torch.Generator().manual_seed(3)
    n = 12
    fields = {k: torch.randn(n, generator=g) for k in
              ("log_probs", "old_log_probs", "advantages", "values", "old_values", "returns",
               "entropy")}
    valid = torch.tensor([1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1], dtype=torch.float32)
    masked_fields = dict(fields)
    masked_fields["log_probs"] = torch.where(valid > 0, fields["log_probs"], torch.tensor(300.0))
    masked = ppo_losses(**masked_fields, clip=0.2, value_coef=0.5, entropy_coef=0.01, valid=valid)
    keep = valid > 0
    alone = ppo_losses(**{k: v[keep] for k, v in fields.items()}, clip=0.2, value_coef=0.5,
                       entropy_coef=0.01)
    for name in ("total", "policy", "value", "entropy", "clip_fraction", "approx_kl"):
        torch.testing.assert_close(getattr(masked, name), getattr(alone, name))


class TestVERCollector:
    def test_fast_envs_contribute_more_steps_and_the_rollout_ends_at_num_steps_times_envs(self):
        # env 0 steps in 3 virtual seconds, the others in 1: after t seconds 3t + t//3 steps;
        # the first count >= 4 * 6 = 24 is at t = 8 (24 + 2 = 26).
        got, st, pool, strategy, _, _ = _collect([3.0, 1.0, 1.0, 1.0], num_steps=6)
        assert st.lengths.tolist() == [2, 8, 8, 8]
        assert got.frames == 26 and got.agreed_frames == 24
        assert strategy.calls == [1, 2, 3, 4, 5, 6] and strategy.ended == []

    def test_every_env_leaves_a_step_in_flight_whose_value_bootstraps_its_segment(self):
        got, st, pool, _, _, pol = _collect([3.0, 1.0, 1.0, 1.0], num_steps=6)
        assert pool.in_flight.all()
        last_sent = {}
        for ids, actions in pool.sent:
            for i, a in zip(ids, actions):
                last_sent[int(i)] = int(a)
        for i in range(4):  # the action in flight is the one recorded at slot lengths[i]
            assert st.actions[st.lengths[i], i].item() == last_sent[i]
        # and the value there is the policy's value of that slot's inputs
        cur = st.current()
        with torch.no_grad():
            _, _, values, _ = pol.act(cur["depth"], cur["goal"], cur["prev_actions"], cur["masks"],
                                      cur["h"])
        idx = st.lengths
        torch.testing.assert_close(st.values[idx, torch.arange(4)], values)

    def test_the_next_rollout_starts_with_the_steps_left_in_flight(self):
        pol = _policy()
        pool = VirtualPool([3.0, 1.0, 1.0, 1.0])
        col = VERCollector(pool, num_steps=6, cutoff="full", min_batch=1)
        st = _storage(pol, num_steps=col.storage_steps(), n=4)
        win = EpisodeWindow(4, 10)
        col.collect(pol, st, RecordingStrategy(), win, torch.device("cpu"))
        pending = [st.actions[st.lengths[i], i].item() for i in range(4)]
        st.after_update()
        sent_before = len(pool.sent)
        col.collect(pol, st, RecordingStrategy(), win, torch.device("cpu"))
        assert st.prev_actions[1].tolist() == pending  # slot 1 follows the carried-over step
        # no env was sent a step before its carried-over one came back
        first_new = np.concatenate([ids for ids, _ in pool.sent[sent_before:]])
        assert len(first_new) >= 4

    def test_an_env_holds_at_most_max_env_steps_times_num_steps(self):
        got, st, *_ = _collect([5.0, 1.0, 1.0, 1.0], num_steps=4, max_env_steps=1.25)
        assert int(st.lengths.max()) <= 5 and got.frames >= 16

    def test_ver_over_variable_segments_trains(self):
        got, st, pool, _, _, pol = _collect([3.0, 1.0, 1.0, 1.0], num_steps=6)
        opt = torch.optim.Adam(pol.parameters(), lr=1e-3)
        before = [p.detach().clone() for p in pol.parameters()]
        stats = ppo_update(pol, opt, st, gamma=0.99, lam=0.95, clip=0.2, ppo_epoch=1,
                           num_mini_batch=2, value_coef=0.5, entropy_coef=0.01, max_grad_norm=0.5)
        assert all(np.isfinite(v) for v in stats.values())
        assert any(not torch.equal(a, b) for a, b in zip(before, pol.parameters()))

    def test_ready_envs_are_batched_for_inference(self):
        # Envs of slightly different speeds drift apart: sent one by one they would need one
        # forward pass per step; with min_batch 2 they go in twos (a lone env waits at most half
        # a typical step, and never while no other env steps).
        times = [1.0, 1.1, 1.2, 1.3]
        _, _, one, *_ = _collect(times, num_steps=12, min_batch=1)
        got, st, two, *_ = _collect(times, num_steps=12, min_batch=2)
        single = [len(ids) for ids, _ in one.sent].count(1)
        sizes = [len(ids) for ids, _ in two.sent]
        assert single > 35 and sizes.count(1) <= 1  # the one: the final dispatch of a lone env
        assert len(two.sent) < 0.6 * len(one.sent)
        assert got.frames >= 48 and int(st.lengths.max()) <= 24

    def test_ver_needs_an_env_pool(self):
        with pytest.raises(ValueError, match="env.workers=process"):
            make_collector(Collection("ver", "inprocess"), object(), num_steps=4)


class TestEnvStepTimes:
    """What VER collection puts into the per-worker view's env step times and stalls."""

    def test_each_envs_step_is_timed_from_its_action_sent_to_its_result_read(self):
        times = EnvStepTimes(4)
        got, st, *_ = _collect([3.0, 1.0, 1.0, 1.0], num_steps=6, env_times=times)
        assert times.count.tolist() == st.lengths.tolist()
        # median env 1 s, the slowest env 0 at 3 s, no stall (a slow env is not a stalling one)
        assert times.figures().tolist() == [1000.0, 3000.0, 0.0, 0.0, 0.0]

    def test_a_step_read_only_after_the_update_is_not_timed(self):
        pol = _policy()
        pool = VirtualPool([3.0, 1.0, 1.0, 1.0])
        times = EnvStepTimes(4)
        col = VERCollector(pool, num_steps=6, cutoff="full", min_batch=1, env_times=times,
                           clock=lambda: pool.clock)
        st = _storage(pol, num_steps=col.storage_steps(), n=4)
        win = EpisodeWindow(4, 10)
        col.collect(pol, st, RecordingStrategy(), win, torch.device("cpu"))
        first = st.lengths.clone()
        st.after_update()
        pool.clock += 60.0  # a 60 s update: the steps left in flight are read only after it
        pool.finish[pool.in_flight] += 60.0
        col.collect(pol, st, RecordingStrategy(), win, torch.device("cpu"))
        assert times.count.tolist() == (first + st.lengths - 1).tolist()
        assert times.stalls == 0 and times.figures()[1] == 3000.0


class TestCutoffRule:
    def test_stops_once_the_envs_with_room_produce_too_slowly(self):
        rule = CutoffRule(4, min_frames=4)
        rule.observe_steps(np.arange(4), np.array([0.3, 0.1, 0.1, 0.1]))
        rule.observe_update(1.0)
        room = np.array([True, False, False, False])  # only the slow env can still add steps
        # rate 1/0.3 = 3.33 steps/s; (t + L) = 2 s: 6.67 < 10 collected -> stop
        assert rule.should_stop(frames=10, elapsed_s=1.0, has_room=room)
        # 20 steps/s with every env: 40 > 10 -> go on
        assert not rule.should_stop(frames=10, elapsed_s=1.0, has_room=np.ones(4, bool))

    def test_never_stops_before_an_update_time_is_known_or_below_min_frames(self):
        rule = CutoffRule(2, min_frames=8)
        rule.observe_steps(np.arange(2), np.array([10.0, 10.0]))
        assert not rule.should_stop(frames=100, elapsed_s=1.0, has_room=np.ones(2, bool))
        rule.observe_update(1.0)
        assert not rule.should_stop(frames=7, elapsed_s=1.0, has_room=np.ones(2, bool))
        assert rule.should_stop(frames=8, elapsed_s=1.0, has_room=np.ones(2, bool))

    def test_a_step_in_flight_longer_than_usual_counts_at_its_own_time(self):
        rule = CutoffRule(2, min_frames=1)
        rule.observe_steps(np.arange(2), np.array([0.1, 0.1]))
        rule.observe_update(0.0)
        room = np.ones(2, bool)
        assert rule.rate(room) == pytest.approx(20.0)
        assert rule.rate(room, now_waiting=np.array([1.0, 0.0])) == pytest.approx(11.0)

    def test_the_auto_cutoff_ends_a_rollout_that_waits_on_a_stalled_env(self):
        # With capacity num_steps (max_env_steps 1) the fast envs fill at t = 6; then only the
        # 10x slower env has room and the rule stops instead of waiting 60 virtual seconds.
        pol = _policy()
        pool = VirtualPool([10.0, 1.0, 1.0, 1.0])
        col = VERCollector(pool, num_steps=6, max_env_steps=1.0, cutoff="auto", min_batch=1,
                           clock=lambda: pool.clock)
        col.rule.observe_update(1.0)
        col.rule.step_s[:] = [10.0, 1.0, 1.0, 1.0]  # as measured in earlier rollouts (seconds)
        st = _storage(pol, num_steps=col.storage_steps(), n=4)
        strategy = RecordingStrategy()
        got = col.collect(pol, st, strategy, EpisodeWindow(4, 10), torch.device("cpu"))
        assert st.lengths.tolist()[1:] == [6, 6, 6] and st.lengths[0] < 6
        assert col.cut_short == 1 and got.cut_short and strategy.ended == [got.frames // 4]

    def test_a_step_the_update_outlasted_is_neither_slow_nor_stalled_for_the_rule(self):
        # Equal envs, 1 s a step; the steps left in flight are read only after a 60 s update.
        # Timed from their send, they would make every env look 60x slower (and in flight for a
        # minute) and the rule would end the next rollout at its minimum.
        pol = _policy()
        pool = VirtualPool([1.0, 1.0, 1.0, 1.0])
        col = VERCollector(pool, num_steps=6, max_env_steps=1.0, cutoff="auto", min_batch=1,
                           clock=lambda: pool.clock)
        st = _storage(pol, num_steps=col.storage_steps(), n=4)
        win = EpisodeWindow(4, 10)
        col.collect(pol, st, RecordingStrategy(), win, torch.device("cpu"))
        st.after_update()
        col.observe_update(1.0)
        pool.clock += 60.0
        pool.finish[pool.in_flight] += 60.0
        got = col.collect(pol, st, RecordingStrategy(), win, torch.device("cpu"))
        assert col.rule.step_s.tolist() == [1.0] * 4
        assert col.cut_short == 0 and not got.cut_short and st.lengths.tolist() == [6] * 4


class TestTrainerOnOneRank:
    """The trainer with rollout.mode=ver on one process (multi-rank: tests/mpi/trainer_modes.py)."""

    def _train(self, tmp_path, *extra):
        from pathlib import Path

        from wagma_rl.config import load_config
        from wagma_rl.rl.config import DDPPOConfig
        from wagma_rl.rl.trainer import train

        quick = Path(__file__).resolve().parents[1] / "configs" / "quick_pointnav.yaml"
        cfg = load_config(DDPPOConfig, quick, [f"run.dir={tmp_path}", "run.total_frames=256",
                                               "rollout.mode=ver", *extra])
        return train(cfg)

    def test_over_the_in_process_env_ver_steps_every_env_together(self, tmp_path):
        res = self._train(tmp_path, "env.workers=inprocess")
        assert res.frames == 256 and all(len(set(e)) == 1 for e in res.env_steps)

    def test_over_worker_processes_a_slow_env_contributes_fewer_steps(self, tmp_path):
        res = self._train(tmp_path, "heterogeneity.slow_envs=[1]", "heterogeneity.env_step_s=0.002",
                          "heterogeneity.env_slowdown=5.0", "rollout.min_batch=1")
        fast, slow = (sum(e[i] for e in res.env_steps) for i in (0, 1))
        assert slow < fast and res.frames == sum(res.rollout_frames)
