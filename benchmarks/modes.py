"""Compare the distributed modes (allreduce, preempt, wagma, dpsgd, local_sgd) under heterogeneity.

``wagma_overlap`` is WAGMA with ``averaging.global_mode=overlap`` (docs/overlap.md).

    python benchmarks/modes.py --ranks 4 --frames 60000
    python benchmarks/modes.py --ranks 4 --ranks 8 --frames 60000 --slowdown 2.0 --slow-ranks 1
    python benchmarks/modes.py --ranks 4 --out /tmp/modes/table.md --plots /tmp/modes/fig_{ranks}r

Every mode trains its own configuration (configs/<mode>_pointnav.yaml: the same model, rollout and
PPO settings; the model-averaging modes' learning rate is twice the synchronous modes', see
docs/results/training.md, Mode comparison) for the same frame budget at each rank count, ``--seeds`` times, with the same
heterogeneity (the config's ``heterogeneity:`` section): ``--slow-ranks`` run ``--slowdown`` times slower,
and every worker stalls ``--stall-s`` seconds with probability ``--stall-prob`` per step, on its own draw. The script reads
the runs' TensorBoard logs back and writes a Markdown table (median frames/s over seeds, time per
update split into collect / update / communicate / wait, mean success and SPL) and PNG plots of
the seed-averaged success against frames and against wall time, plus a table of every seed's
frames/s against allreduce's run of the same seed and one figure per mode with every seed's
curve. ``--same-lr LR`` runs every mode a second time at the one learning rate LR (the modes'
configurations tune it per mode). Success and SPL come from the runs' traces (``run.trace``: every
worker's episode window after every update, :func:`wagma_rl.rl.trace.job_series`), so every mode
has a point at every update, WAGMA too, whose TensorBoard log reduces them only at its global
averages; runs traced before those columns existed fall back to TensorBoard's points. By default
all of it goes beside the
runs (``runs/bench_modes/``); the tables and figures the docs show are written only where
``--out`` and ``--plots`` name them (the docs give the command behind each).
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

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks import provenance  # noqa: E402
from benchmarks.modes_plot import line_plot  # noqa: E402
from native_coll.mpienv import mpiexec_path, with_netmod  # noqa: E402
from wagma_rl.rl.config import TrainerAveragingConfig  # noqa: E402
from wagma_rl.job.tblog import read_scalars  # noqa: E402
from wagma_rl.rl.trace import job_series  # noqa: E402

__all__ = ["run_mode", "summarize", "combine", "parse_args", "figure_paths", "main"]

MODES = {"allreduce": "configs/allreduce_pointnav.yaml", "preempt": "configs/ddppo_pointnav.yaml",
         "wagma": "configs/wagma_pointnav.yaml", "wagma_overlap": "configs/wagma_pointnav.yaml",
         "dpsgd": "configs/dpsgd_pointnav.yaml", "local_sgd": "configs/local_sgd_pointnav.yaml"}
# Variants that differ from their mode's configuration only by overrides.
MODE_OVERRIDES = {"wagma_overlap": ["averaging.global_mode=overlap"]}


def run_mode(mode: str, ranks: int, run_dir: Path, *, frames: int, overrides: list[str],
             timeout: float, cluster=None) -> float:
    """Train ``mode`` on ``ranks`` ranks into a fresh ``run_dir``; return the wall seconds.
    With ``cluster`` (cluster/netns.py) the ranks are spread over its namespaced nodes."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(REPO / "run_ddppo.py"),
            "--config", str(REPO / MODES[mode]), f"run.dir={run_dir}", f"run.total_frames={frames}",
            "run.checkpoint_interval=100000", "run.log_interval=10",
            *MODE_OVERRIDES.get(mode, []), *overrides]
    cmd = ([mpiexec_path(), "-n", str(ranks), *argv] if cluster is None
           else cluster.launch_command(mpiexec_path(), ranks, argv))
    env = with_netmod(dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    t0 = time.perf_counter()
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} at {ranks} ranks failed (exit {proc.returncode}); see "
                           f"{run_dir.parent / (run_dir.name + '.log')}")
    return time.perf_counter() - t0


LEVELS = (0.25, 0.5, 0.75)
"""Success levels whose first frames and wall seconds each run reports (``to_success``)."""


