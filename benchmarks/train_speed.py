"""`make train`'s job on cpu with two checkouts of the code, alternating: is the newer one slower?

    git worktree add /tmp/before <commit>; git worktree add /tmp/after HEAD
    python benchmarks/train_speed.py --code /tmp/before distrib.sync_period=5 \\
        --code /tmp/after averaging.sync_period=5 --runs 3 --out benchmarks/results/train_speed.json

Each run is ``python -S run_ddppo.py --config configs/wagma_pointnav.yaml`` on one rank, started
in the checkout with a fresh run folder, ``--frames`` frames, the overrides given to every run (by
default a progress line every 5 updates) and those given after the checkout's ``--code DIR``
(settings whose keys moved between the commits, such as the global average's period). Overrides
for every run go before the first ``--code``: after one, they belong to that checkout. ``-S`` keeps the editable
install's import hook out, so ``wagma_rl``, ``envs`` and ``native_coll`` come from the checkout
and only the third-party packages from this interpreter's site-packages. A checkout without its
own native engine gets one built (``pip wheel`` of the checkout, its ``_native`` module copied
in), once. The checkouts alternate run by run, so machine load hits them alike; a run's figure is
its last ``--last`` progress lines' frames/s, and the table gives the median of each checkout's
lines and each round's ratio of the last checkout's median to the first's. The raw file holds
every line, the commits and the run's facts.
"""
from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported as benchmarks.train_speed
import provenance  # noqa: E402

CONFIG = "configs/wagma_pointnav.yaml"
DEFAULT_OVERRIDES = ["run.log_interval=5"]
FPS = re.compile(r"\bfps=([0-9.]+)")

__all__ = ["main", "fps_lines", "summarize"]


def commit_of(folder: Path) -> str:
    """The checkout's commit (short), with ``dirty`` when tracked files differ from it."""
    head, dirty = provenance.checkout(folder)
    if not head:
        raise SystemExit(f"benchmarks/train_speed.py: {folder} is not a git checkout; make one "
                         "with `git worktree add DIR <commit>`")
    return f"{head} dirty" if dirty else head


def native_engine(checkout: Path) -> Path:
    """The checkout's built ``native_coll._native`` module; built from the checkout when absent
    (``pip wheel``, then the module copied out of the wheel into the checkout)."""
    found = sorted((checkout / "native_coll").glob("_native*.so"))
    if found:
        return found[0]
    print(f"building the native engine of {checkout} ...", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                               "--no-build-isolation", "-q", "-w", tmp, str(checkout)],
                              capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise SystemExit(f"benchmarks/train_speed.py: building {checkout}'s native engine "
                             f"failed: {' | '.join(tail)}")
        with zipfile.ZipFile(wheels[0]) as whl:
            name = next(n for n in whl.namelist()
                        if n.startswith("native_coll/_native") and n.endswith(".so"))
            target = checkout / name
            with whl.open(name) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return target


def fps_lines(log_text: str) -> list[float]:
    """Every progress line's frames/s in a run's log.txt, in order."""
    return [float(m.group(1)) for m in FPS.finditer(log_text)]


def run_once(checkout: Path, frames: int, overrides: list[str], timeout: float) -> dict:
    """One training run of the checkout's code in a fresh run folder; its progress lines."""
    with tempfile.TemporaryDirectory(prefix="train_speed_") as run_dir:
        cmd = [sys.executable, "-S", "run_ddppo.py", "--config", CONFIG, f"run.dir={run_dir}",
               f"run.total_frames={frames}", "run.checkpoint_interval=0", *overrides]
        # -S also leaves sys.prefix at the base interpreter's, where mpi4py would not find the
        # MPI library of this environment (the MPICH wheel's lib/): the loader is told.
        env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
               "PYTHONPATH": sysconfig.get_paths()["purelib"], "HOME": str(Path.home()),
               "LD_LIBRARY_PATH": str(Path(sys.prefix) / "lib")}
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=timeout)
        wall = time.time() - t0
        log = Path(run_dir, "log.txt")
        text = log.read_text() if log.is_file() else ""
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"benchmarks/train_speed.py: a run in {checkout} failed (exit "
                         f"{proc.returncode}): {' | '.join(tail)}")
    return {"fps": fps_lines(text), "wall_s": round(wall, 1), "command": " ".join(cmd)}


