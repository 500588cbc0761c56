"""`make train`'s job from an empty run folder, then its final checkpoint evaluated: what the
Learning table of docs/results/training.md reports, with a raw file.

    python benchmarks/train_eval.py [--out benchmarks/results/train_eval.json] [--frames 720000]

Runs ``mpiexec -n 4 python run_ddppo.py --config configs/wagma_pointnav.yaml`` (the job of `make
train`) in a fresh run folder (``--runs``), times it, reads its TensorBoard events (the frames at
which the training window's success first reached 0.5, 0.75 and 0.9; its last success, SPL and
distance to goal), then evaluates the last checkpoint on the 100 fixed val episodes with sampled
and with deterministic actions (``run_ddppo.py --eval``; their result files). About 10 minutes
on the idle 2-core machine. The raw file holds every figure, the commands and the run's facts.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import provenance  # noqa: E402  (date, commit, host, load, versions)
from native_coll.mpienv import mpiexec_path  # noqa: E402
from wagma_rl.job.tblog import read_scalars  # noqa: E402

CONFIG = "configs/wagma_pointnav.yaml"
THRESHOLDS = (0.5, 0.75, 0.9)


def first_at(points: list[tuple[int, float]], level: float) -> int | None:
    """The first step (frames) whose value reached ``level``; None when none did."""
    return next((step for step, value in points if value >= level), None)


def curve_summary(run_dir: Path) -> dict:
    """The training window's success, SPL and distance: when success first reached each of
    THRESHOLDS, and the last logged value of each."""
    scalars = read_scalars(run_dir)
    success = scalars.get("metrics/success", [])
    last = {name: scalars[f"metrics/{name}"][-1][1]
            for name in ("success", "spl", "distance_to_goal") if scalars.get(f"metrics/{name}")}
    return {"frames_to_success": {str(level): first_at(success, level) for level in THRESHOLDS},
            "last": last, "points": len(success)}


def evaluate(run_dir: Path, checkpoint: Path, deterministic: bool) -> dict:
    """``run_ddppo.py --eval`` of ``checkpoint`` (the run's own config and val episodes);
    its result file's figures and the command."""
    cmd = [sys.executable, "run_ddppo.py", "--eval", "--checkpoint", str(checkpoint)]
    if deterministic:
        cmd.append("eval.deterministic=true")
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks/train_eval.py: the evaluation failed (exit "
                         f"{proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    mode = "deterministic" if deterministic else "sampled"
    result = next(run_dir.glob(f"eval_{checkpoint.stem}_*_{mode}*.json"))
    out = json.loads(result.read_text())
    return {"mode": mode, "command": " ".join(cmd), "seconds": round(time.time() - t0, 1),
            **{k: out[k] for k in ("episodes", "success", "spl", "distance_to_goal")}}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=None,
                   help=f"run.total_frames (default: the config's, {CONFIG})")
    p.add_argument("--runs", type=Path, default=REPO / "runs" / "bench_train_eval",
                   help="the run folder (emptied first)")
    p.add_argument("--out", default="benchmarks/results/train_eval.json",
                   help="the raw file (relative to the repository)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    overrides = [f"run.dir={args.runs}", "run.auto_resume=false"]
    if args.frames:
        overrides.append(f"run.total_frames={args.frames}")
    cmd = [mpiexec_path(), "-n", "4", sys.executable, "run_ddppo.py", "--config", CONFIG,
           *overrides]
    record = provenance.facts(config={"config": CONFIG, "overrides": overrides, "ranks": 4})
    shutil.rmtree(args.runs, ignore_errors=True)
    print(" ".join(cmd), flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, timeout=7200)
    wall = round(time.time() - t0, 1)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks/train_eval.py: training failed (exit {proc.returncode}); "
                         f"see {args.runs}/log.txt")
    checkpoint = sorted((args.runs / "checkpoints").glob("ckpt_*.pt"))[-1]
    training = {"command": " ".join(cmd), "wall_s": wall, "checkpoint": checkpoint.name,
                **curve_summary(args.runs)}
    evals = [evaluate(args.runs, checkpoint, deterministic) for deterministic in (False, True)]
    print(json.dumps({"training": training, "eval": evals}, indent=1), flush=True)
    out = provenance.write_raw(REPO / args.out, record, training=training, eval=evals)
    print(f"raw file: {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
