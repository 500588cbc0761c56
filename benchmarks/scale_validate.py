"""Validate the simulator (wagma_rl.scale) against measured mode comparisons.

    python benchmarks/scale_validate.py --out benchmarks/results/scale_validation.md \
        --recorded benchmarks/results/modes_4_trivial.md benchmarks/results/modes_8_trivial.md \
        --traced benchmarks/results/traces/modes_4_trivial_5modes \
        --measured benchmarks/results/modes_4_trivial_5modes.md

Two kinds of input:

* ``--recorded``: tables written by ``benchmarks/modes.py`` (no traces). Each mode's compute
  times are rebuilt from its row and the table's settings: per worker and update, a base
  collection time ``collect_s - 64 * p * delay`` (the measured mean less the mean stall) plus
  ``delay * Binomial(64, p)`` stalls, the same stall process as the environment's; the slow ranks'
  base times ``slowdown`` times longer (the mean base is spread so that the average matches the
  measured ``collect_s``); the measured ``update s`` as PPO compute. Base and PPO times vary from
  update to update by a lognormal factor of CV ``--jitter-cv`` (default 0.35: the CV of the
  stall-free rollouts and of the PPO compute in the traced runs below, 0.2-0.4 by mode). The
  simulator then adds the protocol (waiting, preemption, group activation) and the ``node``
  network.
* ``--traced``: a folder of runs from ``benchmarks/modes.py`` whose trainer wrote traces
  (``<mode>_s1/trace``; only the trace folders are needed), with ``--measured``, the table that
  ``benchmarks/modes.py`` wrote for those runs. Each mode is simulated by replaying its own trace
  (``trace:``) and from the lognormal fitted to it (``fit:``), and compared with the measured
  frames/s.

On this 2-core machine the ranks share cores, so a mode's compute times depend on what the other
ranks do meanwhile (a rank sleeping in a stall frees a core for the others, a rank spinning in a
barrier does not): each mode is therefore driven by its own measured compute times, and the
simulator predicts only what the protocol adds. The table shows simulated and measured frames/s
and their ratio.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks import provenance  # noqa: E402
from wagma_rl.rl.config import TrainerAveragingConfig  # noqa: E402
from wagma_rl.scale import Setup, get_network, parse_rollout, run, simulate  # noqa: E402
from wagma_rl.scale.rollout import Draw, lognormal_params  # noqa: E402
from wagma_rl.scale.simulate import MODES  # noqa: E402

__all__ = ["recorded_rows", "main"]

STEPS, ENVS = 64, 4  # configs/*_pointnav.yaml: ppo.num_steps, env.num_envs


def _current_name(mode: str) -> str:
    """A mode as results recorded before a rename name it (localsgd) -> its name now (local_sgd)."""
    return TrainerAveragingConfig.RENAMED_VALUES["name"].get(mode, mode)


def recorded_rows(path: Path) -> list[dict]:
    """Every (ranks, settings, mode row) of a modes.py results file."""
    text = path.read_text()
    sync = re.search(r"(?:distrib|averaging)\.sync_period=(\d+)", text)  # the key's old section too
    out, head = [], None
    for line in text.splitlines():
        m = re.match(r"### (\d+) ranks, (\d+) frames, slow ranks \[([\d, ]*)\] x([\d.]+), random "
                     r"stalls ([\d.]+)s with p=([\d.]+)", line)
        if m:
            head = {"ranks": int(m[1]), "slow": [int(x) for x in m[3].split(",") if x.strip()],
                    "slowdown": float(m[4]), "delay": float(m[5]), "p": float(m[6]),
                    "sync_period": int(sync[1]) if sync else 10}
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        mode = _current_name(cells[0])
        if head and len(cells) > 8 and mode in MODES:
            out.append(dict(head, mode=mode, fps=float(cells[1]), collect_s=float(cells[4]),
                            update_s=float(cells[5]), file=path.name))
    return out


def simulate_recorded(row: dict, *, updates: int, seed: int, jitter_cv: float) -> dict:
    p, rng = row["ranks"], np.random.default_rng(seed)
    base_mean = row["collect_s"] - STEPS * row["p"] * row["delay"]
    factor = np.ones(p)
    factor[row["slow"]] = row["slowdown"]
    base = base_mean * factor / factor.mean()
    mu, sigma = lognormal_params(1.0, jitter_cv)
    jitter = rng.lognormal(mu, sigma, size=(2, updates, p))
    collect = base[None, :] * jitter[0] + row["delay"] * rng.binomial(STEPS, row["p"],
                                                                      size=(updates, p))
    ppo = row["update_s"] * jitter[1]
    setup = Setup(workers=p, updates=updates, network=get_network("node"), group_size=2,
                  sync_period=row["sync_period"], num_steps=STEPS, num_envs=ENVS)
    draw = Draw(collect, ppo, base=base, lump_s=row["delay"], rng=rng)
    return simulate(row["mode"], setup, draw)


def simulate_traced(run_dir: Path, mode: str, kind: str, *, updates: int, seed: int,
                    lump_s: float) -> dict:
    trace = run_dir / "trace"
    ranks = len(list(trace.glob("rank_*.csv")))
    setup = Setup(workers=ranks, updates=updates, network=get_network("node"), group_size=2,
                  sync_period=10, num_steps=STEPS, num_envs=ENVS)
    return run([mode], setup, parse_rollout(f"{kind}:{trace}", lump_s=lump_s), seed=seed)[mode]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recorded", type=Path, nargs="*", default=[])
    p.add_argument("--traced", type=Path, help="folder of traced runs (<mode>_s1/trace)")
    p.add_argument("--measured", type=Path, help="the modes.py table of the traced runs")
    p.add_argument("--updates", type=int, default=4000, help="simulated updates (recorded/fit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jitter-cv", type=float, default=0.35,
                   help="recorded tables: CV of the stall-free rollout and PPO times")
    p.add_argument("--lump-s", type=float, default=1.0,
                   help="traced runs: stall length of their heterogeneity (heterogeneity.stall_s)")
    p.add_argument("--out", type=Path, help="the table (markdown); the figures with the run's "
                   "facts go beside it (.json)")
    args = p.parse_args(argv)
    facts = provenance.facts(config={k: str(v) if isinstance(v, Path) else v
                                     for k, v in vars(args).items()})
    raw = []
    lines = ["| source | ranks | mode | measured frames/s | simulated frames/s | simulated / "
             "measured | simulated wait share |", "|---|---|---|---|---|---|---|"]
    worst = 0.0
    for path in args.recorded:
        for row in recorded_rows(path):
            r = simulate_recorded(row, updates=args.updates, seed=args.seed,
                                  jitter_cv=args.jitter_cv)
            ratio = r["frames_per_s"] / row["fps"]
            raw.append(dict(source=f"{row['file']} (stall fit)", ranks=row["ranks"], mode=row["mode"],
                            measured_fps=row["fps"], simulated=r))
            worst = max(worst, abs(ratio - 1))
            lines.append(f"| {row['file']} (stall fit) | {row['ranks']} | {row['mode']} | "
                         f"{row['fps']:.0f} | {r['frames_per_s']:.0f} | {ratio:.3f} | "
                         f"{r['wait_share']:.2f} |")
    if args.traced and not args.measured:
        p.error("--traced needs --measured (the table benchmarks/modes.py wrote for those runs)")
    measured_fps = {r["mode"]: r["fps"] for r in recorded_rows(args.measured)} if args.traced else {}
    for folder in [args.traced] if args.traced else []:
        for run_dir in sorted(d for d in folder.iterdir() if (d / "trace").is_dir()):
            mode = _current_name(run_dir.name.rsplit("_s", 1)[0])
            if mode not in measured_fps:
                p.error(f"--traced {folder}: {run_dir.name} is a {mode} run, but {args.measured} "
                        f"has no {mode} row (it has {', '.join(measured_fps) or 'none'}); give the "
                        "table modes.py wrote for these runs")
            measured = measured_fps[mode]
            ranks = len(list((run_dir / "trace").glob("rank_*.csv")))
            for kind in ("trace", "fit"):
                length = len((run_dir / "trace" / "rank_00000.csv").read_text().splitlines()) - 1
                updates = length if kind == "trace" else args.updates
                r = simulate_traced(run_dir, mode, kind, updates=updates, seed=args.seed,
                                    lump_s=args.lump_s)
                ratio = r["frames_per_s"] / measured
                raw.append(dict(source=f"{folder.name}/{run_dir.name} ({kind})", ranks=ranks,
                                mode=mode, measured_fps=measured, simulated=r))
                worst = max(worst, abs(ratio - 1))
                lines.append(f"| {folder.name}/{run_dir.name} ({kind}) | {ranks} | {mode} | "
                             f"{measured:.0f} | {r['frames_per_s']:.0f} | {ratio:.3f} | "
                             f"{r['wait_share']:.2f} |")
    lines.append(f"\nLargest deviation: {worst:.1%}\n")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)
        provenance.write_raw(provenance.beside(args.out), facts, rows=raw, largest_deviation=worst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