def summarize(runs: list[dict], labels: list[str], last: int) -> dict:
    """Per checkout, the median of its runs' last ``last`` lines; per round, the last checkout's
    median over the first's (``runs``: ``{"round", "code", "fps"}`` in run order)."""
    tail = {label: [] for label in labels}
    per_round: dict[int, dict[str, float]] = {}
    for r in runs:
        lines = r["fps"][-last:]
        tail[r["code"]].extend(lines)
        per_round.setdefault(r["round"], {})[r["code"]] = statistics.median(lines)
    medians = {label: statistics.median(v) for label, v in tail.items() if v}
    first, final = labels[0], labels[-1]
    ratios = [round(m[final] / m[first], 2) for _, m in sorted(per_round.items())
              if first in m and final in m]
    return {"median_fps": medians, "ratio_per_round": ratios,
            "ratio_of_medians": round(medians[final] / medians[first], 2)}


def table(runs: list[dict], labels: list[str], summary: dict, last: int) -> str:
    """The Markdown table: each round's last lines per checkout, then the medians."""
    head = " | ".join(f"{label}: the last {last} fps lines" for label in labels)
    lines = [f"| round | {head} | {labels[-1]} / {labels[0]} |",
             "|---|" + "---|" * len(labels) + "---:|"]
    rounds = sorted({r["round"] for r in runs})
    for i, rnd in enumerate(rounds):
        cells = []
        for label in labels:
            got = [r for r in runs if r["round"] == rnd and r["code"] == label]
            cells.append(", ".join(f"{v:.0f}" for v in got[0]["fps"][-last:]) if got else "-")
        ratio = summary["ratio_per_round"][i] if i < len(summary["ratio_per_round"]) else "-"
        lines.append(f"| {rnd + 1} | " + " | ".join(cells) + f" | {ratio} |")
    meds = " | ".join(f"{summary['median_fps'][label]:.0f}" for label in labels)
    lines.append(f"| median of the lines | {meds} | {summary['ratio_of_medians']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--code", nargs="+", action="append", required=True,
                   metavar=("DIR", "KEY=VALUE"),
                   help="a checkout to run and overrides for its runs only (repeat: the first is "
                        "the baseline, e.g. an older commit's `git worktree add DIR <commit>`)")
    p.add_argument("--runs", type=int, default=3, help="rounds (each runs every checkout once)")
    p.add_argument("--frames", type=int, default=12800, help="frames per run")
    p.add_argument("--last", type=int, default=3, help="progress lines per run that count")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--out", default=None, help="raw JSON file (the run's facts and every line)")
    p.add_argument("overrides", nargs="*", default=DEFAULT_OVERRIDES,
                   help=f"config overrides for every run (default: {' '.join(DEFAULT_OVERRIDES)})")
    args = p.parse_args(argv)
    if len(args.code) < 2:
        p.error("name at least two checkouts with --code (the baseline first)")
    checkouts = [Path(c[0]).resolve() for c in args.code]
    own = [c[1:] for c in args.code]
    for c in checkouts:
        if not (c / "run_ddppo.py").is_file():
            p.error(f"{c} has no run_ddppo.py: --code takes a checkout of this repository")
    facts = provenance.facts(config={**vars(args), "code": [[str(c), *o] for c, o in
                                                            zip(checkouts, own)]})
    labels = [commit_of(c) for c in checkouts]
    if len(set(labels)) < len(labels):
        labels = [f"{label} ({c.name})" for label, c in zip(labels, checkouts)]
    for c in checkouts:
        native_engine(c)
    runs = []
    for rnd in range(args.runs):
        for label, c, extra in zip(labels, checkouts, own):
            got = run_once(c, args.frames, [*args.overrides, *extra], args.timeout)
            print(f"round {rnd + 1} {label}: fps lines {got['fps']} ({got['wall_s']} s)",
                  flush=True)
            runs.append({"round": rnd, "code": label, "path": str(c), **got})
    summary = summarize(runs, labels, args.last)
    text = table(runs, labels, summary, args.last)
    print(text)
    if args.out:
        provenance.write_raw(args.out, facts, code=dict(zip(labels, map(str, checkouts))),
                             runs=runs, summary=summary, table=text)


if __name__ == "__main__":
    main()
