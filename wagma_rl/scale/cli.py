"""The simulator's command line (``python -m wagma_rl.scale --help``)."""
from __future__ import annotations

import argparse
import json
import sys

from . import run
from .network import NETWORKS, get_network
from .rollout import parse_rollout
from .simulate import MODES, Setup

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m wagma_rl.scale",
        description="Simulate the trainer's distributed modes at any number of workers.")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, metavar="MODE",
                   help=f"modes to simulate (default all: {' '.join(MODES)})")
    p.add_argument("--workers", type=int, default=64, help="number of workers (ranks)")
    p.add_argument("--updates", type=int, default=1000, help="updates per worker")
    p.add_argument("--rollout", default="lognormal:1.0,0.3", metavar="SPEC",
                   help="rollout collection time: const:S, exp:MEAN, lognormal:MEAN,CV, "
                        "stall:BASE,P,DELAY[,STEPS], trace:PATH, fit:PATH")
    p.add_argument("--ppo-s", type=float, default=0.0,
                   help="local PPO compute per update in seconds (trace/fit: from the trace)")
    p.add_argument("--persistent-cv", type=float, default=0.0,
                   help="CV of a per-worker lognormal speed factor (persistent heterogeneity)")
    p.add_argument("--slow-frac", type=float, default=0.0, help="fraction of slow workers")
    p.add_argument("--slowdown", type=float, default=1.0, help="how much slower they are")
    p.add_argument("--lump-s", type=float, default=0.0,
                   help="rollout time above a worker's base comes in stalls of this length "
                        "(matters for preempt; stall: specs use their DELAY)")
    p.add_argument("--group-size", type=int, default=2, help="WAGMA group size S")
    p.add_argument("--sync-period", type=int, default=10,
                   help="global average every this many updates (wagma, dpsgd, localsgd)")
    p.add_argument("--overlap-sync-every", type=int, default=4,
                   help="wagma_overlap: synchronise after every n-th global average")
    p.add_argument("--sync-frac", type=float, default=0.6, help="preempt: DD-PPO's sync_frac")
    p.add_argument("--short-frac", type=float, default=0.25,
                   help="preempt: minimum fraction of its steps before a worker can be preempted")
    p.add_argument("--num-steps", type=int, default=64, help="steps per full rollout")
    p.add_argument("--frames-per-update", type=int, default=512,
                   help="frames one worker collects per full rollout")
    p.add_argument("--grad-rounds", type=int, default=4,
                   help="gradient allreduces per PPO update (epochs x mini-batches)")
    p.add_argument("--params", type=int, default=169_981, help="model parameters (float32)")
    p.add_argument("--network", default="ib100", choices=sorted(NETWORKS),
                   help="network parameter set (see wagma_rl/scale/network.py)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the drawn times")
    p.add_argument("--json", action="store_true", help="print one JSON object keyed by mode")
    return p


def _check(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    for name in ("workers", "updates", "group_size", "sync_period", "num_steps",
                 "frames_per_update", "grad_rounds", "overlap_sync_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if not 0 < a.sync_frac <= 1 or not 0 <= a.short_frac <= 1:
        p.error("--sync-frac must be in (0, 1] and --short-frac in [0, 1]")
    if not 0 <= a.slow_frac <= 1 or a.slowdown < 1:
        p.error("--slow-frac must be in [0, 1] and --slowdown >= 1")
    if a.group_size > a.workers and {"wagma", "wagma_overlap"} & set(a.modes):
        p.error(f"--group-size {a.group_size} is larger than --workers {a.workers}")
    if a.ppo_s < 0 or a.persistent_cv < 0 or a.params < 0 or a.lump_s < 0:
        p.error("--ppo-s, --persistent-cv, --lump-s and --params must be >= 0")


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    _check(p, a)
    try:
        workload = parse_rollout(a.rollout, ppo_s=a.ppo_s, persistent_cv=a.persistent_cv,
                                 slow_frac=a.slow_frac, slowdown=a.slowdown, lump_s=a.lump_s)
    except ValueError as exc:
        p.error(str(exc))
    setup = Setup(workers=a.workers, updates=a.updates, network=get_network(a.network),
                  group_size=a.group_size, sync_period=a.sync_period,
                  overlap_sync_every=a.overlap_sync_every, sync_frac=a.sync_frac,
                  short_frac=a.short_frac, num_steps=a.num_steps,
                  frames_per_update=a.frames_per_update, grad_rounds=a.grad_rounds,
                  params=a.params)
    results = run(a.modes, setup, workload, seed=a.seed)
    if a.json:
        print(json.dumps(results))
        return 0
    print(f"{a.workers} workers x {a.updates} updates, rollout {a.rollout}, network {a.network}, "
          f"S={a.group_size}, sync_period={a.sync_period}")
    print(f"{'mode':<13} {'update s':>9} {'frames/s':>12} {'wait':>6} {'comm':>6} {'late':>6}")
    for mode, r in results.items():
        print(f"{mode:<13} {r['update_s']:>9.3f} {r['frames_per_s']:>12.0f} "
              f"{r['wait_share']:>6.1%} {r['comm_share']:>6.1%} {r['late_share']:>6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
