"""The benchmark scripts' outputs: where a run writes what the docs show (nothing is trained)."""
from __future__ import annotations

from pathlib import Path

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
