"""The scale simulator (wagma_rl.scale): analytic checks, protocol details, trace replay, CLI."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from wagma_rl.rl.trace import TraceWriter, read_trace
from wagma_rl.scale import MODES, Setup, fit_trace, get_network, parse_rollout, run, simulate
from wagma_rl.scale.simulate import _Groups

IDEAL, IB = get_network("ideal"), get_network("ib100")


def setup(workers, updates, network=IDEAL, **kw) -> Setup:
    """A job with the project's rollout shape (4 envs x 64 steps) unless ``kw`` says otherwise."""
    return Setup(workers=workers, updates=updates, network=network,
                 **{"num_envs": 4, "num_steps": 64, **kw})


class TestConstantRollouts:
    """Equal, constant compute times: no worker ever waits, so every mode runs at the same
    throughput and differs only by what its communication costs."""

    @pytest.mark.parametrize("mode", MODES)
    def test_free_network_gives_every_mode_the_same_throughput(self, mode):
        s = setup(16, 30, group_size=4, sync_period=5)
        r = run([mode], s, parse_rollout("const:0.75", ppo_s=0.25))[mode]
        assert r["update_s"] == pytest.approx(1.0, rel=1e-12)
        assert r["frames_per_s"] == pytest.approx(16 * 256 / 1.0, rel=1e-12)
        assert r["wait_share"] == 0.0 and r["late_share"] == 0.0

    def test_with_a_network_the_difference_is_exactly_the_communication(self):
        p, u, s_, tau, n = 16, 30, 4, 5, 4 * 169_981
        s = setup(p, u, IB, group_size=s_, sync_period=tau)
        res = run(MODES, s, parse_rollout("const:0.75", ppo_s=0.25))
        n_global = u // tau
        expected = {
            "allreduce": u * (IB.barrier(p) + 4 * IB.allreduce(p, n)),
            "preempt": u * (IB.barrier(p) + 4 * IB.allreduce(p, n)),
            "wagma": (u - n_global) * IB.group(s_, n) + n_global * (IB.barrier(p) + IB.group(p, n)),
            "dpsgd": (u - n_global) * IB.gossip(p, n)
            + n_global * (IB.barrier(p) + IB.allreduce(p, n)),
            "local_sgd": n_global * (IB.barrier(p) + IB.allreduce(p, n)),
        }
        for mode, comm in expected.items():
            assert res[mode]["update_s"] * u == pytest.approx(u * 1.0 + comm, rel=1e-12), mode


class TestOverlappedGlobals:
    def test_a_stall_before_a_global_is_waited_for_only_at_the_next_global(self):
        # 2 workers, 1 s per update; worker 1 stalls 3 s in update 0; globals at t = 1 and 3.
        collect = np.full((4, 2), 0.75)
        collect[0, 1] += 3.0
        ppo = np.full((4, 2), 0.25)
        s = setup(2, 4, group_size=1, sync_period=2, overlap_sync_every=100)
        blocking = simulate("wagma", s, collect, ppo)
        overlap = simulate("wagma_overlap", s, collect, ppo)
        # Blocking: worker 0 waits 3 s at global 1. Overlap: it runs on and waits at global 3 for
        # global 1's average (complete at 5 s), arriving at 4 s: 1 s. Per worker per update:
        assert blocking["wait_s"] == pytest.approx(3.0 / 8, abs=1e-12)
        assert overlap["wait_s"] == pytest.approx(1.0 / 8, abs=1e-12)
        assert overlap["update_s"] == blocking["update_s"] == pytest.approx(7.0 / 4, abs=1e-12)

    def test_every_nth_global_is_a_synchronised_point(self):
        collect = np.full((4, 2), 0.75)
        collect[0, 1] += 3.0
        ppo = np.full((4, 2), 0.25)
        s = setup(2, 4, group_size=1, sync_period=2, overlap_sync_every=1)
        # Synchronising after every global waits as a blocking global does.
        assert simulate("wagma_overlap", s, collect, ppo)["wait_s"] == pytest.approx(3.0 / 8, abs=1e-12)


