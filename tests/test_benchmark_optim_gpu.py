"""benchmarks/optim_gpu.py and benchmarks/node_sum.py at a tiny size on cpu: every row runs and the
table is printed."""
import json
import os
import subprocess

import pytest

from mpi_launch import REPO, mpi_command

from benchmarks.optim_gpu import rows_to_markdown
from benchmarks.provenance import REQUIRED


def test_the_table_gives_each_row_against_no_averaging():
    rows = [{"row": "none1", "label": "none, 1 rank", "ranks": 1, "samples_per_s": 100.0, "comm_share": 0.0},
            {"row": "none", "label": "none, 2 ranks", "ranks": 2, "samples_per_s": 180.0, "comm_share": 0.0},
            {"row": "allreduce", "label": "AllreduceSGD", "ranks": 2, "samples_per_s": 90.0, "comm_share": 0.25}]
    table = rows_to_markdown(rows).splitlines()
    assert table[2] == "| none, 1 rank | 1 | 100 | - | - |"
    assert table[4] == "| AllreduceSGD | 2 | 90 | 25% | 0.50x |"


@pytest.mark.mpi
def test_every_optimizer_row_runs_at_a_tiny_size_on_cpu(tmp_path):
    argv = ["benchmarks/optim_gpu.py", "--device", "cpu", "--arch", "resnet18", "--width", "2",
            "--image-size", "8", "--batch", "4", "--seconds", "0.2", "--warmup", "1", "--window", "2",
            "--json", str(tmp_path / "rows.json")]
    proc = subprocess.run(mpi_command(2, argv), cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for label in ("none, 1 rank", "none, 2 ranks", "AllreduceSGD, bucket_mb=0", "AllreduceSGD, bucket_mb=25",
                  "WAGMA (group 2, global every 10)", "WAGMA (group 2, global every 10), background"):
        assert f"| {label} |" in proc.stdout
    raw = json.loads((tmp_path / "rows.json").read_text())
    assert set(REQUIRED) <= set(raw["facts"]) and len(raw["rows"]) == 6


@pytest.mark.mpi
def test_the_node_sum_benchmark_runs_at_a_tiny_size_on_cpu(tmp_path):
    """benchmarks/node_sum.py: a row per size, both ways timed, the raw file with the facts."""
    argv = ["benchmarks/node_sum.py", "--device", "cpu", "--mib", "0.01", "0.1", "--reps", "2",
            "--json", str(tmp_path / "node.json")]
    proc = subprocess.run(mpi_command(2, argv), cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "| 0.1 MiB |" in proc.stdout
    raw = json.loads((tmp_path / "node.json").read_text())
    assert set(REQUIRED) <= set(raw["facts"]) and [r["mib"] for r in raw["rows"]] == [0.01, 0.1]
    assert all(r["node_ms"] > 0 and r["mpi_ms"] > 0 for r in raw["rows"])
