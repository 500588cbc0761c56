"""habitat-sim against the embedded simulator on the same exported episodes, as a raw file:
``python -m envs.habitat.compare``'s geodesic and depth tables with the run's facts (and which
habitat-sim ran: its version and path, so a run on the tests' stand-in is told apart).

    .venv-habitat/bin/python benchmarks/habitat_compare.py \\
        --out benchmarks/results/habitat_compare.json -- \\
        --episodes 'data/habitat/episodes/{split}/{split}.json.gz' \\
        --scenes-dir data/habitat/scenes --split val --poses 4 --depth-size 64 \\
        --override habitat.simulator.habitat_sim_v0.gpu_device_id=-1

Everything after ``--`` is the comparison's own arguments (``python -m envs.habitat.compare -h``).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import provenance  # noqa: E402  (date, commit, host, load, versions)
from envs.habitat import compare  # noqa: E402


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, theirs = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/habitat_compare.json")
    args = ap.parse_args(ours)
    import habitat_sim

    record = provenance.facts(config={
        "argv": theirs, "habitat_sim": {"version": getattr(habitat_sim, "__version__", "?"),
                                        "path": str(Path(habitat_sim.__file__).parent)}})
    opts = compare.parse_args(theirs)
    start = time.time()
    result = compare.compare(episodes=opts.episodes, scenes_dir=opts.scenes_dir, split=opts.split,
                             count=opts.count, poses=opts.poses, depth_size=opts.depth_size,
                             seed=opts.seed, overrides=opts.override)
    print(compare.table(result))
    print(provenance.write_raw(args.out, record, wall_s=round(time.time() - start, 1), **result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
