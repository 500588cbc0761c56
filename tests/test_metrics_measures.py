"""The measures beyond reward, success, SPL and distance to goal (habitat's soft_spl,
collisions.count, ...): which an env reports, an EpisodeWindow keeps them, and the reduction over
workers gives each one's mean over the episodes that report it."""
import numpy as np
from mpi4py import MPI

from wagma_rl.bounded_comm import BoundedComm
from wagma_rl.rl.metrics import (EpisodeWindow, LaggedStats, UpdateMeter, _row, combine_stats,
                                 episode_measures, measure_names, reduce_stats)


def _infos(success, soft_spl, collisions=None):
    out = {"success": np.array([success]), "spl": np.array([0.5], np.float32),
           "distance_to_goal": np.array([1.0], np.float32), "soft_spl": np.array([soft_spl]),
           "episode_id": np.array(["e"], dtype=object), "counted": np.array([True]),
           "elapsed_steps": np.array([3])}
    if collisions is not None:
        out["collisions.count"] = np.array([collisions])
    return out


def test_an_envs_measures_are_its_numeric_infos_but_ids_counts_and_step_counters():
    infos = _infos(True, 0.25, 2.0)
    assert episode_measures(infos, 0) == {"success": 1.0, "spl": 0.5, "distance_to_goal": 1.0,
                                          "soft_spl": 0.25, "collisions.count": 2.0}
    assert measure_names(infos) == ("collisions.count", "soft_spl")


def test_workers_measures_reduce_to_their_mean_over_the_episodes_that_report_them():
    rows = []
    for episodes in ([(0.2, 1.0), (0.4, None)], [(0.6, 3.0)]):  # two workers
        w = EpisodeWindow(1, window=5, measures=("collisions.count", "soft_spl"))
        for soft, coll in episodes:
            w.step(np.array([1.0]), np.array([True]), _infos(True, soft, coll))
        rows.append(_row(UpdateMeter(), w, False))
    out = combine_stats(np.stack(rows), ("collisions.count", "soft_spl"))
    assert out["measures"]["soft_spl"] == (0.2 + 0.4 + 0.6) / 3
    assert out["measures"]["collisions.count"] == 2.0  # (1 + 3) / 2: one episode had none
    assert out["episodes"] == 3 and out["spl"] == 0.5


def test_without_other_measures_the_row_and_result_are_as_before():
    w = EpisodeWindow(1, window=5)
    w.step(np.array([1.0]), np.array([True]), _infos(True, 0.3))
    plain = EpisodeWindow(1, 5)
    assert len(_row(UpdateMeter(), w, False)) == len(_row(UpdateMeter(), plain, False))
    assert reduce_stats(BoundedComm(MPI.COMM_SELF, timeout=10), UpdateMeter(), w)["measures"] == {}


def test_a_measure_no_episode_reported_yet_is_nan_and_the_lagged_reduction_keeps_them():
    w = EpisodeWindow(1, window=5, measures=("soft_spl",))
    out = reduce_stats(BoundedComm(MPI.COMM_SELF, timeout=10), UpdateMeter(), w)
    assert np.isnan(out["measures"]["soft_spl"])
    w.step(np.array([1.0]), np.array([True]), _infos(False, 0.75))
    w.add_finished(np.array([[1.0, 1.0, 1.0, 0.0]]))  # a device rollout's episode: no soft_spl
    lagged = LaggedStats(BoundedComm(MPI.COMM_SELF, timeout=10))
    lagged.start(UpdateMeter(), w, update=1, now=0.0)
    assert lagged.finish()["measures"] == {"soft_spl": 0.75}


def test_the_measures_tensorboard_gets_are_those_some_episode_reported():
    from wagma_rl.rl.metrics import measure_scalars

    stats = {"measures": {"soft_spl": 0.5, "collisions.count": float("nan")}}
    assert measure_scalars(stats) == {"metrics/soft_spl": 0.5}
    assert measure_scalars({}) == {}
