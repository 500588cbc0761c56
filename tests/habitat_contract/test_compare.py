"""``python -m envs.habitat.compare`` through habitat's real Env with the stand-in simulator.

The stand-in renders and measures with the embedded simulator, so every difference the tool
reports must be zero: a wrong pose hand-over (yaw sign, quaternion order, x/z swap, floor
height) between the two backends would show up as depth differences at the random poses.
"""

import json

import numpy as np
import pytest

from envs.habitat.compare import compare, depth_stats, main, rotation_of, yaw_of
from envs.pointnav.episodes import load_episodes


@pytest.mark.parametrize("yaw", [0.0, 0.3, -1.2, 3.0, -3.0])
def test_rotation_and_yaw_are_inverse(yaw):
    q = rotation_of(yaw)
    assert q[0] == q[2] == 0.0 and np.isclose(np.linalg.norm(q), 1.0)
    assert np.isclose(yaw_of(q), yaw)


def test_depth_stats_of_known_differences():
    st = depth_stats(np.array([0.0, -0.1, 0.3, 0.02]))
    assert st["pixels"] == 4 and np.isclose(st["median_m"], 0.06)
    assert np.isclose(st["max_m"], 0.3) and st["frac_over_5cm"] == 0.5
    assert st["frac_over_25cm"] == 0.25


def test_both_backends_agree_through_the_stand_in(exported):
    result = compare(episodes=exported["data_path"], scenes_dir=exported["scenes_dir"],
                     split="val", poses=3, depth_size=16, seed=1)
    ids = sorted(e.episode_id for e in load_episodes(exported["embedded"]["val"]))
    assert sorted(r["episode_id"] for r in result["episodes"]) == ids
    assert result["images"] == len(ids) * 4
    assert result["depth"]["pixels"] == len(ids) * 4 * 16 * 16
    assert result["depth"]["max_m"] < 1e-5
    geo = result["geodesic"]
    assert geo["episodes"] == len(ids) and geo["unreachable_in_habitat"] == 0
    assert abs(geo["ratio_min"] - 1.0) < 1e-5 and abs(geo["ratio_max"] - 1.0) < 1e-5
    for row in result["episodes"]:
        assert abs(row["geodesic_embedded_m"] - row["geodesic_file_m"]) < 1e-4


def test_command_prints_tables_and_writes_json(exported, tmp_path, capsys):
    out = tmp_path / "cmp.json"
    assert main(["--episodes", exported["data_path"], "--scenes-dir", exported["scenes_dir"],
                 "--count", "2", "--poses", "1", "--depth-size", "16",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| ratio | 2 | 0 | 1.0000 |" in text
    assert "| all poses | 4 | 0.0000 |" in text
    assert len(json.loads(out.read_text())["episodes"]) == 2


def test_the_benchmark_records_the_comparison_with_the_runs_facts(exported, tmp_path, capsys):
    """benchmarks/habitat_compare.py: the same tables, and a raw file with the facts, the
    comparison's arguments and which habitat-sim ran (here the stand-in, by its path)."""
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(repo / "benchmarks"))
    import habitat_compare

    out = tmp_path / "raw.json"
    theirs = ["--episodes", exported["data_path"], "--scenes-dir", exported["scenes_dir"],
              "--count", "2", "--poses", "1", "--depth-size", "16"]
    assert habitat_compare.main(["--out", str(out), "--", *theirs]) == 0
    assert "| ratio | 2 | 0 | 1.0000 |" in capsys.readouterr().out
    raw = json.loads(out.read_text())
    assert raw["facts"]["config"]["argv"] == theirs and raw["facts"]["load_end"] is not None
    assert raw["facts"]["config"]["habitat_sim"]["path"].endswith("habitat_standins/habitat_sim")
    assert len(raw["episodes"]) == 2 and raw["depth"]["max_m"] < 1e-5
