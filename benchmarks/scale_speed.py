"""How fast the simulator is: 1,024 workers x 1,000 updates, every mode, on one core.

    python benchmarks/scale_speed.py [--workers 1024 --updates 1000 --repeat 3]

Pins the process to one core (Linux) and prints one line per mode and a total (best of
``--repeat`` runs). The target is a total under 60 s (docs/results/scale.md records the figure).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import numpy as np  # noqa: E402

import provenance  # noqa: E402

from wagma_rl.scale import MODES, Setup, get_network, parse_rollout, simulate  # noqa: E402

__all__ = ["main"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=1024)
    p.add_argument("--updates", type=int, default=1000)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--rollout", default="stall:0.36,0.01,1.0")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default=None, help="raw JSON file (the run's facts and the times)")
    args = p.parse_args(argv)
    facts = provenance.facts(config=vars(args))
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    setup = Setup(workers=args.workers, updates=args.updates, network=get_network("ib100"),
                  group_size=args.group_size)
    best = {m: float("inf") for m in ("draw", *MODES)}
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        draw = parse_rollout(args.rollout).draw(np.random.default_rng(0), args.updates, args.workers)
        best["draw"] = min(best["draw"], time.perf_counter() - t0)
        for mode in MODES:
            t0 = time.perf_counter()
            simulate(mode, setup, draw)
            best[mode] = min(best[mode], time.perf_counter() - t0)
    parts = ", ".join(f"{m} {s:.2f} s" for m, s in best.items())
    print(f"{args.workers} workers x {args.updates} updates, rollout {args.rollout}, one core: "
          f"{parts}; all modes {sum(best.values()):.2f} s (best of {args.repeat})")
    if args.out:
        provenance.write_raw(args.out, facts, best_s=best)
    return 0


if __name__ == "__main__":
    sys.exit(main())
