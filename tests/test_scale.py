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
    return Setup(workers=workers, updates=updates, network=network, **kw)


class TestConstantRollouts:
    """Equal, constant compute times: no worker ever waits, so every mode runs at the same
    throughput and differs only by what its communication costs."""

    @pytest.mark.parametrize("mode", MODES)
    def test_free_network_gives_every_mode_the_same_throughput(self, mode):
        s = setup(16, 30, group_size=4, sync_period=5)
        r = run([mode], s, parse_rollout("const:0.75", ppo_s=0.25))[mode]
        assert r["update_s"] == pytest.approx(1.0, rel=1e-12)
        assert r["frames_per_s"] == pytest.approx(16 * 512 / 1.0, rel=1e-12)
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
            "localsgd": n_global * (IB.barrier(p) + IB.allreduce(p, n)),
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

    def test_localsgd_without_global_average_runs_at_the_mean(self):
        """No synchronisation at all: each worker's wall is the sum of its own times, and the
        job's is the slowest sum, within a few standard deviations of U * mean."""
        u, p = 5000, 8
        r = run(["localsgd"], setup(p, u, sync_period=10 ** 9), parse_rollout("exp:1.0"),
                seed=1)["localsgd"]
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

    def test_json_is_keyed_by_mode_with_the_promised_figures(self):
        proc = self._run("--modes", "allreduce", "wagma", "--workers", "8", "--updates", "20",
                         "--rollout", "const:1.0", "--network", "ideal", "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert set(out) == {"allreduce", "wagma"}
        for r in out.values():
            assert r["update_s"] == pytest.approx(1.0)
            assert r["frames_per_s"] == pytest.approx(8 * 512)
            assert r["wait_share"] == 0.0

    @pytest.mark.parametrize("args,message", [
        (["--rollout", "gauss:1"], "unknown kind 'gauss'"),
        (["--rollout", "lognormal:1"], "expected 2 non-negative numbers"),
        (["--rollout", "trace:/nonexistent"], "no trace at"),
        (["--workers", "0"], "--workers must be >= 1"),
        (["--network", "myrinet"], "invalid choice"),
    ])
    def test_a_bad_argument_is_one_line_without_traceback(self, args, message):
        proc = self._run(*args)
        assert proc.returncode == 2
        assert message in proc.stderr and "Traceback" not in proc.stderr