class TestIidRollouts:
    @pytest.mark.parametrize("workers", [1, 4, 64])
    def test_allreduce_update_time_is_the_expected_maximum(self, workers):
        """Exponential times: E[max of N] = H_N * mean. The per-update maximum has variance
        sum_{k<=N} 1/k^2 <= pi^2/6 (in mean^2), so the mean of U = 20000 updates is within
        4 standard deviations, 4 * sqrt(pi^2/6 / U) = 0.036 means, except with probability
        < 1e-4 (and the seed is fixed)."""
        u, mean = 20_000, 2.0
        r = run(["allreduce"], setup(workers, u), parse_rollout(f"exp:{mean}"), seed=3)["allreduce"]
        harmonic = sum(1 / k for k in range(1, workers + 1))
        assert abs(r["update_s"] / mean - harmonic) < 4 * math.sqrt(math.pi ** 2 / 6 / u)

    def test_local_sgd_without_global_average_runs_at_the_mean(self):
        """No synchronisation at all: each worker's wall is the sum of its own times, and the
        job's is the slowest sum, within a few standard deviations of U * mean."""
        u, p = 5000, 8
        r = run(["local_sgd"], setup(p, u, sync_period=10 ** 9), parse_rollout("exp:1.0"),
                seed=1)["local_sgd"]
        assert r["wait_share"] == 0.0
        assert 1.0 <= r["update_s"] < 1.0 + 4 * math.sqrt(1.0 / u) * 2


class TestPreemption:
    def test_straggler_stops_at_the_step_after_the_threshold_but_not_before_a_quarter(self):
        # 5 workers, sync_frac 0.6: the 3rd finisher (1.0 s) fills the counter; the straggler
        # needs 4 s for 64 steps (1/16 s a step) and stops after step 16 = max(16, ceil(1 / (1/16)))
        collect = np.array([[1.0, 1.0, 1.0, 1.0, 4.0]])
        r = simulate("preempt", setup(5, 1), collect, np.zeros_like(collect))
        assert r["update_s"] == pytest.approx(1.0)
        assert r["rollout_steps_mean"] == pytest.approx((4 * 64 + 16) / 5)
        assert r["preempted_share"] == pytest.approx(0.2)

    def test_the_quarter_minimum_holds_a_very_slow_worker(self):
        collect = np.array([[1.0, 1.0, 1.0, 1.0, 40.0]])  # a quarter of 40 s is 10 s
        r = simulate("preempt", setup(5, 1), collect, np.zeros_like(collect))
        assert r["update_s"] == pytest.approx(10.0)
        assert r["rollout_steps_mean"] == pytest.approx((4 * 64 + 16) / 5)

    def test_a_worker_inside_a_stall_finishes_the_stalled_step_first(self):
        from wagma_rl.scale.rollout import Draw
        # 3 workers, sync_frac 0.6: 2 must finish. Workers 0 and 1 take 1.0 s; worker 2 has a base
        # of 0.64 s (10 ms a step) and one 1 s stall at a random step k: it starts at 0.01 k
        # <= 0.63 s and ends after 1.0 s, so worker 2 is inside it when the counter fills at
        # 1.0 s and stops after step max(16, k + 1), at 0.01 max(16, k + 1) + 1.0 s.
        collect = np.array([[1.0, 1.0, 1.64]])
        draw = Draw(collect, np.zeros_like(collect), base=np.array([1.0, 1.0, 0.64]), lump_s=1.0,
                    rng=np.random.default_rng(5))
        durations = np.diff(draw.step_ends(0, 64)[2], prepend=0.0)
        assert sorted(durations.round(6).tolist()) == [0.01] * 63 + [1.01]
        k = int(np.argmax(durations))
        draw.rng = np.random.default_rng(5)  # the same stall step in the simulation
        r = simulate("preempt", setup(3, 1, sync_frac=0.6), draw)
        assert r["rollout_steps_mean"] == pytest.approx((64 + 64 + max(16, k + 1)) / 3)
        assert r["update_s"] == pytest.approx(0.01 * max(16, k + 1) + 1.0)

    def test_a_rollout_shorter_than_a_stall_has_no_stall_and_no_negative_step(self):
        from wagma_rl.scale.rollout import Draw
        # Traces and fits take a rank's fastest rollout as its base, and the time above it comes in
        # whole 1 s stalls: 0.7 s above a 0.1 s base holds none (rounding it up to one stall gave
        # steps of (0.8 - 1.0) / 64 s), 2.0 s above a 0.5 s base holds two.
        collect = np.array([[0.8, 2.5]])
        draw = Draw(collect, np.zeros_like(collect), base=np.array([0.1, 0.5]), lump_s=1.0,
                    rng=np.random.default_rng(0))
        durations = np.diff(draw.step_ends(0, 64), axis=1, prepend=0.0)
        assert durations.min() >= 0.0
        assert durations.sum(axis=1) == pytest.approx([0.8, 2.5])
        assert (durations >= 1.0).sum(axis=1).tolist() == [0, 2]

    def test_allreduce_waits_for_the_straggler(self):
        collect = np.array([[1.0, 1.0, 1.0, 1.0, 4.0]])
        r = simulate("allreduce", setup(5, 1), collect, np.zeros_like(collect))
        assert r["update_s"] == pytest.approx(4.0)
        assert r["wait_share"] == pytest.approx(4 * 3.0 / (5 * 4.0))


