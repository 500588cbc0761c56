"""The benchmark scripts' outputs: where a run writes what the docs show (nothing is trained)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import modes

ROOT = Path(__file__).resolve().parents[1]


def test_a_mode_comparison_with_default_paths_writes_nothing_the_docs_show():
    args = modes.parse_args([])
    written = [args.out, *modes.figure_paths(args, ranks=4)]
    shown = [ROOT / "docs", ROOT / "benchmarks" / "results"]
    assert not [p for p in written if any(Path(p).resolve().is_relative_to(d) for d in shown)]


def test_the_figures_go_where_plots_says_with_the_rank_count_filled_in():
    args = modes.parse_args(["--ranks", "4", "--ranks", "8", "--plots", "docs/modes_{ranks}r_x"])
    assert [Path(p).as_posix() for p in modes.figure_paths(args, ranks=8)] == \
        ["docs/modes_8r_x_success_frames.png", "docs/modes_8r_x_success_wall.png"]


def test_a_mode_comparison_refuses_a_modes_old_name_naming_the_new_one(capsys):
    with pytest.raises(SystemExit):
        modes.parse_args(["--modes", "wagma", "localsgd"])
    assert "'localsgd' has been renamed: use local_sgd" in capsys.readouterr().err


def _args(**kw):
    from benchmarks import optim_convergence as oc

    return oc.parse_args(["--task", "resnet", *[f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]])


def test_convergence_runs_are_budgeted_in_wall_time_not_steps():
    # A step budget cut off the fastest optimizer (NonBlockingSGD: 250 steps in 22 s, before
    # its loss target) while the slowest had minutes: every run gets the same seconds instead.
    from benchmarks import optim_convergence as oc

    args = _args(budget_s=90)
    over = oc.run_overrides(oc.TASKS["resnet"], "nonblocking", "random", 0, args, Path("/tmp/r"))
    assert "train.time_budget_s=90.0" in over
    steps = int(next(o for o in over if o.startswith("train.steps="))[len("train.steps="):])
    assert steps >= 100_000  # a bound no run reaches in 90 s


def _rows(seconds_to_loss: float, *, loss_after: float = 1.0) -> list[dict]:
    """An evaluation history reaching training loss ``loss_after`` at ``seconds_to_loss``."""
    return [{"step": 20, "train_s": seconds_to_loss / 2, "train_loss": 2.0, "accuracy": 10.0,
             "samples_per_s": 100.0},
            {"step": 40, "train_s": seconds_to_loss, "train_loss": loss_after, "accuracy": 50.0,
             "samples_per_s": 100.0}]


def test_the_convergence_table_gives_each_seeds_time_and_ratio_to_allreduce():
    from benchmarks import optim_convergence as oc

    args = _args(seeds=2)
    args.optimizers, args.stragglers = ["allreduce", "nonblocking"], ["random"]
    results = {("allreduce", "random", 0): _rows(60.0), ("allreduce", "random", 1): _rows(50.0),
               ("nonblocking", "random", 0): _rows(40.0),
               ("nonblocking", "random", 1): _rows(20.0, loss_after=9.0)}  # seed 1 never gets there
    table, summary = oc.summarize(results, oc.TASKS["resnet"], args)
    row = summary["nonblocking/random"]
    assert row["s_to_loss_per_seed"] == [40.0, None]
    assert row["speedup_vs_allreduce_per_seed"] == [1.5, None]
    # to the accuracy target (both seeds reach 50% at their last evaluation): 60/40, 50/20
    assert row["metric_speedup_vs_allreduce_per_seed"] == [1.5, 2.5]
    assert row["metric_speedup_vs_allreduce"] == 2.0
    line = next(x for x in table.splitlines() if x.startswith("| nonblocking |"))
    assert "40.0 / not reached" in line and "1.50 / n/a" in line and "1.50 / 2.50" in line


def test_the_scale_validation_runs_on_the_recorded_results_and_writes_its_table(tmp_path):
    # (It stopped with a TypeError once the simulator's Setup lost an argument, unnoticed.)
    out = tmp_path / "validation.md"
    proc = subprocess.run(
        [sys.executable, "benchmarks/scale_validate.py", "--updates", "200", "--out", str(out),
         "--recorded", "benchmarks/results/modes_4_trivial.md",
         "--traced", "benchmarks/results/traces/modes_4_trivial_5modes",
         "--measured", "benchmarks/results/modes_4_trivial_5modes.md"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in out.read_text().splitlines() if line.startswith("| modes_4")]
    assert len(rows) == 3 + 10, rows  # 3 recorded modes, 5 traced modes x (trace, fit)
    ratios = [float(r.split("|")[6]) for r in rows]
    assert all(0.5 < x < 2.0 for x in ratios), rows


def test_the_update_benchmark_gives_each_rollout_against_the_even_one(capsys):
    from benchmarks import ppo_update

    ppo_update.main(["--lengths", "4,4", "6,2", "--depth", "16", "--base-planes", "4",
                     "--repeats", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 4,4")
            or line.startswith("| 6,2")]
    assert [r.split("|")[1:4] for r in rows] == [[" 4,4 ", " 8 ", " 16 "], [" 6,2 ", " 8 ", " 16 "]]
    assert rows[0].endswith("| 1.00x |")
