"""The simulator's command line (``python -m wagma_rl.scale --help``)."""
from __future__ import annotations

import argparse
import json
import sys

from . import run
from .network import NETWORKS, network_of
from .rollout import parse_rollout
from .collection import COLLECTIONS
from .simulate import MODES, Setup

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m wagma_rl.scale",
        description="Simulate the trainer's distributed modes at any number of workers.")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, metavar="MODE",
                   help=f"modes to simulate (default all: {' '.join(MODES)})")
    p.add_argument("--workers", type=int, nargs="+", default=[64], metavar="N",
                   help="numbers of workers (ranks): one table row per count")
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
                   help="global average every this many updates (wagma, dpsgd, local_sgd)")
    p.add_argument("--overlap-sync-every", type=int, default=4,
                   help="wagma_overlap: synchronise after every n-th global average")
    p.add_argument("--sync-frac", type=float, default=0.6, help="preempt: DD-PPO's sync_frac")
    p.add_argument("--short-frac", type=float, default=0.25,
                   help="preempt: minimum fraction of its steps before a worker can be preempted")
    p.add_argument("--num-envs", type=int, default=None,
                   help="envs per worker (env.num_envs; default: the traced run's, else 4)")
    p.add_argument("--num-steps", type=int, default=None,
                   help="steps per env in a full rollout (ppo.num_steps; default: the trace's, "
                        "else 128, DD-PPO's); a full rollout is num-envs x num-steps frames")
    p.add_argument("--rollout-mode", nargs="+", default=["lockstep"], choices=COLLECTIONS,
                   metavar="MODE", help="collection inside a rank (rollout.mode): lockstep, ver "
                   "or both (one table row each)")
    p.add_argument("--slow-envs", type=int, nargs="*", default=[], metavar="I",
                   help="env indices within every rank that step --env-slowdown times slower")
    p.add_argument("--env-slowdown", type=float, default=1.0, help="how much slower they are")
    p.add_argument("--env-stall-prob", type=float, default=0.0,
                   help="each env stalls at each of its steps with this probability")
    p.add_argument("--env-stall-s", type=float, default=0.0, help="seconds an env stall lasts")
    p.add_argument("--max-env-steps", type=float, default=2.0,
                   help="ver: an env holds at most this many times num-steps steps")
    p.add_argument("--cutoff", default="auto", choices=("auto", "full"),
                   help="ver: auto (end early when that gives more steps/s) or full")
    p.add_argument("--min-frac", type=float, default=0.25,
                   help="ver: the cut-off never ends a rollout below this share of its frames")
    p.add_argument("--grad-rounds", type=int, default=4,
                   help="gradient allreduces per PPO update (epochs x mini-batches)")
    p.add_argument("--params", type=int, default=169_981, help="model parameters (float32)")
    p.add_argument("--network", default="ib100", choices=sorted(NETWORKS),
                   help="network parameter set (see wagma_rl/scale/network.py)")
    p.add_argument("--ppn", type=int, default=1,
                   help="ranks per node (rank r on node r // ppn); the native collective takes its "
                        "node-aware schedule where a group's members share nodes evenly")
    p.add_argument("--link-gbit", type=float, default=None,
                   help="cap each node's link at this many Gbit/s (beta = the larger of the set's "
                        "and 8 / rate ns/B)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the drawn times")
    p.add_argument("--json", action="store_true", help="print one JSON object keyed by mode")
    return p


