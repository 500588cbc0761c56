"""benchmarks/gpu.py runs its code paths on cpu: the simulator part and a training row under
mpiexec, read back from the ranks' traces into the table and the raw file."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mpi_launch import REPO


def test_the_gpu_benchmark_runs_on_cpu_and_writes_its_table_and_raw_file(tmp_path):
    out = tmp_path / "gpu"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--device", "cpu", "--quick",
         "--sim-sizes", "8x16", "--sim-seconds", "0.3", "--only", "tiny, batch",
         "--out", str(out), "--workdir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    raw = json.loads(out.with_suffix(".json").read_text())
    assert {r["sim"] for r in raw["simulator"]} == {"batch", "numpy"}
    (row,) = raw["training"]
    assert row["status"] == "finished" and row["fps"] > 0 and row["updates"] == 6
    assert raw["facts"]["commit"] and raw["facts"]["torch"]
    assert "| tiny, batch sim | 1 |" in out.with_suffix(".md").read_text()


def test_the_gpu_benchmark_says_what_to_do_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the refusal is for machines without it")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--out",
                           str(tmp_path / "x")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--device cpu" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
