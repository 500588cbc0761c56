"""Time-to-solution benchmark of the distributed optimizers on the supervised tasks (not a test).

Runs ``python -m wagma_rl.supervised`` under ``mpiexec -n RANKS`` for every optimizer, straggler
mode and seed (seed-major, so machine-load drift hits every optimizer alike), reads each run's
evaluation history and reports, per optimizer and straggler mode, medians over the seeds of:

* wall time (the slowest rank's training time, evaluation excluded) to the training-loss target
  (``--loss-target``: the mean loss of the batches since the previous evaluation) and to the
  metric target (``--target``: accuracy in % for ``--task resnet``, BLEU for ``--task transformer``);
* the final metric and samples/s;
* the speed-up over AllreduceSGD and over DPSGD: the ratio of their time to the loss target over
  this optimizer's, taken per seed (same seed, same straggler schedule, neighbouring runs);
* each seed's time to the loss target and each seed's ratio to AllreduceSGD.

Every run has the same wall-time budget (``--budget-s`` of training, ``train.time_budget_s``),
not the same number of steps: optimizers' steps take different times (a non-blocking round ends
when the first rank is done), and a step budget cut the fastest one off before its target. A run
stops once both targets are reached, or at the first evaluation past its budget. Tables go to
``benchmarks/results/optim_convergence_<task>.{md,json}``; docs/results/optimizers.md quotes them.
Reproduce with e.g.::

    python benchmarks/optim_convergence.py --task resnet --seeds 3 --stragglers random slow_rank
    python benchmarks/optim_convergence.py --task transformer --seeds 1 --stragglers none random
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported as benchmarks.optim_convergence
import provenance  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from native_coll.mpienv import mpiexec_path  # noqa: E402
OUT = REPO / "benchmarks" / "results"

OPTIMIZERS = ["allreduce", "dpsgd", "wagma", "wagma_merge", "wagma_overlap", "wagma_outer",
              "wagma_outer_bf16", "local_sgd", "local_sgd_outer", "nonblocking", "nonblocking_dpsgd"]
# Variants of an optimizer that differ only by overrides: (averaging.name, overrides). The outer
# variants take DiLoCo's outer Nesterov step (lr 0.7, momentum 0.9) on every global average; the
# bf16 one sends its global averages as 16-bit pseudo-gradients.
VARIANTS = {"wagma_overlap": ("wagma", ["averaging.global_mode=overlap"]),
            "wagma_merge": ("wagma", ["averaging.late=merge"]),
            "wagma_outer": ("wagma", ["averaging.outer=nesterov"]),
            "wagma_outer_bf16": ("wagma", ["averaging.outer=nesterov", "averaging.global_precision=bf16"]),
            "local_sgd_outer": ("local_sgd", ["averaging.outer=nesterov"])}

# Small enough that a run takes about a minute with 4 ranks on 2 cores. The learning rate is
# constant after warm-up so that the time to a target does not depend on the budget.
TASKS = {
    "resnet": dict(
        config="configs/resnet_shapes.yaml", metric="accuracy", target=40.0, loss_target=1.45,
        budget_s=180.0, eval_every=20, batch=32, micro_batches=2,
        overrides=["data.image_size=16", "model.width=8", "data.train_size=16384", "data.val_size=512",
                   "optim.lr=0.1", "optim.warmup_steps=10", "optim.schedule=constant"],
        about="ResNet-18 (width 8) on 16x16 generated shapes (6 classes), SGD lr 0.1 momentum 0.9"),
    "transformer": dict(
        config="configs/transformer_grammar.yaml", metric="bleu", target=20.0, loss_target=1.2,
        budget_s=240.0, eval_every=25, batch=32, micro_batches=2,
        overrides=["data.train_size=16384", "data.val_size=512", "train.eval_batches=2",
                   "optim.lr=0.001", "optim.warmup_steps=25", "optim.schedule=constant"],
        about="Transformer (d_model 64, 2+2 layers) on the generated grammar translation task, "
              "Adam lr 0.001"),
}


def run_overrides(task: dict, name: str, straggler: str, seed: int, args, run_dir: Path) -> list[str]:
    """The config overrides of one run of ``name`` (an optimizer or a variant)."""
    optim, extra = VARIANTS.get(name, (name, []))
    overrides = task["overrides"] + extra + [
        f"averaging.name={optim}", f"averaging.group_size={args.group_size}", "averaging.sync_period=10",
        f"averaging.micro_batches={args.micro_batches}",
        f"train.batch_size={args.batch}", f"train.time_budget_s={float(args.budget_s)}",
        f"train.steps={args.steps}", f"train.eval_every={args.eval_every}",
        f"train.target_metric={args.target}", f"train.target_loss={args.loss_target}",
        f"run.seed={seed}", f"heterogeneity.seed={seed + 1}", "run.checkpoint_interval=0",
        "run.log_interval=100000", f"run.dir={run_dir}", "run.auto_resume=false", *args.set]
    if straggler == "random":  # the paper's: each step 1 or 2 ranks, agreed from the seed, stall
        overrides += ["heterogeneity.stall_ranks=2", f"heterogeneity.stall_s={args.delay}"]
    elif straggler == "slow_rank":
        overrides += [f"heterogeneity.slow_ranks=[{args.ranks - 1}]",
                      f"heterogeneity.slowdown={args.factor}"]
    return overrides


def run_one(task: dict, name: str, straggler: str, seed: int, args, run_dir: Path) -> list[dict]:
    """One training run (a fresh ``run_dir``); returns its evaluation history."""
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = run_overrides(task, name, straggler, seed, args, run_dir)
    cmd = [mpiexec_path(), "-n", str(args.ranks), sys.executable,
           "-m", "wagma_rl.supervised", "--config", task["config"], *overrides]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.run_timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}/{straggler}/seed {seed} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    last = rows[-1]
    print(f"  seed {seed} {name:17s} {straggler:9s} {time.time() - t0:6.1f}s run, {last['train_s']:6.1f}s "
          f"train, step {last['step']}, loss {last['train_loss']:.3f}, {task['metric']} "
          f"{last[task['metric']]:.1f}, {last['samples_per_s']:.0f} samples/s", flush=True)
    return rows


def time_to(rows: list[dict], key: str, target: float, *, below: bool,
            field: str = "train_s") -> float | None:
    """Training wall time (or ``field``: "step") of the first evaluation at which ``key`` reached
    ``target``."""
    for r in rows:
        if (r[key] <= target) if below else (r[key] >= target):
            return r[field]
    return None


def median(values: list) -> float | None:
    got = [v for v in values if v is not None]
    # A target missed by any seed has no median time: report how many seeds reached it instead.
    return statistics.median(got) if got and len(got) == len(values) else None


def summarize(results: dict, task: dict, args) -> tuple[str, dict]:
    """The Markdown table and the JSON summary of ``results`` (``{(name, straggler, seed):
    evaluation history}``)."""
    metric = task["metric"]
    unit = "%" if metric == "accuracy" else ""
    lines = [f"| optimizer | straggler | s to loss {args.loss_target:g} | s to loss per seed | "
             f"s to {metric} {args.target:g}{unit} | final {metric} | samples/s | "
             f"speed-up vs AllreduceSGD | per seed | speed-up vs DPSGD | "
             f"to {metric}: speed-up vs AllreduceSGD | per seed | steps to loss | "
             f"steps to {metric} |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    summary = {}
    fmt = lambda v, spec=".1f": "not reached" if v is None else format(v, spec)
    ratio = lambda v: v if v == "n/a" else fmt(v, ".2f")
    for straggler in args.stragglers:
        for name in args.optimizers:
            per_seed = [results.get((name, straggler, s)) for s in args.seed_list]
            if any(r is None for r in per_seed):
                continue
            t_loss = [time_to(r, "train_loss", args.loss_target, below=True) for r in per_seed]
            t_metric = [time_to(r, metric, args.target, below=False) for r in per_seed]
            n_loss = [time_to(r, "train_loss", args.loss_target, below=True, field="step")
                      for r in per_seed]
            n_metric = [time_to(r, metric, args.target, below=False, field="step") for r in per_seed]

            def ratios(base: str, key: str = "train_loss") -> list | None:
                """Per seed: ``base``'s time to the loss target (``key``: or the metric's) over
                this one's (None where either missed it)."""
                if base not in args.optimizers:
                    return None
                target, below = ((args.loss_target, True) if key == "train_loss"
                                 else (args.target, False))
                out = []
                for s, mine in zip(args.seed_list, t_loss if key == "train_loss" else t_metric):
                    ref = results.get((base, straggler, s))
                    theirs = time_to(ref, key, target, below=below) if ref else None
                    out.append(theirs / mine if theirs and mine else None)
                return out
            vs_allreduce, vs_dpsgd = ratios("allreduce"), ratios("dpsgd")
            metric_vs_allreduce = ratios("allreduce", metric)
            row = {"s_to_loss": median(t_loss), "s_to_metric": median(t_metric),
                   "s_to_loss_per_seed": t_loss, "s_to_metric_per_seed": t_metric,
                   "loss_reached": sum(v is not None for v in t_loss),
                   "metric_reached": sum(v is not None for v in t_metric),
                   "final_metric": statistics.median(r[-1][metric] for r in per_seed),
                   "samples_per_s": statistics.median(r[-1]["samples_per_s"] for r in per_seed),
                   "speedup_vs_allreduce": median(vs_allreduce) if vs_allreduce else "n/a",
                   "speedup_vs_allreduce_per_seed": vs_allreduce,
                   "speedup_vs_dpsgd": median(vs_dpsgd) if vs_dpsgd else "n/a",
                   "metric_speedup_vs_allreduce": (median(metric_vs_allreduce)
                                                   if metric_vs_allreduce else "n/a"),
                   "metric_speedup_vs_allreduce_per_seed": metric_vs_allreduce,
                   "steps_to_loss": median(n_loss), "steps_to_metric": median(n_metric)}
            summary[f"{name}/{straggler}"] = row
            n = len(per_seed)
            reach = lambda med, k: fmt(med) if med is not None else f"not reached ({k}/{n} seeds)"
            seeds = " / ".join(fmt(v) for v in t_loss)
            per = lambda values: " / ".join("n/a" if v is None else f"{v:.2f}" for v in values or [])
            seed_ratios, metric_seed_ratios = per(vs_allreduce), per(metric_vs_allreduce)
            lines.append(f"| {name} | {straggler} | {reach(row['s_to_loss'], row['loss_reached'])} | "
                         f"{seeds} | {reach(row['s_to_metric'], row['metric_reached'])} | "
                         f"{row['final_metric']:.1f} | {row['samples_per_s']:.0f} | "
                         f"{ratio(row['speedup_vs_allreduce'])} | {seed_ratios or 'n/a'} | "
                         f"{ratio(row['speedup_vs_dpsgd'])} | "
                         f"{ratio(row['metric_speedup_vs_allreduce'])} | {metric_seed_ratios or 'n/a'} | "
                         f"{fmt(row['steps_to_loss'], '.0f')} | "
                         f"{fmt(row['steps_to_metric'], '.0f')} |")
    return "\n".join(lines), summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the task's defaults filled in."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=sorted(TASKS), default="resnet")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=3, help="runs per optimizer and straggler mode")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--budget-s", type=float, help="seconds of training each run may take (the "
                    "slowest rank's, evaluation excluded; default per task): every optimizer "
                    "gets the same time")
    ap.add_argument("--steps", type=int, default=1_000_000,
                    help="step bound of a run (default: one no run reaches; the budget is --budget-s)")
    ap.add_argument("--eval-every", type=int, help="steps between evaluations (default per task)")
    ap.add_argument("--batch", type=int, help="samples per rank per step (default per task)")
    ap.add_argument("--micro-batches", type=int, help="NonBlocking*: micro-batches per batch (default per task)")
    ap.add_argument("--target", type=float, help="accuracy (%%) or BLEU target (default per task)")
    ap.add_argument("--loss-target", type=float, help="training-loss target (default per task)")
    ap.add_argument("--delay", type=float, default=0.3, help="random: seconds a delayed rank sleeps per step")
    ap.add_argument("--factor", type=float, default=3.0, help="slow_rank: slowdown of the last rank")
    ap.add_argument("--optimizers", nargs="+", default=OPTIMIZERS, choices=OPTIMIZERS)
    ap.add_argument("--stragglers", nargs="+", default=["random", "slow_rank"],
                    choices=["none", "random", "slow_rank"])
    ap.add_argument("--group-size", type=int, default=2, help="WAGMA group size")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="config overrides for every run (e.g. optim.lr=0.002), after the task's")
    ap.add_argument("--run-timeout", type=float, default=900)
    ap.add_argument("--from-json", help="re-summarize the runs saved in this .json (e.g. with other "
                    "targets) instead of running")
    ap.add_argument("--out", help="output path without extension (default benchmarks/results/optim_convergence_<task>)")
    args = ap.parse_args(argv)
    task = TASKS[args.task]
    for key in ("budget_s", "eval_every", "batch", "micro_batches", "target", "loss_target"):
        if getattr(args, key) is None:
            setattr(args, key, task[key])
    if args.batch % args.micro_batches:
        ap.error(f"--batch {args.batch} is not a multiple of --micro-batches {args.micro_batches}")
    args.seed_list = list(range(args.first_seed, args.first_seed + args.seeds))
    return args