def _check(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    for name in ("updates", "group_size", "sync_period", "grad_rounds", "overlap_sync_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    for name in ("num_envs", "num_steps"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if min(a.workers) < 1:
        p.error(f"--workers must be >= 1, got {min(a.workers)}")
    if not 0 < a.sync_frac <= 1 or not 0 <= a.short_frac <= 1:
        p.error("--sync-frac must be in (0, 1] and --short-frac in [0, 1]")
    if not 0 <= a.slow_frac <= 1 or a.slowdown < 1:
        p.error("--slow-frac must be in [0, 1] and --slowdown >= 1")
    if a.group_size > min(a.workers) and {"wagma", "wagma_overlap"} & set(a.modes):
        p.error(f"--group-size {a.group_size} is larger than --workers {min(a.workers)}")
    if a.ppo_s < 0 or a.persistent_cv < 0 or a.params < 0 or a.lump_s < 0:
        p.error("--ppo-s, --persistent-cv, --lump-s and --params must be >= 0")
    if a.env_slowdown < 1 or not 0 <= a.env_stall_prob <= 1 or a.env_stall_s < 0:
        p.error("--env-slowdown must be >= 1, --env-stall-prob in [0, 1] and --env-stall-s >= 0")
    if a.ppn < 1 or (a.link_gbit is not None and not a.link_gbit > 0):
        p.error(f"--ppn must be >= 1 and --link-gbit > 0, got {a.ppn} and {a.link_gbit}")
    if a.max_env_steps < 1 or not 0 <= a.min_frac <= 1:
        p.error("--max-env-steps must be >= 1 and --min-frac in [0, 1]")


def _shape(p: argparse.ArgumentParser, a: argparse.Namespace, workload) -> tuple[int, int]:
    """(num_envs, num_steps): the options, else the traced run's, else DD-PPO's 4 x 128."""
    shape = []
    for name, default in (("num_envs", 4), ("num_steps", 128)):
        given, traced = getattr(a, name), getattr(workload, name)
        if given is not None and traced is not None and given != traced:
            p.error(f"--{name.replace('_', '-')} {given}: the trace was recorded with {traced}")
        if given is None and traced is None and workload.trace is not None:
            p.error(f"{a.rollout}: no config.yaml beside the trace says env.num_envs; give "
                    f"--{name.replace('_', '-')} (the run's env.num_envs)")
        shape.append(given if given is not None else traced if traced is not None else default)
    if any(e < 0 or e >= shape[0] for e in a.slow_envs):
        p.error(f"--slow-envs {a.slow_envs}: env indices must be in 0..{shape[0] - 1}")
    return shape[0], shape[1]


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    _check(p, a)
    try:
        workload = parse_rollout(a.rollout, ppo_s=a.ppo_s, persistent_cv=a.persistent_cv,
                                 slow_frac=a.slow_frac, slowdown=a.slowdown, lump_s=a.lump_s,
                                 slow_envs=a.slow_envs, env_slowdown=a.env_slowdown,
                                 env_stall_prob=a.env_stall_prob, env_stall_s=a.env_stall_s)
    except ValueError as exc:
        p.error(str(exc))
    num_envs, num_steps = _shape(p, a, workload)
    network = network_of(a.network, ppn=a.ppn, link_gbit=a.link_gbit)
    rows = []
    for workers in a.workers:
        for collection in a.rollout_mode:
            setup = Setup(workers=workers, updates=a.updates, network=network,
                          group_size=min(a.group_size, workers), sync_period=a.sync_period,
                          overlap_sync_every=a.overlap_sync_every, sync_frac=a.sync_frac,
                          short_frac=a.short_frac, num_envs=num_envs, num_steps=num_steps,
                          collection=collection, max_env_steps=a.max_env_steps,
                          cutoff=a.cutoff, min_frac=a.min_frac, grad_rounds=a.grad_rounds,
                          params=a.params)
            for mode, r in run(a.modes, setup, workload, seed=a.seed).items():
                rows.append({"workers": workers, "rollout_mode": collection, "mode": mode, **r})
    if a.json:
        print(json.dumps(rows))
        return 0
    print(f"rollout {a.rollout}, {num_envs} envs x {num_steps} steps, network {network.describe()}, "
          f"S={a.group_size}, sync_period={a.sync_period}, {a.updates} updates")
    print(f"{'workers':>7} {'rollout':<8} {'mode':<13} {'update s':>9} {'frames/s':>12} "
          f"{'wait':>6} {'comm':>6} {'late':>6} {'frames':>6}")
    for r in rows:
        print(f"{r['workers']:>7} {r['rollout_mode']:<8} {r['mode']:<13} {r['update_s']:>9.3f} "
              f"{r['frames_per_s']:>12.0f} {r['wait_share']:>6.1%} {r['comm_share']:>6.1%} "
              f"{r['late_share']:>6.1%} {r['rollout_share']:>6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
