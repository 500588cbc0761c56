"""benchmarks/gpu.py runs its code paths on cpu: the simulator part and a training row under
mpiexec, read back from the ranks' traces into the table and the raw file."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mpi_launch import REPO


def test_the_gpu_benchmark_runs_on_cpu_and_writes_its_table_and_raw_file(tmp_path):
    # Every part at once (one process start): the simulator (two of its ray casts; the compiled
    # one is tested in test_envs_device.py), the PPO update's settings with the kernel profile, a
    # training row, and a run to a success target (0: its first logged point).
    out = tmp_path / "gpu"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--device", "cpu", "--quick",
         "--parts", "sim,update,training,success", "--update-repeats", "1",
         "--profile", str(tmp_path / "profile.txt"), "--target", "0",
         "--sim-sizes", "8x16", "--sim-seconds", "0.3", "--sim-casts", "eager", "fixed",
         "--only", "tiny, batch", "cpu, tiny",
         "--out", str(out), "--workdir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    raw = json.loads(out.with_suffix(".json").read_text())
    assert {r["sim"] for r in raw["simulator"]} == {"batch", "numpy"}
    assert [r["cast"] for r in raw["simulator"] if r["sim"] == "batch"] == ["eager", "fixed"]
    from benchmarks.gpu import UPDATE_ROWS

    assert [r["name"] for r in raw["update"]] == [r[0] for r in UPDATE_ROWS]
    assert all(r["update_s"] > 0 and len(r["all_s"]) == 1 for r in raw["update"])
    assert [r["compiled"] for r in raw["update"]] == [r[6] for r in UPDATE_ROWS]
    assert "aten::" in (tmp_path / "profile.txt").read_text()  # the first row's kernel table
    (row,) = raw["training"]
    assert row["status"] == "finished" and row["fps"] > 0 and row["updates"] == 6
    (reach,) = raw["success"]
    assert reach["seconds"] > 0 and reach["frames"] > 0 and reach["target"] == 0
    # read at every update from the trace: never later than the logged point that stopped it
    assert reach["success_from"] == "trace", reach
    assert reach["seconds"] <= reach["seconds_logged"] and reach["frames"] <= reach["frames_logged"]
    assert raw["facts"]["commit"] and raw["facts"]["torch"]
    table = out.with_suffix(".md").read_text()
    assert "| tiny, batch sim | 1 |" in table and "| cpu, tiny, 1 x 4 | cpu |" in table


def test_the_gpu_benchmark_says_what_to_do_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the refusal is for machines without it")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--out",
                           str(tmp_path / "x")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--device cpu" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_time_to_success_is_read_at_the_first_update_whose_job_success_reaches_the_target(tmp_path):
    """WAGMA's log has success only at its global averages; the trace at every update."""
    import numpy as np
    from types import SimpleNamespace

    from benchmarks.gpu import _first_traced
    from wagma_rl.rl.trace import TraceWriter, read_trace

    windows = {0: [(0, 0.0), (2, 1.0), (4, 3.0), (4, 4.0)],
               1: [(0, 0.0), (2, 1.0), (2, 2.0), (2, 2.0)]}
    for rank in (0, 1):
        w = TraceWriter(tmp_path, rank=rank, num_steps=16)
        for u, (count, success) in enumerate(windows[rank]):
            sync = SimpleNamespace(comm_s=0.0, wait_s=0.0, staleness=0.0, stale=0, late=False,
                                   preempted=False, synced=False, group=(0, 1))
            w.add(u, collect_s=0.1, update_s=0.1, steps=16, sync=sync, frames=64,
                  episodes=SimpleNamespace(
                      sums=lambda c=count, s=success: np.array([c, 0.0, s, 0.0])))
        w.close()
    # job success per update: nan, 0.5, 5/6, 1.0
    ends = read_trace(tmp_path / "trace")["time"].max(axis=0)
    assert _first_traced(tmp_path / "trace", 0.8) == (float(ends[2]), 3 * 128)
    assert _first_traced(tmp_path / "trace", 0.0) == (float(ends[1]), 2 * 128)
    assert _first_traced(tmp_path / "trace", 1.01) is None
    assert _first_traced(tmp_path / "nothing", 0.5) is None