def late_rule(overrides: list[str]) -> str:
    """The header's words for WAGMA's late rule: a ``--set averaging.late=...`` comes after each
    optimizer's own overrides, so it holds for every run (wagma_merge included)."""
    late = [o.split("=", 1)[1] for o in overrides if o.startswith("averaging.late=")]
    return f"late rule {late[-1]}" if late else "late rule apply (wagma_merge: merge)"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    task = TASKS[args.task]
    out = Path(args.out) if args.out else OUT / f"optim_convergence_{args.task}"

    results, t_start = {}, time.time()
    facts = provenance.facts(config=dict(vars(args)))
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        # The runs' own facts (None for files from before provenance.py), not this re-summary's.
        facts = saved.get("facts")
        results = {tuple(k.split("/")[:2]) + (int(k.split("/")[2]),): v for k, v in saved["curves"].items()}
        for key in ("optimizers", "stragglers", "seed_list", "seeds", "batch", "micro_batches", "steps",
                    "budget_s", "eval_every", "ranks", "delay", "factor", "group_size", "set"):
            # (runs from before the time budget were budgeted in steps only: budget_s 0)
            setattr(args, key, saved["config"].get(key, {"budget_s": 0.0, "set": []}.get(key)))
        t_start -= saved.get("wall_s", 0.0)
    for seed in [] if args.from_json else args.seed_list:
        for straggler in args.stragglers:
            for name in args.optimizers:
                results[(name, straggler, seed)] = run_one(
                    task, name, straggler, seed, args,
                    REPO / "runs" / "bench_optim" / f"{args.task}_{name}_{straggler}_{seed}")
    table, summary = summarize(results, task, args)
    header = (f"{args.ranks} ranks, {task['about']}, batch {args.batch} per rank (NonBlocking*: "
              f"{args.micro_batches} micro-batches of {args.batch // args.micro_batches}), "
              + (f"a budget of {args.budget_s:g} s of training per run (at most {args.steps} steps)"
                 if args.budget_s else f"at most {args.steps} steps per run")
              + f", evaluation every {args.eval_every} steps; medians over {args.seeds} "
              f"seed(s), per-seed values seed by seed; random straggler: each step 1-2 random ranks sleep {args.delay:g} s; "
              f"slow_rank: rank {args.ranks - 1} {args.factor:g}x slower; WAGMA group "
              f"{args.group_size}, sync period 10, {late_rule(args.set)}; LocalSGD local_steps 4"
              + (f"; for every run {' '.join(args.set)}" if args.set else "")
              + f". Benchmark wall time {time.time() - t_start:.0f} s.")
    text = "\n".join([header, "", table])
    print("\n" + text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text + "\n")
    data = {"config": {k: v for k, v in vars(args).items()}, "summary": summary,
            "wall_s": time.time() - t_start,
            "curves": {f"{k[0]}/{k[1]}/{k[2]}": v for k, v in results.items()}}
    if args.from_json:  # a re-summary keeps the measuring run's facts as they were
        out.with_suffix(".json").write_text(json.dumps({"facts": facts, **data}, indent=1) + "\n")
    else:
        provenance.write_raw(out.with_suffix(".json"), facts, **data)

if __name__ == "__main__":
    main()
