"""Convergence benchmark of the distributed optimizers on the generated ResNet task (not a test).

Runs ``python -m wagma_rl.supervised`` under ``mpiexec -n RANKS`` for each optimizer with and
without an emulated straggler, reads every run's evaluation history, and prints/writes:

* a summary: final accuracy, samples/s, samples and wall time to reach ``--target`` accuracy;
* the curves: accuracy against samples and against training wall time (every ``--eval-every``).

Results go to ``benchmarks/results/optim_convergence.{md,json}``. Reproduce with::

    python benchmarks/optim_convergence.py            # about 15 minutes on a small machine
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results"

# A small ResNet-18 (width 8) on 16x16 shapes so that the whole grid fits in minutes on a few cores.
BASE = ["data.image_size=16", "model.width=8", "data.train_size=16384", "data.val_size=512",
        "train.batch_size=16", "optim.lr=0.1", "optim.warmup_steps=20", "train.checkpoint_every=0",
        "train.log_every=100000", "optim.sync_period=10", "optim.period=4"]

OPTIMIZERS = ["wagma", "wagma_overlap", "allreduce", "local_sgd", "dpsgd", "nonblocking"]
# Variants of an optimizer that differ only by overrides: (optim.name, overrides).
VARIANTS = {"wagma_overlap": ("wagma", ["optim.global_mode=overlap"])}


def run_one(name: str, straggler: str, args, run_dir: Path) -> list[dict]:
    """One training run; returns its evaluation history."""
    shutil.rmtree(run_dir, ignore_errors=True)
    optim, extra = VARIANTS.get(name, (name, []))
    overrides = BASE + extra + [f"optim.group_size={args.group_size}", f"optim.name={optim}", f"train.steps={args.steps}",
                        f"train.eval_every={args.eval_every}", f"train.run_dir={run_dir}",
                        "train.resume=false"]
    if straggler == "random":
        overrides += ["straggler.mode=random", f"straggler.delay_s={args.delay}", "straggler.max_ranks=2"]
    elif straggler == "slow_rank":
        overrides += ["straggler.mode=slow_rank", f"straggler.rank={args.ranks - 1}",
                      f"straggler.factor={args.factor}"]
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(args.ranks), sys.executable,
           "-m", "wagma_rl.supervised", "--config", "configs/resnet_shapes.yaml", *overrides]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.run_timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}/{straggler} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    print(f"  {name:12s} {straggler:7s} {time.time() - t0:6.1f}s  final acc {rows[-1]['accuracy']:.1f}%  "
          f"{rows[-1]['samples_per_s']:.0f} samples/s", flush=True)
    return rows


def first_reaching(rows: list[dict], target: float) -> dict | None:
    return next((r for r in rows if r["accuracy"] >= target), None)


def summarize(results: dict, target: float) -> tuple[str, dict]:
    lines = [f"| optimizer | straggler | final acc (%) | samples/s | samples to {target:g}% | "
             f"wall s to {target:g}% |", "|---|---|---:|---:|---:|---:|"]
    summary = {}
    for (name, straggler), rows in results.items():
        hit = first_reaching(rows, target)
        last = rows[-1]
        summary[f"{name}/{straggler}"] = {
            "final_accuracy": last["accuracy"], "samples_per_s": last["samples_per_s"],
            "samples_to_target": hit["samples"] if hit else None,
            "wall_s_to_target": hit["train_s"] if hit else None}
        reach_samples = str(hit["samples"]) if hit else "not reached"
        reach_s = f"{hit['train_s']:.1f}" if hit else "not reached"
        lines.append(f"| {name} | {straggler} | {last['accuracy']:.1f} | {last['samples_per_s']:.0f} | "
                     f"{reach_samples} | {reach_s} |")
    return "\n".join(lines), summary


def curves(results: dict) -> str:
    out = []
    for (name, straggler), rows in results.items():
        out.append(f"\n{name} / straggler {straggler}: accuracy (%) at samples (wall s)\n")
        out.append("| step | samples | wall s | accuracy |\n|---:|---:|---:|---:|")
        out += [f"| {r['step']} | {r['samples']} | {r['train_s']:.1f} | {r['accuracy']:.1f} |" for r in rows]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--eval-every", type=int, default=40)
    ap.add_argument("--delay", type=float, default=0.3, help="seconds a delayed rank sleeps per step")
    ap.add_argument("--factor", type=float, default=3.0, help="slow_rank: slowdown of the last rank")
    ap.add_argument("--target", type=float, default=40.0, help="accuracy (%%) for samples/time-to-target")
    ap.add_argument("--optimizers", nargs="+", default=OPTIMIZERS, choices=OPTIMIZERS)
    ap.add_argument("--stragglers", nargs="+", default=["none", "random"], choices=["none", "random", "slow_rank"])
    ap.add_argument("--group-size", type=int, default=2, help="WAGMA group size")
    ap.add_argument("--run-timeout", type=float, default=600)
    ap.add_argument("--out", default=str(OUT / "optim_convergence"))
    args = ap.parse_args()

    results = {}
    for straggler in args.stragglers:
        for name in args.optimizers:
            results[(name, straggler)] = run_one(name, straggler, args,
                                                 REPO / "runs" / "bench_optim" / f"{name}_{straggler}")
    table, summary = summarize(results, args.target)
    ratios = []
    for straggler in args.stragglers:
        for variant in ("wagma", "wagma_overlap"):
            w, a = summary.get(f"{variant}/{straggler}"), summary.get(f"allreduce/{straggler}")
            if not (w and a):
                continue
            sp = w["samples_per_s"] / a["samples_per_s"]
            more = (w["samples_to_target"] / a["samples_to_target"] - 1) * 100 \
                if w["samples_to_target"] and a["samples_to_target"] else None
            ratios.append(f"straggler {straggler}: {variant} samples/s = {sp:.2f}x AllreduceSGD's; "
                          f"samples to {args.target:g}%: "
                          + (f"{more:+.0f}% vs AllreduceSGD" if more is not None else "n/a"))
    header = (f"{args.ranks} ranks, ResNet-18 (width 8) on 16x16 generated shapes, batch 16 per rank, "
              f"{args.steps} steps, cosine LR 0.1; random straggler: each step 1-2 random ranks sleep "
              f"{args.delay}s; slow_rank: the last rank {args.factor:g}x slower; WAGMA group {args.group_size}, sync period 10; LocalSGD period 4; "
              f"NonBlockingSGD 4 micro-batches of 4.")
    text = "\n".join([header, "", table, "", *ratios, "", curves(results)])
    print("\n" + text)
    Path(args.out + ".md").write_text(text + "\n")
    Path(args.out + ".json").write_text(json.dumps({"config": vars(args), "summary": summary,
        "curves": {f"{k[0]}/{k[1]}": v for k, v in results.items()}}, indent=1))


if __name__ == "__main__":
    main()