class TestWagma:
    def test_groups_are_the_native_rule(self):
        from native_coll import group_of
        for p, s in ((16, 4), (12, 4), (7, 2)):
            g = _Groups(p, s)
            for t in range(6):
                order, starts, sizes, gid = g.at(t)
                for r in range(p):
                    lo = starts[gid[r]]
                    assert tuple(sorted(order[lo:lo + sizes[gid[r]]])) == group_of(p, s, t, r)

    def test_a_slow_member_is_late_and_its_staleness_grows_as_the_engine_counts_it(self):
        # Worker 1 takes 2 s per update, worker 0 1 s. Group t activates when worker 0 arrives
        # (t + 1 s); worker 1 has then returned from the calls k with 2 (k + 1) <= t + 1, so its
        # published model is t - floor((t - 1) / 2) iterations behind (1 at t = 0).
        u = 9
        collect = np.tile([1.0, 2.0], (u, 1))
        r = simulate("wagma", setup(2, u, group_size=2, sync_period=100), collect,
                     np.zeros_like(collect))
        behind = [1] + [t - (t - 1) // 2 for t in range(1, u)]
        counts = {str(v): 2 * behind.count(v) / (2 * u) for v in sorted(set(behind))}
        assert r["staleness"] == pytest.approx(counts)
        assert r["late_share"] == 0.5
        assert r["wait_share"] == 0.0  # nobody waits outside the global average
        assert r["update_s"] == pytest.approx(2.0)

    def test_the_global_average_waits_for_the_slowest(self):
        collect = np.tile([1.0, 2.0], (4, 1))
        r = simulate("wagma", setup(2, 4, group_size=2, sync_period=2), collect,
                     np.zeros_like(collect))
        # t=0 group (no wait), t=1 global: worker 0 arrives at 2, worker 1 at 4 -> waits 2 s;
        # then the same again: 2 waits of 2 s in 8 s of wall for 2 workers
        assert r["update_s"] == pytest.approx(2.0)
        assert r["wait_share"] == pytest.approx(4.0 / (2 * 8.0))


E = 1 / 64  # a nominal env step: 64 steps in 1 s (a power of two: sums of steps are exact)


def _env_workload(spec="const:1.0", **kw):
    """Every rank's env 0 three times slower than the other three, unless ``kw`` says otherwise."""
    return parse_rollout(spec, **{"slow_envs": [0], "env_slowdown": 3.0, **kw})


class TestWithinRank:
    """Inside a rank: 4 envs, 64 steps each per full rollout (256 frames), env 0 three times
    slower (3/64 s a step against 1/64 s)."""

    def test_lockstep_waits_for_the_slowest_env_at_every_step(self):
        r = run(["allreduce"], setup(2, 3), _env_workload(ppo_s=0.5))["allreduce"]
        assert r["update_s"] == pytest.approx(64 * 3 * E + 0.5, rel=1e-12)
        assert r["frames_per_s"] == pytest.approx(2 * 256 / (3.0 + 0.5), rel=1e-12)

    def test_ver_collects_at_the_sum_of_the_env_rates(self):
        # env i's k-th step ends at k tau_i: 3 floor(t / E) + floor(t / 3E) steps by t. 256
        # steps / (3 / E + 1 / 3E) = 76.8 E; the 256th step ends at 77 E (231 + 25).
        s = setup(1, 1, collection="ver", cutoff="full")
        r = run(["allreduce"], s, _env_workload())["allreduce"]
        assert r["update_s"] == 77 * E
        assert r["frames_per_s"] == 256 / (77 * E)

    def test_ver_where_an_env_holds_only_num_steps_is_as_slow_as_lockstep(self):
        # The fast envs are full at 64 E; the slow one needs 64 steps of 3 E for the rest.
        s = setup(1, 1, collection="ver", cutoff="full", max_env_steps=1.0)
        assert run(["allreduce"], s, _env_workload())["allreduce"]["update_s"] == 3.0

    def test_the_cutoff_ends_the_rollout_once_only_slow_envs_have_room(self):
        # Update 0 (no update time observed yet: no cut-off) ends at 3 s, every env full; PPO
        # takes L = 2E. Every env's next step starts at the cut and goes on while the rank
        # learns: the fast ones are in at the start of update 1, the slow one at E; the fast
        # envs then step at 0, E, .., 63E (full), the slow one at E, 4E, .., 61E (21 steps).
        # At 63E only the slow env has room: R (t + L) = (65E / 3E) < 192 + 21, so the rule
        # stops there with 213 frames (not before: while the fast envs have room, R (t + L)
        # exceeds S by about R L).
        s = setup(1, 2, collection="ver", max_env_steps=1.0)
        r = run(["allreduce"], s, _env_workload(ppo_s=2 * E))["allreduce"]
        wall = (3.0 + 2 * E) + (63 * E + 2 * E * 213 / 256)
        assert r["update_s"] == pytest.approx(wall / 2, rel=1e-12)
        assert r["frames_per_s"] == pytest.approx((256 + 213) / wall, rel=1e-12)
        assert r["cut_share"] == 0.5

    def test_ver_overlaps_the_step_in_flight_with_learning(self):
        # Equal envs, no cut-off: each rollout after the first starts with the step that ran
        # while the rank learned (0.5 s), so it takes 63 steps' time, not 64.
        s = setup(1, 4, collection="ver", cutoff="full")
        r = run(["allreduce"], s, parse_rollout("const:1.0", ppo_s=0.5))["allreduce"]
        assert r["update_s"] == pytest.approx((1.5 + 3 * (63 * E + 0.5)) / 4, rel=1e-12)

    def test_preemption_stops_ver_at_a_vector_step(self):
        # As in lock-step (TestPreemption): the straggler's 4 envs step every 1/16 s; the counter
        # fills at 1 s, when its 16th vector step (64 frames) ends.
        collect = np.array([[1.0, 1.0, 1.0, 1.0, 4.0]])
        r = simulate("preempt", setup(5, 1, collection="ver", cutoff="full"), collect,
                     np.zeros_like(collect))
        assert r["update_s"] == pytest.approx(1.0)
        assert r["rollout_steps_mean"] == pytest.approx((4 * 64 + 16) / 5)

    def test_every_collection_meets_the_same_env_stalls(self):
        from wagma_rl.scale.rollout import Draw
        draw = Draw(np.ones((2, 8)), np.zeros((2, 8)), env_stall_prob=0.1, env_stall_s=1.0,
                    env_seed=3)
        even = np.full(8, E)
        lockstep, ver = draw.env_steps(1, even, 4, 64), draw.env_steps(1, even, 4, 129)
        assert np.array_equal(lockstep, ver[:, :, :64])
        assert 0 < (lockstep > E).mean() < 0.2

    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_the_vectorised_model_is_the_collectors_loop_step_by_step(self, seed):
        """Against :func:`_ver_by_steps`, a plain loop over each env's steps that follows
        wagma_rl/rl/collect.py's VERCollector (local SGD without averaging: every worker alone)."""
        from wagma_rl.scale.rollout import Draw
        p, u, envs, n = 3, 12, 4, 16
        rng = np.random.default_rng(seed)
        collect = rng.lognormal(-0.5, 0.3, (u, p))
        ppo = rng.uniform(0.05, 0.2, (u, p))

        def draw():
            return Draw(collect, ppo, base=0.8 * collect.min(axis=0), lump_s=0.05,
                        rng=np.random.default_rng(seed), slow_envs=(1,), env_slowdown=2.5,
                        env_stall_prob=0.05, env_stall_s=0.3, env_seed=seed)
        s = setup(p, u, num_envs=envs, num_steps=n, collection="ver", sync_period=10 ** 9)
        r = simulate("local_sgd", s, draw())
        walls, frames, cuts = _ver_by_steps(draw(), u, envs=envs, n=n, cap=2 * n,
                                            min_frames=math.ceil(0.25 * envs * n))
        assert r["update_s"] == pytest.approx(max(walls) / u, rel=1e-9)
        assert r["frames_per_s"] == pytest.approx(sum(frames) / max(walls), rel=1e-9)
        assert r["cut_share"] == pytest.approx(cuts / (p * u))
        assert 0 < cuts < p * u


def _ver_by_steps(draw, updates, *, envs, n, cap, min_frames):
    """Each worker's wall time, frames and cut-off count, one env step at a time."""
    target = envs * n
    parts = [draw.step_parts(t, n) for t in range(updates)]
    durs = [draw.env_steps(t, parts[t][0], envs, cap + 1) for t in range(updates)]
    walls, frames, cuts = [], [], 0
    for w in range(draw.collect.shape[1]):
        sent, done = [0.0] * envs, [durs[0][w, i, 0] for i in range(envs)]
        tau, learn, wall, total = [math.nan] * envs, math.nan, 0.0, 0
        for t_ in range(updates):
            d, lumps = durs[t_][w], parts[t_][1][w]
            nxt, started, count = [max(x, 0.0) for x in done], list(sent), [0] * envs
            got, reported, paused = 0, 0, 0.0
            while True:
                now = min(x for x in nxt if x is not None)
                for i in range(envs):
                    if nxt[i] is not None and nxt[i] == now:
                        obs = now - started[i]
                        tau[i] = obs if math.isnan(tau[i]) else 0.8 * tau[i] + 0.2 * obs
                        count[i] += 1
                        got += 1
                        started[i], nxt[i] = (now, now + d[i, count[i]]) if count[i] < cap \
                            else (started[i], None)
                while reported < min(got // envs, n):
                    paused += lumps[reported]
                    reported += 1
                clock, cut = now + paused, False
                if got >= target:
                    break
                if got >= min_frames and not math.isnan(learn):
                    known = [x for x in tau if not math.isnan(x)]
                    mean = sum(known) / len(known)
                    rate = sum(1.0 / max(mean if math.isnan(tau[i]) else tau[i],
                                         now - started[i], 1e-9)
                               for i in range(envs) if count[i] < cap)
                    if rate * (clock + learn) < got:
                        cut = True
                        break
            cuts += cut
            compute = draw.ppo[t_, w] * got / target
            learn = compute if math.isnan(learn) else 0.8 * learn + 0.2 * compute
            for i in range(envs):
                s_i, e_i = (started[i], nxt[i]) if count[i] < cap else (now, now + d[i, cap])
                sent[i], done[i] = s_i - now - compute, e_i - now - compute
            wall += clock + compute
            total += got
        walls.append(wall)
        frames.append(total)
    return walls, frames, cuts


class TestDpsgd:
    def test_a_slow_worker_delays_its_neighbours_hop_by_hop(self):
        # 8 workers in a ring, worker 0 twice as slow: after t updates the slowness has spread
        # t hops (handshake then exchange: two hops per update), so everyone runs at its pace.
        u = 40
        collect = np.ones((u, 8))
        collect[:, 0] = 2.0
        r = simulate("dpsgd", setup(8, u, sync_period=10 ** 9), collect, np.zeros_like(collect))
        assert r["update_s"] == pytest.approx(2.0)
        assert r["wait_share"] > 0.4


class TestTraces:
    def _write(self, tmp_path, collect, ppo, steps=None):
        for rank in range(collect.shape[1]):
            w = TraceWriter(tmp_path, rank=rank, num_steps=64)
            for u in range(collect.shape[0]):
                sync = SimpleNamespace(comm_s=0.0, wait_s=0.0, staleness=0.0, stale=0, late=False,
                                       preempted=False, synced=True, group=(rank,))
                st = 64 if steps is None else steps[u, rank]
                w.add(u, collect_s=collect[u, rank], update_s=ppo[u, rank], steps=st, sync=sync)
            w.close()
        return tmp_path / "trace"

    def test_replay_reproduces_the_recorded_times(self, tmp_path):
        rng = np.random.default_rng(0)
        collect, ppo = rng.uniform(0.5, 1.5, (12, 4)).round(4), rng.uniform(0.1, 0.2, (12, 4)).round(4)
        path = self._write(tmp_path, collect, ppo)
        r = run(["allreduce"], setup(4, 12), parse_rollout(f"trace:{path}"))["allreduce"]
        assert r["update_s"] == pytest.approx((collect.max(axis=1) + ppo.max(axis=1)).mean())

    def test_a_preempted_rollout_is_replayed_at_its_full_length(self, tmp_path):
        collect, ppo = np.full((1, 2), 0.5), np.zeros((1, 2))
        path = self._write(tmp_path, collect, ppo, steps=np.array([[64, 16]]))
        draw = parse_rollout(f"trace:{path}").draw(np.random.default_rng(0), 1, 2)
        assert draw.collect.tolist() == [[0.5, 2.0]]

    def test_frames_per_update_come_from_the_trace_and_its_run_config(self, tmp_path):
        # A run of 3 envs x 16 steps (48 frames per update), 2 ranks, 1 s per update; the
        # simulator used to count 512 frames per update whatever the run was.
        for rank in range(2):
            w = TraceWriter(tmp_path, rank=rank, num_steps=16)
            sync = SimpleNamespace(comm_s=0.0, wait_s=0.0, staleness=0.0, stale=0, late=False,
                                   preempted=False, synced=True, group=(rank,))
            for u in range(5):
                w.add(u, collect_s=0.75, update_s=0.25, steps=16, sync=sync)
            w.close()
        (tmp_path / "config.yaml").write_text("env:\n  num_envs: 3\nppo:\n  num_steps: 16\n")
        work = parse_rollout(f"trace:{tmp_path / 'trace'}")
        assert (work.num_steps, work.num_envs) == (16, 3)
        r = run(["allreduce"], setup(2, 5, num_envs=3, num_steps=16), work)["allreduce"]
        assert r["frames_per_s"] == pytest.approx(2 * 48 / 1.0)
        with pytest.raises(ValueError, match="num_envs=3"):
            run(["allreduce"], setup(2, 5, num_envs=4, num_steps=16), work)

    def test_fit_separates_persistent_from_transient_variation(self, tmp_path):
        rng = np.random.default_rng(1)
        persistent = rng.lognormal(0, 0.4, size=(1, 32))
        collect = rng.lognormal(0, 0.2, size=(400, 32)) * persistent
        fit = fit_trace({"collect_s": collect.T, "update_s": np.zeros_like(collect.T),
                         "steps": np.full(collect.T.shape, 64.0),
                         "num_steps": np.full(collect.T.shape, 64.0)})
        assert fit["transient_cv"] == pytest.approx(math.sqrt(math.expm1(0.2 ** 2)), rel=0.05)
        # 32 workers estimate a variance to about sqrt(2/31) = 25% (relative)
        assert fit["persistent_cv"] == pytest.approx(math.sqrt(math.expm1(0.4 ** 2)), rel=0.3)

    def test_reading_a_file_that_is_not_a_trace_says_so(self, tmp_path):
        bad = tmp_path / "rank_00000.csv"
        bad.write_text("a,b\n1,2\n")
        with pytest.raises(ValueError, match="not a trainer trace"):
            read_trace(bad)


class TestCommandLine:
    def _run(self, *args):
        return subprocess.run([sys.executable, "-m", "wagma_rl.scale", *args], capture_output=True,
                              text=True, timeout=120)

    def test_json_has_a_row_per_worker_count_collection_and_mode(self):
        proc = self._run("--modes", "allreduce", "wagma", "--workers", "4", "8", "--updates", "20",
                         "--rollout", "const:1.0", "--network", "ideal", "--rollout-mode",
                         "lockstep", "ver", "--cutoff", "full", "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert [(r["workers"], r["rollout_mode"], r["mode"]) for r in out] == [
            (w, c, m) for w in (4, 8) for c in ("lockstep", "ver") for m in ("allreduce", "wagma")]
        for r in out:  # 4 envs x 128 steps by default; a free network, no PPO time: no waiting
            assert r["frames_per_s"] == pytest.approx(r["workers"] * 512 / r["update_s"])
            assert r["wait_share"] == 0.0
            if r["rollout_mode"] == "lockstep":
                assert r["update_s"] == pytest.approx(1.0)

    def test_a_trace_gives_the_rollout_shape_and_a_missing_config_asks_for_it(self, tmp_path):
        for rank in range(2):
            w = TraceWriter(tmp_path, rank=rank, num_steps=16)
            sync = SimpleNamespace(comm_s=0.0, wait_s=0.0, staleness=0.0, stale=0, late=False,
                                   preempted=False, synced=True, group=(rank,))
            for u in range(3):
                w.add(u, collect_s=0.5, update_s=0.5, steps=16, sync=sync)
            w.close()
        spec = f"trace:{tmp_path / 'trace'}"
        proc = self._run("--rollout", spec, "--workers", "2", "--updates", "3", "--network",
                         "ideal", "--modes", "allreduce")
        assert proc.returncode == 2 and "give --num-envs" in proc.stderr
        proc = self._run("--rollout", spec, "--workers", "2", "--updates", "3", "--network",
                         "ideal", "--modes", "allreduce", "--num-envs", "3", "--json")
        assert json.loads(proc.stdout)[0]["frames_per_s"] == pytest.approx(2 * 3 * 16 / 1.0)

    @pytest.mark.parametrize("args,message", [
        (["--rollout", "gauss:1"], "unknown kind 'gauss'"),
        (["--rollout", "lognormal:1"], "expected 2 non-negative numbers"),
        (["--rollout", "trace:/nonexistent"], "no trace at"),
        (["--workers", "0"], "--workers must be >= 1"),
        (["--workers", "8", "0"], "--workers must be >= 1"),
        (["--slow-envs", "4"], "env indices must be in 0..3"),
        (["--rollout-mode", "async"], "invalid choice"),
        (["--env-slowdown", "0.5"], "--env-slowdown must be >= 1"),
        (["--network", "myrinet"], "invalid choice"),
    ])
    def test_a_bad_argument_is_one_line_without_traceback(self, args, message):
        proc = self._run(*args)
        assert proc.returncode == 2
        assert message in proc.stderr and "Traceback" not in proc.stderr


class TestNodes:
    """The network model on nodes of several ranks (``--ppn``): the node-aware schedule where a
    group's members share nodes evenly, the direct one (its busiest link) elsewhere."""

    TWO = get_network("twonode")

    def test_one_rank_per_node_is_the_single_level_model(self):
        for s in (2, 4, 8):
            assert self.TWO.members(range(s), 1e6) == self.TWO.group(s, 1e6)

    def test_node_aware_cost_is_two_local_and_two_cross_rounds_with_the_link_carrying_2_n_minus_1_over_n(self):
        import dataclasses
        net = dataclasses.replace(self.TWO, ppn=2, beta=8e-9, local_alpha=1e-5, local_beta=1e-9)
        n, g = 2.0 ** 24, net.gap
        expected = (2 * (1e-5 + g) + 2 * (net.alpha + 3 * g) + 2 * 0.5 * n * 1e-9
                    + 2 * 0.75 * n * 8e-9 + (0.5 + 0.75 / 2) * n * net.gamma)
        assert net.members(range(8), n) == pytest.approx(expected, rel=1e-12)
        # the direct schedule over the same 4 nodes x 2: each node puts 2 * 6 / 8 on its link
        direct = 2 * (net.alpha + 7 * g) + 2 * n * (2 * 6 / 8) * 8e-9 + 7 / 8 * n * net.gamma
        assert net.members(range(8), n, node_aware=False) == pytest.approx(direct, rel=1e-12)
        assert net.members(range(8), n) < 0.6 * net.members(range(8), n, node_aware=False)

    def test_uneven_and_single_node_groups_take_the_direct_schedule(self):
        import dataclasses
        net = dataclasses.replace(self.TWO, ppn=2)
        assert net.members([0, 1, 2], 1e6) == net.members([0, 1, 2], 1e6, node_aware=False)
        within = net.members([0, 1], 1e6)
        assert within == pytest.approx(2 * (net.local_alpha + net.gap)
                                       + 0.5 * 1e6 * (2 * net.local_beta + net.gamma), rel=1e-12)

    def test_mpi_allreduce_reduces_within_the_node_first(self):
        import dataclasses
        net = dataclasses.replace(self.TWO, ppn=2)
        flat = dataclasses.replace(self.TWO, ppn=1)
        n = 1e7
        local = 2 * (net.local_alpha + n * net.local_beta) + n * net.gamma
        assert net.allreduce(8, n) == pytest.approx(local + flat.allreduce(4, n), rel=1e-12)

    def test_wagma_groups_pay_the_node_aware_cost_in_the_simulator(self):
        from wagma_rl.scale import network_of
        net = network_of("twonode", ppn=2, link_gbit=1)
        assert net.beta == pytest.approx(8e-9)
        p, u, s_, tau = 8, 8, 4, 4
        res = run(["wagma"], setup(p, u, net, group_size=s_, sync_period=tau),
                  parse_rollout("const:0.75", ppo_s=0.25))["wagma"]
        nbytes = setup(p, u, net).nbytes
        # butterfly at P=8, S=4: t even {0..3} (2 nodes x 2: node-aware), t odd {0,2,4,6} (direct)
        groups = [net.members(range(4), nbytes), net.members([0, 2, 4, 6], nbytes)]
        comm = sum(groups[t % 2] for t in range(u) if (t + 1) % tau)
        comm += (u // tau) * (net.barrier(p) + net.members(range(p), nbytes))
        assert res["update_s"] * u == pytest.approx(u * 1.0 + comm, rel=1e-12)

    def test_cli_takes_ranks_per_node_and_a_link_cap(self):
        out = subprocess.run([sys.executable, "-m", "wagma_rl.scale", "--workers", "8", "--ppn", "2",
                              "--network", "twonode", "--link-gbit", "1", "--updates", "5",
                              "--modes", "wagma"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "twonode, 2 ranks per node, link 1 Gbit/s" in out.stdout
        bad = subprocess.run([sys.executable, "-m", "wagma_rl.scale", "--ppn", "0"],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and "--ppn must be >= 1" in bad.stderr
