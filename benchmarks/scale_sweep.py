"""The scale sweep of docs/results/scale.md: the five modes from 4 to 4,096 workers, and the conditions
under which WAGMA reaches 2x (or DD-PPO's preemption matches it), with the simulator.

    python benchmarks/scale_sweep.py --out benchmarks/results/scale_sweep.md --plots docs

Scenario (every row unless it says otherwise): a DD-PPO-sized model (10.8M float32 parameters:
the project's policy with a 2-layer LSTM of 512 and [3, 4, 6, 3] blocks of width 32), 512 frames
per worker and update, rollouts lognormal with mean 1 s, PPO compute 0.25 s (scaled with the
rollout's factor), WAGMA groups of 8 with a global average every 10 updates (the paper's
reference settings), DD-PPO's sync_frac 0.6, the ib100 network, 300 updates, seed 0.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks import provenance  # noqa: E402
from benchmarks.modes_plot import line_plot  # noqa: E402
from wagma_rl.scale import MODES, Setup, get_network, parse_rollout, run  # noqa: E402

__all__ = ["main"]

PARAMS = 10_783_173
WORKERS = [4, 16, 64, 256, 1024, 4096]


def _sim(workers: int, rollout: str, *, updates: int, group_size: int = 8, sync_period: int = 10,
         persistent_cv: float = 0.0, slow_frac: float = 0.0, slowdown: float = 1.0,
         network: str = "ib100", modes=MODES) -> dict:
    setup = Setup(workers=workers, updates=updates, network=get_network(network),
                  group_size=min(group_size, workers), sync_period=sync_period, params=PARAMS)
    work = parse_rollout(rollout, ppo_s=0.25, persistent_cv=persistent_cv, slow_frac=slow_frac,
                         slowdown=slowdown)
    return run(modes, setup, work, seed=0)


def _ratios(r: dict) -> str:
    w = r["wagma"]["frames_per_s"]
    return " | ".join(f"{w / r[m]['frames_per_s']:.2f}x" for m in MODES if m != "wagma")


def _stale(r: dict) -> str:
    dist = r["wagma"].get("staleness", {})
    return ", ".join(f"{k}: {v:.0%}" for k, v in dist.items() if v >= 0.005)


def workers_table(rollout: str, updates: int, network: str,
                  raw: list) -> tuple[list[str], dict]:
    """The rows of one rollout and network at every worker count (each result also goes to raw)."""
    rows = [f"#### rollout {rollout}, network {network}\n",
            "| workers | " + " | ".join(f"{m} frames/s" for m in MODES)
            + " | wagma vs " + " | vs ".join(m for m in MODES if m != "wagma")
            + " | wait share " + " / ".join(MODES) + " | wagma staleness |",
            "|---" * (2 + 2 * len(MODES) - 1 + 1) + "|"]
    curves: dict = {m: [] for m in MODES}
    for p in WORKERS:
        r = _sim(p, rollout, updates=updates, network=network)
        raw.append(dict(table="workers", rollout=rollout, network=network, workers=p, result=r))
        rows.append(f"| {p} | " + " | ".join(f"{r[m]['frames_per_s']:,.0f}" for m in MODES)
                    + f" | {_ratios(r)} | "
                    + " / ".join(f"{r[m]['wait_share']:.2f}" for m in MODES)
                    + f" | {_stale(r)} |")
        for m in MODES:
            curves[m].append((math.log2(p), r[m]["frames_per_s"] / p))
    return rows, curves


def conditions_table(updates: int, workers: int, raw: list) -> list[str]:
    rows = [f"#### {workers} workers: WAGMA against the others as one condition changes\n",
            "| condition | wagma frames/s | wagma vs " + " | vs ".join(m for m in MODES if m != "wagma")
            + " | wagma wait share | preempt wait share | wagma >= 2x allreduce | preempt >= wagma |",
            "|---" * (len(MODES) + 6) + "|"]
    cases = []
    for cv in (0.1, 0.3, 0.6, 1.0):
        cases.append((f"transient CV {cv}", dict(rollout=f"lognormal:1.0,{cv}")))
    for pcv in (0.1, 0.3):
        cases.append((f"CV 0.3 + persistent CV {pcv}", dict(rollout="lognormal:1.0,0.3",
                                                             persistent_cv=pcv)))
    for frac, slow in ((0.01, 2.0), (0.01, 4.0), (0.1, 2.0)):
        cases.append((f"CV 0.3 + {frac:.0%} of workers {slow}x slower",
                      dict(rollout="lognormal:1.0,0.3", slow_frac=frac, slowdown=slow)))
    for s in (2, 32):
        cases.append((f"CV 0.3, group size {s}", dict(rollout="lognormal:1.0,0.3", group_size=s)))
    for tau in (5, 20, 50, 1000):
        cases.append((f"CV 0.3, sync_period {tau}", dict(rollout="lognormal:1.0,0.3",
                                                         sync_period=tau)))
    for tau in (10, 50):
        cases.append((f"stalls 1 s, p=0.01 per step (the measured runs' heterogeneity), "
                      f"sync_period {tau}", dict(rollout="stall:0.36,0.01,1.0", sync_period=tau)))
    for name, kw in cases:
        r = _sim(workers, updates=updates, **kw)
        raw.append(dict(table="conditions", condition=name, workers=workers, settings=kw, result=r))
        w = r["wagma"]["frames_per_s"]
        rows.append(f"| {name} | {w:,.0f} | {_ratios(r)} | {r['wagma']['wait_share']:.2f} | "
                    f"{r['preempt']['wait_share']:.2f} | "
                    f"{'yes' if w >= 2 * r['allreduce']['frames_per_s'] else 'no'} | "
                    f"{'yes' if r['preempt']['frames_per_s'] >= w else 'no'} |")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=300)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "scale_sweep.md")
    p.add_argument("--plots", type=Path, default=REPO / "docs")
    args = p.parse_args(argv)
    facts = provenance.facts(config={k: str(v) for k, v in vars(args).items()})
    raw: list = []
    t0 = time.perf_counter()
    text = ["# Scale sweep (simulated)\n",
            f"Command: `python benchmarks/scale_sweep.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n"]
    for rollout, network, plot in (("lognormal:1.0,0.3", "ib100", "scale_fps_lognormal.png"),
                                   ("stall:0.36,0.01,1.0", "ib100", "scale_fps_stalls.png"),
                                   ("lognormal:1.0,0.3", "twonode", None)):
        rows, curves = workers_table(rollout, args.updates, network, raw)
        text += rows + [""]
        if plot:
            line_plot(curves, args.plots / plot, title=f"frames/s per worker, rollout {rollout}",
                      xlabel="log2(workers): 2 = 4 workers ... 12 = 4096 (wagma lies under local_sgd)",
                      ylabel="frames/s per worker")
    text += conditions_table(args.updates, 1024, raw) + [""]
    text.append(f"({time.perf_counter() - t0:.0f} s)\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(text))
    provenance.write_raw(provenance.beside(args.out), facts, updates=args.updates, rows=raw)
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
