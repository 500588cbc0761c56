"""Trainer building blocks on one rank: episode windows, statistics reduction, the preemption counter."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from wagma_rl.distrib import FinishedCounter, make_strategy
from wagma_rl.deadline import Deadline
from wagma_rl.rl.metrics import EpisodeWindow, UpdateMeter, reduce_stats


def test_episode_window_records_final_metrics_and_returns_of_ended_episodes():
    w = EpisodeWindow(2, window=10)
    infos = {"success": np.array([0.0, 1.0]), "spl": np.array([0.0, 0.5]),
             "distance_to_goal": np.array([3.0, 0.1])}
    w.step(np.array([1.0, 2.0]), np.array([False, False]), infos)
    w.step(np.array([1.0, 0.5]), np.array([False, True]), infos)
    assert w.finished == 1
    np.testing.assert_allclose(w.sums(), [1, 2.5, 1.0, 0.5, 0.1])
    assert w.returns[1] == 0.0 and w.returns[0] == 2.0


def test_episode_window_keeps_only_the_last_episodes():
    w = EpisodeWindow(1, window=2)
    infos = {"success": np.ones(1), "spl": np.ones(1), "distance_to_goal": np.zeros(1)}
    for r in (1.0, 2.0, 3.0):
        w.step(np.array([r]), np.array([True]), infos)
    assert w.sums()[0] == 2 and w.sums()[1] == 5.0


def test_reduce_stats_on_one_rank_gives_means_sums_and_extremes():
    meter = UpdateMeter()
    meter.add(collect_s=1.0, rollout_steps=64, frames=256, preempted=0)
    meter.add(collect_s=3.0, rollout_steps=32, frames=128, preempted=1)
    w = EpisodeWindow(1, window=5)
    out = reduce_stats(Deadline(MPI.COMM_SELF, timeout=10), meter, w, stop=True)
    assert out["collect_s"] == 2.0 and out["frames"] == 384 and out["preempted"] == 1
    assert (out["rollout_steps_min"], out["rollout_steps_max"]) == (32, 64)
    assert out["collect_spread_s"] == 0.0 and out["stop"] is True
    assert np.isnan(out["success"])  # no finished episode yet


def test_update_meter_rejects_unknown_figures():
    with pytest.raises(KeyError, match="bogus"):
        UpdateMeter().add(bogus=1.0)


def test_finished_counter_counts_per_rollout_and_clears_the_next_slot():
    c = FinishedCounter(MPI.COMM_SELF)
    try:
        c.add(0)
        assert (c.read(0), c.read(1)) == (1, 0)
        c.add(1)
        c.reset_next(1)  # rollout 1 starts: rank 0 clears rollout 2's slot (= rollout 0's)
        assert (c.read(2), c.read(1)) == (0, 1)
    finally:
        c.free()


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="wagma"):
        make_strategy("ring", comm=MPI.COMM_SELF)


def test_preempt_needs_a_fraction():
    with pytest.raises(ValueError, match="sync_frac"):
        make_strategy("preempt", comm=MPI.COMM_SELF, sync_frac=1.5)


def test_sigusr1_asks_to_stop_and_requeue_sigterm_only_to_stop():
    import os
    import signal

    from wagma_rl.rl.signals import StopSignals

    sig = StopSignals().install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert (sig.stop, sig.requeue) == (True, False)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert (sig.stop, sig.requeue) == (True, True)
    finally:
        sig.uninstall()


def test_requeue_outside_slurm_says_so(monkeypatch):
    from wagma_rl.rl.signals import requeue_slurm_job

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert "not under SLURM" in requeue_slurm_job()
