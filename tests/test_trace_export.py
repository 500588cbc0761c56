"""The per-rank timeline export of a run's trace (wagma_rl.rl.trace.chrome_trace and its command)."""
from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from wagma_rl.rl.trace import TraceWriter, chrome_trace, job_series, read_trace


def write_trace(tmp_path, *, ranks=2, updates=3):
    for rank in range(ranks):
        w = TraceWriter(tmp_path, rank=rank, num_steps=16)
        for u in range(updates):
            sync = SimpleNamespace(comm_s=0.125, wait_s=0.25 * rank, staleness=float(u), stale=0,
                                   late=False, preempted=False, synced=u == updates - 1,
                                   group=(0, 1) if u < updates - 1 else ())
            w.add(u, collect_s=1.0 + rank, update_s=0.5, steps=16, sync=sync)
        w.close()
    return tmp_path / "trace"


def test_every_part_of_every_update_is_a_slice_on_its_ranks_track(tmp_path):
    doc = chrome_trace(write_trace(tmp_path))
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    # rank 0 never waits (wait_s 0: no slice), rank 1 does: 3 + 4 slices per update.
    assert len(slices) == 3 * 3 + 3 * 4
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert names == {"rank 0", "rank 1"}
    rank1 = [e for e in slices if e["pid"] == 1 and e["args"]["update"] == 0]
    assert [e["name"] for e in rank1] == ["collect", "update", "comm", "wait"]
    assert [e["dur"] for e in rank1] == [2e6, 0.5e6, 0.125e6, 0.25e6]


def test_an_updates_slices_follow_each_other_and_end_at_its_recorded_time(tmp_path):
    path = write_trace(tmp_path)
    tr, doc = read_trace(path), chrome_trace(path)
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 1]
    ends = []
    for u in range(3):
        mine = [e for e in slices if e["args"]["update"] == u]
        for a, b in zip(mine, mine[1:]):
            assert b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=1.0)
        ends.append((mine[-1]["ts"] + mine[-1]["dur"]) / 1e6)
    recorded = tr["time"][1]
    assert [e - ends[0] for e in ends] == pytest.approx(list(recorded - recorded[0]), abs=1e-5)


def test_the_command_writes_json_perfetto_reads_and_refuses_a_folder_without_a_trace(tmp_path):
    path = write_trace(tmp_path)
    out = tmp_path / "timeline.json"
    proc = subprocess.run([sys.executable, "-m", "wagma_rl.rl.trace", str(path), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "21 slices on 2 ranks" in proc.stdout
    assert json.loads(out.read_text())["displayTimeUnit"] == "ms"
    bad = subprocess.run([sys.executable, "-m", "wagma_rl.rl.trace", str(tmp_path / "none"), str(out)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no such trace folder" in bad.stderr


def episode_window(count, success, spl):
    """A stand-in for the trainer's EpisodeWindow holding ``count`` episodes with these sums."""
    return SimpleNamespace(sums=lambda: np.array([count, 0.0, success, spl, 0.0]))


def test_the_jobs_success_at_every_update_sums_every_workers_window(tmp_path):
    """job_series: the job's frames once every rank finished an update, and success and SPL
    over all workers' episode windows after it (NaN before any episode ended)."""
    windows = {0: [(0, 0.0, 0.0), (2, 1.0, 0.5), (4, 3.0, 2.0)],
               1: [(0, 0.0, 0.0), (0, 0.0, 0.0), (2, 2.0, 1.5)]}
    for rank in (0, 1):
        w = TraceWriter(tmp_path, rank=rank, num_steps=16)
        for u in range(3):
            sync = SimpleNamespace(comm_s=0.0, wait_s=0.0, staleness=0.0, stale=0, late=False,
                                   preempted=False, synced=False, group=(0, 1))
            w.add(u, collect_s=1.0, update_s=0.5, steps=16, sync=sync, frames=64 + 16 * rank,
                  episodes=episode_window(*windows[rank][u]))
        w.close()
    job = job_series(tmp_path / "trace")
    assert job["frames"].tolist() == [144, 288, 432]
    assert np.isnan(job["success"][0]) and np.isnan(job["spl"][0])
    assert job["success"][1:].tolist() == [0.5, 5.0 / 6.0]
    assert job["spl"][1:].tolist() == [0.25, 3.5 / 6.0]
    tr = read_trace(tmp_path / "trace")
    assert job["end"].tolist() == tr["time"].max(axis=0).tolist()
    assert job["wall_s"].tolist() == (job["end"] - (tr["time"][:, 0] - 1.5).min()).tolist()


def test_a_trace_from_before_the_window_columns_reads_but_gives_no_success(tmp_path):
    folder = tmp_path / "trace"
    folder.mkdir()
    (folder / "rank_00000.csv").write_text(
        "update,time,collect_s,steps,num_steps,update_s,comm_s,wait_s,staleness,stale,late,"
        "preempted,synced,group\n0,100.0,1.0,16,16,0.5,0.1,0.0,0,0,0,0,1,\n")
    tr = read_trace(folder)
    assert tr["collect_s"].tolist() == [[1.0]] and np.isnan(tr["episodes"]).all()
    with pytest.raises(ValueError, match="no episode columns"):
        job_series(folder)
