"""Collection inside a rank: lock-step, process-per-env and VER, crossed with the distributed modes.

    python benchmarks/ver.py --ranks 4 --seeds 3 --frames 40000 env.scenes=trivial

Every run trains its mode's configuration (configs/<mode>_pointnav.yaml, as benchmarks/modes.py)
for the same frame budget with the same per-env heterogeneity (every env step takes ``--env-step-s`` on top of its work, emulating a
simulator's render time; ``--slow-envs`` step
``--env-slowdown`` times slower, and every env stalls ``--env-stall-s`` seconds with probability
``--env-stall-prob`` at each of its steps), in three ways of collecting:

* ``lockstep``: the embedded simulator's batched vector env in the trainer's process; the rank
  waits for its slowest env at every step (DD-PPO);
* ``process``: the same lock-step rollouts over one worker process per env (env.workers=process);
* ``ver``: variable experience rollouts over worker processes (rollout.mode=ver).

Seeds run one after another with every (collection, mode) pair interleaved inside a seed, so machine
load hits them alike. The table gives median frames/s over seeds, each seed's frames/s ratio to
lock-step WAGMA of the same seed, success at equal frames (the last fifth of each run, and
the mean over the run) with the seeds' ratios to lock-step WAGMA, and for VER the share of the
workers' rollouts its cut-off rule ended early.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks import provenance  # noqa: E402
from benchmarks.modes import run_mode, summarize  # noqa: E402
from wagma_rl.job.tblog import read_scalars  # noqa: E402

__all__ = ["COLLECTIONS", "main"]

COLLECTIONS = {"lockstep": ["env.workers=inprocess", "rollout.mode=lockstep"],
               "process": ["env.workers=process", "rollout.mode=lockstep"],
               "ver": ["env.workers=process", "rollout.mode=ver"]}
MODES = ("allreduce", "preempt", "wagma")
BASE = ("lockstep", "wagma")


def _ratios(per_seed: dict, key: str, name: tuple) -> list[float]:
    """Per seed, ``name``'s ``key`` over lock-step WAGMA's; nan where the base is ~0 (a success
    mean below 0.01 learned nothing yet: a ratio of two near-zero means is noise)."""
    base = per_seed[BASE]
    floor = 0.01 if key != "fps" else 0.0
    return [r[key] / b[key] if b[key] > floor else float("nan")
            for r, b in zip(per_seed[name], base)]


def _cut_short(run_dir: Path, ranks: int) -> float:
    """The share of the workers' rollouts VER's cut-off rule ended early (0 for lock-step)."""
    scalars = read_scalars(run_dir)
    updates = scalars["perf/update"][-1][1] if scalars.get("perf/update") else 0
    cut = sum(v for _, v in scalars.get("rollout/cut_short", []))
    return cut / (updates * ranks) if updates else float("nan")


def _fmt(values: list[float]) -> str:
    return " / ".join("-" if v != v else f"{v:.2f}" for v in values)


def _table(per_seed: dict, args) -> str:
    rows = [f"### {args.ranks} ranks x {args.num_envs} envs, {args.frames} frames, env step "
            f"{args.env_step_s * 1000:g} ms + work, slow envs "
            f"{args.slow_envs} x{args.env_slowdown}, env stalls {args.env_stall_s} s with "
            f"p={args.env_stall_prob} per step, {args.seeds} seeds\n",
            "| collection | mode | frames/s (median) | per-seed frames/s vs lock-step WAGMA | "
            "success, last 20% (mean) | success mean over run | per-seed success-mean ratio | "
            "rollouts cut short (per seed) |",
            "|---|---|---|---|---|---|---|---|"]
    for (coll, mode), runs in per_seed.items():
        fps = statistics.median(r["fps"] for r in runs)
        rows.append(f"| {coll} | {mode} | {fps:.0f} | {_fmt(_ratios(per_seed, 'fps', (coll, mode)))} | "
                    f"{statistics.fmean(r['success'] for r in runs):.2f} | "
                    f"{statistics.fmean(r['success_mean'] for r in runs):.2f} | "
                    f"{_fmt(_ratios(per_seed, 'success_mean', (coll, mode)))} | "
                    f"{_fmt([r['cut_short'] for r in runs]) if coll == 'ver' else '-'} |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--num-envs", type=int, default=4, help="envs per rank (env.num_envs)")
    p.add_argument("--collections", nargs="+", default=list(COLLECTIONS), choices=list(COLLECTIONS))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--frames", type=int, default=40000, help="frame budget per run")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--slow-envs", default="[0]", help="heterogeneity.slow_envs, e.g. [0]")
    p.add_argument("--env-step-s", type=float, default=0.005,
                   help="emulated simulator time per env step (heterogeneity.env_step_s)")
    p.add_argument("--env-slowdown", type=float, default=3.0)
    p.add_argument("--env-stall-s", type=float, default=0.2)
    p.add_argument("--env-stall-prob", type=float, default=0.01)
    p.add_argument("--runs", type=Path, default=REPO / "runs" / "bench_ver")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "bench_ver" / "ver.md",
                   help="where the table goes (the docs' copy is benchmarks/results/ver_4_1128.md)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("overrides", nargs="*", help="extra config overrides for every run")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    if "lockstep" not in args.collections or "wagma" not in args.modes:
        p.error("the ratios are against lock-step WAGMA: keep 'lockstep' and 'wagma'")
    facts = provenance.facts(config={k: str(v) if isinstance(v, Path) else v
                                     for k, v in vars(args).items()})
    het = [f"env.num_envs={args.num_envs}", f"heterogeneity.env_step_s={args.env_step_s}",
           f"heterogeneity.slow_envs={args.slow_envs}",
           f"heterogeneity.env_slowdown={args.env_slowdown}",
           f"heterogeneity.env_stall_s={args.env_stall_s}",
           f"heterogeneity.env_stall_prob={args.env_stall_prob}"]
    per_seed: dict = {(c, m): [] for c in args.collections for m in args.modes}
    for seed in range(1, args.seeds + 1):
        for coll, mode in per_seed:
            run_dir = args.runs / f"{args.ranks}r" / f"{coll}_{mode}_s{seed}"
            wall = run_mode(mode, args.ranks, run_dir, frames=args.frames,
                            overrides=het + COLLECTIONS[coll] + [f"run.seed={seed}",
                                                                 f"heterogeneity.seed={seed}"]
                            + args.overrides, timeout=args.timeout)
            r = summarize(run_dir)
            r.pop("series")
            r["cut_short"] = _cut_short(run_dir, args.ranks)
            per_seed[(coll, mode)].append(r)
            print(f"seed {seed} {coll} {mode}: {r['fps']:.0f} frames/s, success {r['success']:.2f}"
                  f" (mean {r['success_mean']:.2f}), {wall:.0f} s", flush=True)
    text = ["# Collection inside a rank: lock-step, process per env, VER\n",
            f"Command: `python benchmarks/ver.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n",
            _table(per_seed, args)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(text))
    provenance.write_raw(provenance.beside(args.out), facts,
                         per_seed={f"{c}/{m}": runs for (c, m), runs in per_seed.items()})
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
