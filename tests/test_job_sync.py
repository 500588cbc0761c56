"""wagma_rl.job.sync: the synchronised points both loops share (one process here; the loops'
multi-rank specifications run them at 2-4 ranks)."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from wagma_rl.job import Job
from wagma_rl.job.run_config import RunConfig
from wagma_rl.job.sync import RowLayout, SyncPoint

LAYOUT = RowLayout(("loss", "stop"), {"evaluation": 2})


def job(tmp_path) -> Job:
    return Job(MPI.COMM_SELF, run=RunConfig(dir=str(tmp_path), tensorboard=False), timeout=5)


def sync_point(job: Job, *, every: int = 0, aligned: bool = True) -> SyncPoint:
    return SyncPoint(job, checkpoint_every=every, at=0, aligned=aligned, keep_synced=True,
                     own_models=False)


def test_a_row_is_read_back_by_field_name_one_value_per_rank():
    rows = np.stack([LAYOUT.pack({"loss": 1.5, "stop": False, "evaluation": [2, 3]}),
                     LAYOUT.pack({"loss": 0.5, "stop": True, "evaluation": [4, 5]})])
    columns = LAYOUT.columns(rows)
    assert columns["loss"].tolist() == [1.5, 0.5] and columns["stop"].tolist() == [0.0, 1.0]
    assert columns["evaluation"].tolist() == [[2, 3], [4, 5]]
    assert LAYOUT.totals(rows)["evaluation"].tolist() == [6, 8]


def test_a_row_missing_a_field_is_refused_naming_the_fields():
    with pytest.raises(KeyError, match="evaluation"):
        LAYOUT.pack({"loss": 1.0, "stop": False})


def test_a_stop_signal_rides_in_the_gathered_row(tmp_path):
    with job(tmp_path) as running:
        running.signals.stop = True
        rows, stop = sync_point(running).gather(LAYOUT, {"loss": 1.0, "evaluation": [0, 0]},
                                                where="step 3", what="evaluation")
    assert stop and LAYOUT.columns(rows)["loss"].tolist() == [1.0]


@pytest.mark.parametrize("aligned, points, saved", [
    (True, [10, 20, 30, 40, 60], [30, 60]),          # the supervised jobs: multiples of 30
    (False, [10, 20, 30, 40, 60], [30, 60]),         # the trainer: 30 updates since the last
    (True, [20, 40, 60, 80], [60]),
    (False, [20, 40, 60, 80], [40, 80]),
])
def test_the_checkpoint_cadence(tmp_path, aligned, points, saved):
    with job(tmp_path) as running:
        sync = sync_point(running, every=30, aligned=aligned)
        assert [p for p in points if sync.checkpoint_due(p, final=False, stop=False)] == saved
        assert sync.checkpoint_due(61, final=True, stop=False)  # the end always saves


def test_the_survivors_go_on_from_the_last_two_synchronised_states(tmp_path):
    with job(tmp_path) as running:
        sync = sync_point(running)
        for step in (5, 10):
            sync.remember(dict, {"step": step}, mine=step * 2)
        assert (sync.snapshot, sync.previous) == ({"step": 10}, {"step": 5})
        assert sync.common(key="step") == ({"step": 10}, 20)
        sync.keep_own(dict, model=1)
        assert sync.kept is None  # (no fault tolerance here, or replicas never differ)