def first_at(curve: list, level: float) -> float | None:
    """The x (frames or seconds) of the first point of ``curve`` at or above ``level``."""
    return next((x for x, v in curve if v >= level), None)


def _mean(points) -> float:
    return sum(v for _, v in points) / len(points) if points else float("nan")


def learning_curves(run_dir: Path, scalars: dict) -> tuple[list, list, list, str]:
    """Success against frames, SPL against frames and success against wall seconds, at every
    update from the run's trace (the updates where some worker had finished an episode), or
    TensorBoard's points for a run traced without the episode columns; and which it was."""
    try:
        job = job_series(run_dir / "trace")
    except ValueError:
        wall = [v for _, v in scalars["perf/wall_s"]]
        succ = scalars["metrics/success"]
        return succ, scalars["metrics/spl"], list(zip(wall, (v for _, v in succ))), "tensorboard"
    keep = ~np.isnan(job["success"])
    frames, wall = job["frames"][keep].tolist(), job["wall_s"][keep].tolist()
    succ, spl = job["success"][keep].tolist(), job["spl"][keep].tolist()
    return list(zip(frames, succ)), list(zip(frames, spl)), list(zip(wall, succ)), "trace"


def summarize(run_dir: Path, levels: tuple[float, ...] = LEVELS) -> dict:
    """Figures of one run: timings from its TensorBoard scalars, learning from its trace (the
    first frames and wall seconds at each success level of ``levels``)."""
    s = read_scalars(run_dir)
    frames = s["perf/wall_s"][-1][0]
    wall = s["perf/wall_s"][-1][1]
    succ, spl, succ_wall, source = learning_curves(run_dir, s)
    tail = max(1, len(succ) // 5)  # the last fifth of the run
    # success averaged over the whole run against frames: one number for "how fast it learns".
    auc = _mean(succ)
    return {"frames": frames, "wall_s": wall, "fps": frames / wall,
            "collect_s": _mean(s["time/collect_s"]), "update_s": _mean(s["time/update_s"]),
            "comm_s": _mean(s["time/communicate_s"]), "wait_s": _mean(s["time/wait_s"]),
            "success": _mean(succ[-tail:]), "spl": _mean(spl[-tail:]),
            "success_mean": auc, "success_points": len(succ), "success_from": source,
            "to_success": {f"{lvl:g}": [first_at(succ, lvl), first_at(succ_wall, lvl)]
                           for lvl in levels},
            "rollout_min": min(v for _, v in s["rollout/steps_min"]),
            "series": {"success": succ, "success_wall": succ_wall}}


def combine(per_seed: list[dict]) -> dict:
    """One mode's figures over seeds: medians of the timings, means of the learning figures, and
    the success curves averaged on the first seed's frame (and wall-time) grid."""
    out = {k: statistics.median(r[k] for r in per_seed)
           for k in ("fps", "collect_s", "update_s", "comm_s", "wait_s", "wall_s")}
    out.update({k: statistics.fmean(r[k] for r in per_seed)
                for k in ("success", "spl", "success_mean")})
    out["rollout_min"] = min(r["rollout_min"] for r in per_seed)
    out["seeds"] = len(per_seed)
    out["series"] = {}
    for name in ("success", "success_wall"):
        grid = [x for x, _ in per_seed[0]["series"][name]]
        curves = [np.interp(grid, [x for x, _ in r["series"][name]], [v for _, v in r["series"][name]])
                  for r in per_seed]
        out["series"][name] = list(zip(grid, np.mean(curves, axis=0).tolist()))
    return out


def _table(results: dict, ranks: int, args) -> str:
    seeds = f", {args.seeds} seeds (median timings, mean success)" if args.seeds > 1 else ""
    rows = [f"### {ranks} ranks, {args.frames} frames, slow ranks {args.slow_ranks} x{args.slowdown}, "
            f"random stalls {args.stall_s}s with p={args.stall_prob} per step{seeds}\n",
            "| mode | frames/s | vs allreduce | vs preempt | collect s | update s | communicate s | "
            "wait s | min rollout | success (last 20%) | SPL (last 20%) | success mean over run | "
            "vs allreduce |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    def ratio(r: dict, base: str, key: str) -> str:
        # "-" when the baseline mode was not run, or learned nothing yet (a mean success below
        # 0.01: a ratio of two near-zero means is noise, e.g. 0.28x of 0.003).
        b = results.get(base, {}).get(key, 0.0)
        return f"{r[key] / b:.2f}x" if b > (0.01 if key != "fps" else 0.0) else "-"

    for mode, r in results.items():
        rows.append(f"| {mode} | {r['fps']:.0f} | {ratio(r, 'allreduce', 'fps')} | "
                    f"{ratio(r, 'preempt', 'fps')} | {r['collect_s']:.2f} | "
                    f"{r['update_s']:.2f} | {r['comm_s']:.3f} | {r['wait_s']:.2f} | "
                    f"{r['rollout_min']:.0f} | {r['success']:.2f} | {r['spl']:.2f} | "
                    f"{r['success_mean']:.2f} | {ratio(r, 'allreduce', 'success_mean')} |")
    return "\n".join(rows) + "\n"


def figure_paths(args, *, ranks: int, suffix: str = "") -> tuple[Path, Path]:
    """The two figures (success against frames, against wall time) of the ``ranks`` runs
    (``suffix``: of the ``--same-lr`` runs)."""
    prefix = str(args.plots).replace("{ranks}", str(ranks)) + suffix
    return Path(f"{prefix}_success_frames.png"), Path(f"{prefix}_success_wall.png")


def seeds_figure(args, *, ranks: int, mode: str, suffix: str = "") -> Path:
    """The figure of one mode's learning curve per seed."""
    return Path(str(args.plots).replace("{ranks}", str(ranks)) + f"{suffix}_{mode}_seeds.png")


def _mode(name: str) -> str:
    """A --modes value; a mode's old name is refused with its new one (as averaging.name is)."""
    new = TrainerAveragingConfig.RENAMED_VALUES["name"].get(name)
    if new:
        raise argparse.ArgumentTypeError(f"{name!r} has been renamed: use {new}")
    return name


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (``argv``, default ``sys.argv[1:]``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, action="append", help="rank counts (repeatable; default 4)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES), type=_mode)
    p.add_argument("--frames", type=int, default=60000, help="frame budget per run")
    p.add_argument("--slow-ranks", default="[1]", help="slow ranks (heterogeneity.slow_ranks), e.g. [1]")
    p.add_argument("--slowdown", type=float, default=2.0, help="how much slower they are")
    p.add_argument("--stall-s", type=float, default=0.05, help="random stall length (s)")
    p.add_argument("--stall-prob", type=float, default=0.02,
                   help="stall probability per worker and step (heterogeneity.stall_prob)")
    p.add_argument("--runs", type=Path, default=REPO / "runs" / "bench_modes")
    p.add_argument("--out", type=Path, help="the Markdown table (default <runs>/modes.md)")
    p.add_argument("--plots", help="figure path prefix: writes PREFIX_success_frames.png and "
                   "PREFIX_success_wall.png, {ranks} replaced by the rank count (default "
                   "<--out without .md>_{ranks}r)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("--seeds", type=int, default=1,
                   help="runs per mode with run.seed 1..N (modes interleaved per seed)")
    p.add_argument("--same-lr", type=float, default=None, metavar="LR",
                   help="also run every mode at this one learning rate (ppo.lr), besides each at "
                   "its configuration's tuned rate")
    p.add_argument("--nodes", type=int, default=1,
                   help="spread the ranks over this many namespaced nodes (cluster/netns.py; root)")
    p.add_argument("--rate", default=None, help="with --nodes: link rate limit, tc syntax (10gbit)")
    p.add_argument("--resummarize", metavar="RAW", default=None,
                   help="train nothing: read the run folders an earlier run of the same command "
                        "left in --runs again and rewrite its table, figures and raw file RAW "
                        "(its facts kept, this reading's noted beside them)")
    p.add_argument("--levels", type=float, nargs="+", default=list(LEVELS), metavar="SUCCESS",
                   help="success levels whose first frames and seconds each run reports "
                        f"(default {' '.join(f'{lvl:g}' for lvl in LEVELS)})")
    p.add_argument("overrides", nargs="*", help="extra config overrides for every run")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.levels != sorted(args.levels) or not all(0 < lvl <= 1 for lvl in args.levels):
        p.error(f"--levels {' '.join(map(str, args.levels))}: give success levels in (0, 1], "
                "rising")
    args.levels = tuple(args.levels)
    if args.resummarize and not Path(args.resummarize).is_file():
        p.error(f"--resummarize {args.resummarize}: no such raw file (the .json an earlier run "
                "of this command wrote beside its table)")
    args.out = args.out or args.runs / "modes.md"
    args.plots = args.plots or str(args.out.with_suffix("")) + "_{ranks}r"
    if len(args.ranks or [4]) > 1 and "{ranks}" not in args.plots:
        p.error(f"--plots {args.plots}: with several --ranks it needs {{ranks}} (each rank "
                "count draws its own figures)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cluster = None
    if args.nodes > 1:
        from cluster import netns
        try:
            cluster = netns.up(args.nodes, name="benchmodes", rate=args.rate)
        except netns.ClusterError as exc:
            sys.exit(f"benchmarks/modes.py: error: {exc}")
    try:
        return _compare(args, argv, cluster)
    finally:
        if cluster is not None:
            netns.down(name=cluster.name)


def lr_sets(args) -> dict[str, list[str]]:
    """The learning-rate protocols to run: each mode at its configuration's rate ("own"), and with
    ``--same-lr`` every mode again at that one rate ("lr X")."""
    sets = {"own": []}
    if args.same_lr is not None:
        sets[f"lr {args.same_lr:g}"] = [f"ppo.lr={args.same_lr}"]
    return sets


def per_seed_table(per_seed: dict[str, list[dict]], base: str = "allreduce") -> str:
    """Frames/s and success of every mode per seed, each against ``base``'s run of the same seed."""
    modes = list(per_seed)
    seeds = len(next(iter(per_seed.values())))
    head = "| seed | " + " | ".join(f"{m} frames/s" for m in modes)
    rule = "|---|" + "---|" * len(modes)
    if base in per_seed:
        others = [m for m in modes if m != base]
        head += " | " + " | ".join(f"{m} / {base}" for m in others)
        rule += "---|" * len(others)
    rows = [head + " |", rule]
    for i in range(seeds):
        cells = [f"{per_seed[m][i]['fps']:.0f} (success {per_seed[m][i]['success']:.2f})"
                 for m in modes]
        if base in per_seed:
            cells += [f"{per_seed[m][i]['fps'] / per_seed[base][i]['fps']:.2f}x"
                      for m in modes if m != base]
        rows.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    if base in per_seed and seeds > 1:
        spans = [f"{m}: {min(r):.2f}-{max(r):.2f}x" for m in modes if m != base
                 for r in [[a["fps"] / b["fps"] for a, b in zip(per_seed[m], per_seed[base])]]]
        rows.append(f"\nPer-seed range of frames/s against {base}: " + "; ".join(spans) + ".")
    return "\n".join(rows) + "\n"


def time_to_table(per_seed: dict[str, list[dict]], base: str = "allreduce",
                  levels: tuple[float, ...] = LEVELS) -> str:
    """Wall seconds from the start to each success level of ``levels`` per mode and seed, and
    ``base``'s seconds to the middle level (the lower of the two middle ones) over each mode's,
    seed by seed ("-": not reached)."""
    modes, mid = list(per_seed), f"{levels[(len(levels) - 1) // 2]:g}"
    seeds = len(next(iter(per_seed.values())))
    head = "| seed | " + " | ".join(
        f"{m}: s to success {' / '.join(f'{lvl:g}' for lvl in levels)}" for m in modes)
    rule = "|---|" + "---:|" * len(modes)
    others = [m for m in modes if m != base] if base in per_seed else []
    head += "".join(f" | {base} / {m} to {mid}" for m in others)
    rule += "---:|" * len(others)
    cell = lambda v: "-" if v is None else f"{v:.0f}"
    rows = [head + " |", rule]
    for i in range(seeds):
        got = {m: per_seed[m][i].get("to_success", {}) for m in modes}
        cells = [" / ".join(cell((got[m].get(f"{lvl:g}") or [None, None])[1]) for lvl in levels)
                 for m in modes]
        for m in others:
            mine, theirs = ((got[k].get(mid) or [None, None])[1] for k in (m, base))
            cells.append(f"{theirs / mine:.2f}x" if mine and theirs else "-")
        rows.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _compare(args, argv, cluster) -> int:
    facts = provenance.facts(config={k: str(v) if isinstance(v, Path) else v
                                     for k, v in vars(args).items()})
    if args.resummarize:
        # The measuring run's facts, not this re-reading's (which is noted beside them).
        again = facts
        facts = json.loads(Path(args.resummarize).read_text())["facts"]
        facts["resummarized"] = {k: again[k] for k in ("date", "commit", "dirty", "command")}
    raw = {}
    text = ["# DD-PPO modes under heterogeneity\n",
            f"Command: `python benchmarks/modes.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n"]
    sets = lr_sets(args)
    for ranks in args.ranks or [4]:
        het = [f"heterogeneity.slow_ranks={args.slow_ranks}", f"heterogeneity.slowdown={args.slowdown}",
               f"heterogeneity.stall_s={args.stall_s}", f"heterogeneity.stall_prob={args.stall_prob}"]
        per_seed = {name: {mode: [] for mode in args.modes} for name in sets}
        for seed in range(1, args.seeds + 1):
            for name, lr in sets.items():
                for mode in args.modes:
                    tag = mode if name == "own" else f"{mode}_lr{args.same_lr:g}"
                    run_dir = args.runs / f"{ranks}r" / f"{tag}_s{seed}"
                    if args.resummarize and not (run_dir / "trace").is_dir():
                        sys.exit(f"benchmarks/modes.py: error: --resummarize: {run_dir} holds no "
                                 "run; give the --runs and the options of the run that made "
                                 f"{args.resummarize}")
                    wall = 0.0 if args.resummarize else run_mode(
                        mode, ranks, run_dir, frames=args.frames,
                        overrides=het + lr + [f"run.seed={seed}", f"heterogeneity.seed={seed}"]
                        + args.overrides, timeout=args.timeout, cluster=cluster)
                    per_seed[name][mode].append(summarize(run_dir, args.levels))
                    r = per_seed[name][mode][-1]
                    print(f"{ranks} ranks {mode} ({name} learning rate) seed {seed}: {r['fps']:.0f} "
                          f"frames/s, success {r['success']:.2f}, mean {r['success_mean']:.2f} "
                          f"({wall:.0f} s)", flush=True)
        raw[str(ranks)] = {name: {mode: [{k: v for k, v in r.items() if k != "series"} for r in runs]
                                  for mode, runs in modes.items()}
                           for name, modes in per_seed.items()}
        label = "".join(f", {o.split('=', 1)[1]} scenes" for o in args.overrides
                        if o.startswith("env.scenes="))
        label += f", {args.nodes} nodes" if cluster is not None else ""
        for name, modes in per_seed.items():
            results = {mode: combine(runs) for mode, runs in modes.items()}
            lr_label = "each mode at its configuration's learning rate" if name == "own" \
                else f"every mode at learning rate {args.same_lr:g}"
            text.append(f"## {ranks} ranks, {lr_label}\n")
            text.append(_table(results, ranks, args))
            text.append(per_seed_table(modes))
            text.append(time_to_table(modes, levels=args.levels))
            suffix = "" if name == "own" else f"_lr{args.same_lr:g}"
            mean = f", mean of {args.seeds} seeds" if args.seeds > 1 else ""
            frames_png, wall_png = figure_paths(args, ranks=ranks, suffix=suffix)
            line_plot({m: r["series"]["success"] for m, r in results.items()}, frames_png,
                      title=f"success vs frames, {ranks} ranks{label}{mean}", xlabel="frames",
                      ylabel="", ylim=(0.0, 1.0))
            line_plot({m: r["series"]["success_wall"] for m, r in results.items()}, wall_png,
                      title=f"success vs wall time, {ranks} ranks{label}{mean}", xlabel="seconds",
                      ylabel="", ylim=(0.0, 1.0))
            for mode, runs in modes.items():  # every seed's learning curve, one figure per mode
                line_plot({f"seed {i + 1}": r["series"]["success"] for i, r in enumerate(runs)},
                          seeds_figure(args, ranks=ranks, mode=mode, suffix=suffix),
                          title=f"{mode}: success vs frames per seed, {ranks} ranks{label}",
                          xlabel="frames", ylabel="", ylim=(0.0, 1.0))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(text))
    if args.resummarize:  # the measuring run's facts as they were (no new end stamp)
        provenance.beside(args.out).write_text(
            json.dumps({"facts": facts, "per_seed": raw}, indent=1, default=str) + "\n")
    else:
        provenance.write_raw(provenance.beside(args.out), facts, per_seed=raw)
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
