"""A PointNav job on habitat as its users run it: training through the env worker pool under the
elastic supervisor, one env worker killed mid-run, then every checkpoint of the run evaluated.

    .venv-habitat/bin/python benchmarks/habitat_run.py --config habitat.yaml [--ranks 2]
        [--frames 768] [--kill-at 2] [--eval-episodes 4] [--eval-steps 50] [--dead-after 10]
        [--out benchmarks/results/habitat_run.json] [override ...]
    python benchmarks/habitat_run.py --show benchmarks/results/habitat_run.json   # its tables

It runs in the environment that holds habitat-lab and habitat-sim, with this project installed
there (``pip install --no-build-isolation -e .``: the averaging engine; without it only
``averaging.name=allreduce`` runs). habitat-sim itself is not built by anything here
(docs/environments.md). The config is a run config with ``env.backend: habitat`` (its
``env.num_envs`` worker processes per rank); the overrides go to the training run.

1. ``python -m wagma_rl.elastic --hosts localhost:RANKS -- python run_ddppo.py --config ...`` to
   ``--frames`` frames.
2. Once log.txt shows update ``--kill-at`` (0: no fault), one env worker of the last rank gets
   SIGKILL. That rank prints one line and exits with status 5, its peers save the last
   synchronised update, and the supervisor relaunches the job from it.
3. ``run_ddppo.py --eval --checkpoint RUN --all-checkpoints`` with ``--eval-episodes`` episodes of
   at most ``--eval-steps`` steps each (a short evaluation for a slow simulator), one row per
   checkpoint.

It prints the training, fault and evaluation tables and writes them with the run's facts (and
habitat-sim's version and path, so a run on the tests' stand-in is told apart) to ``--out``.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests")]

import provenance  # noqa: E402  (date, commit, host, load, versions)
from native_coll.mpienv import mpiexec_path  # noqa: E402
from run_log import stamp  # noqa: E402  (a log line's time)

UPDATE = re.compile(r"^\[[\d-]+ [\d:]+\] update=(?P<update>\d+) frames=(?P<frames>\d+) "
                    r"fps=(?P<fps>[\d.]+) .*collect_s=(?P<collect>[\d.e-]+) "
                    r"update_s=(?P<update_s>[\d.e-]+)")
RESUMED = re.compile(r"^\[[\d-]+ [\d:]+\] resumed from \S+: update (?P<update>\d+), "
                     r"frames (?P<frames>\d+)")
RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def read_log(text: str) -> dict:
    """log.txt's update lines, split at the relaunch: ``{"before": [...], "after": [...],
    "resumed": {...} or None}``, each update a dict of its time, update, frames, fps and split."""
    out: dict = {"before": [], "after": [], "resumed": None}
    for line in text.splitlines():
        m = RESUMED.match(line)
        if m:
            out["resumed"] = {"t": stamp(line), "update": int(m["update"]),
                              "frames": int(m["frames"])}
            continue
        m = UPDATE.match(line)
        if m:
            row = {"t": stamp(line), "update": int(m["update"]), "frames": int(m["frames"]),
                   "fps": float(m["fps"]), "collect_s": float(m["collect"]),
                   "update_s": float(m["update_s"])}
            out["after" if out["resumed"] else "before"].append(row)
    return out


def rank_of(pid: int) -> int | None:
    """The MPI rank a launcher gave process ``pid`` (its environment), or None."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in env:
        key, _, value = entry.decode(errors="replace").partition("=")
        if key in RANK_VARS and value.isdigit():
            return int(value)
    return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int | None:
    try:
        # The command name may hold spaces and parentheses: the fields after its last ')'.
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def env_worker_of(run_dir: Path, rank: int) -> tuple[int, int] | None:
    """(trainer pid, pid of its first env worker) of rank ``rank`` of the run writing to
    ``run_dir``, or None while there is none."""
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    trainers = [p for p in pids if "run_ddppo.py" in _cmdline(p)
                and f"run.dir={run_dir}" in _cmdline(p) and rank_of(p) == rank]
    for trainer in trainers:
        workers = sorted(p for p in pids if _parent(p) == trainer and "_exec_worker" in _cmdline(p))
        if workers:
            return trainer, workers[0]
    return None


def train(args, run_dir: Path, out: Path) -> dict:
    """Steps 1 and 2: the supervised run, its fault, and what its logs say."""
    py = sys.executable
    job = [py, str(REPO / "run_ddppo.py"), "--config", str(args.config), f"run.dir={run_dir}",
           f"run.total_frames={args.frames}", *args.overrides]
    cmd = [py, "-m", "wagma_rl.elastic", "--hosts", f"localhost:{args.ranks}",
           "--launcher", args.mpiexec, "--dead-after", str(args.dead_after), "--", *job]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    fault, seen = None, -1  # (log.txt's size when last read: it is parsed again only when it grew)
    start = time.time()
    with open(out, "w") as sink:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while proc.poll() is None:
                if time.time() - start > args.budget:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(60)
                    break
                log = run_dir / "log.txt"
                size = log.stat().st_size if log.exists() else -1
                if (args.kill_at and fault is None and size != seen
                        and any(r["update"] >= args.kill_at
                                for r in read_log(log.read_text())["before"])):
                    found = env_worker_of(run_dir, args.ranks - 1)
                    if found:
                        os.kill(found[1], signal.SIGKILL)
                        fault = {"t": time.time(), "rank": args.ranks - 1, "trainer": found[0],
                                 "worker": found[1]}
                else:
                    seen = size
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    wall = time.time() - start
    output = out.read_text(errors="replace").splitlines()
    log = read_log((run_dir / "log.txt").read_text()) if (run_dir / "log.txt").exists() else \
        {"before": [], "after": [], "resumed": None}
    result = {"command": cmd, "exit_status": proc.returncode, "wall_s": round(wall, 1),
              "fault": fault, **log,
              "failure_lines": [line for line in output if line.startswith("run_ddppo.py: error")],
              "supervisor_lines": [line for line in output if line.startswith("elastic [")]}
    updates = log["before"] + log["after"]
    result["frames"] = updates[-1]["frames"] if updates else 0
    result["median_fps"] = statistics.median(r["fps"] for r in updates) if updates else None
    if fault and log["after"]:
        result["fault_to_first_update_s"] = round(log["after"][0]["t"] - fault["t"], 1)
        done = [r["update"] for r in log["before"] if r["t"] <= fault["t"] + 1]
        result["updates_redone"] = (max(done) - log["resumed"]["update"]) if done else None
    return result


def evaluate(args, run_dir: Path) -> dict:
    """Step 3: every checkpoint of the run, one row each (the CSV --all-checkpoints writes)."""
    cmd = [sys.executable, str(REPO / "run_ddppo.py"), "--eval", "--checkpoint", str(run_dir),
           "--all-checkpoints", f"eval.num_episodes={args.eval_episodes}",
           f"env.max_episode_steps={args.eval_steps}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    start = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=args.budget)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    m = re.match(r"eval of \d+ checkpoints? of \S+: (\S+\.csv)$", last)
    rows = list(csv.DictReader(Path(m[1]).read_text().splitlines())) \
        if proc.returncode == 0 and m else []
    return {"command": cmd, "exit_status": proc.returncode, "wall_s": round(time.time() - start, 1),
            "rows": rows, "error": "" if rows else (proc.stderr.strip().splitlines() or [""])[-1]}


def throughput(train: dict) -> float | None:
    """Frames per second of training time: each launch's frames from its first logged update to
    its last over the seconds between them (start-ups, the fault and the relaunch left out; the
    updates that met a scene switch in)."""
    frames = seconds = 0.0
    for part in (train["before"], train["after"]):
        if len(part) >= 2:
            frames += part[-1]["frames"] - part[0]["frames"]
            seconds += part[-1]["t"] - part[0]["t"]
    return frames / seconds if seconds else None


def tables(result: dict) -> str:
    """The three Markdown tables: training, the fault, the evaluation rows."""
    t, ev = result["train"], result["eval"]
    setup = result["setup"]
    updates = t["before"] + t["after"]
    lines = ["| ranks x envs | frames | wall (s) | frames/s over the training time | "
             "frames/s, median update | updates under 100 frames/s | collect_s / update_s, "
             "median | exit status |", "|---|---:|---:|---:|---:|---:|---|---:|"]
    split = (f"{statistics.median(r['collect_s'] for r in updates):.2f} / "
             f"{statistics.median(r['update_s'] for r in updates):.2f}") if updates else "-"
    fps = f"{t['median_fps']:.1f}" if t["median_fps"] is not None else "-"
    overall = throughput(t)
    overall = f"{overall:.1f}" if overall is not None else "-"
    slow = f"{sum(r['fps'] < 100 for r in updates)} of {len(updates)}"
    lines.append(f"| {setup['ranks']} x {setup['envs']} | {t['frames']} | {t['wall_s']} | "
                 f"{overall} | {fps} | {slow} | {split} | {t['exit_status']} |")
    if t["fault"]:
        lines += ["", "| fault | failure line | updates redone | fault to first update (s) |",
                  "|---|---|---:|---:|",
                  f"| SIGKILL of env worker pid {t['fault']['worker']} "
                  f"(rank {t['fault']['rank']}) | "
                  f"`{(t['failure_lines'] or ['(none)'])[0]}` | {t.get('updates_redone', '-')} | "
                  f"{t.get('fault_to_first_update_s', '-')} |"]
    lines += ["", "| checkpoint | frames | episodes | success | SPL | distance to goal (m) |",
              "|---|---:|---:|---:|---:|---:|"]
    for row in ev["rows"]:
        lines.append(f"| {row['checkpoint']} | {row['frames']} | {row['episodes']} | "
                     f"{float(row['success']):.3f} | {float(row['spl']):.3f} | "
                     f"{float(row['distance_to_goal']):.3f} |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, help="a run config, env.backend: habitat")
    ap.add_argument("--show", type=Path, default=None,
                    help="print the tables of this raw file of an earlier run and exit")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--frames", type=int, default=768, help="the run's run.total_frames")
    ap.add_argument("--kill-at", type=int, default=2,
                    help="kill an env worker of the last rank once log.txt shows this update "
                         "(0: no fault)")
    ap.add_argument("--eval-episodes", type=int, default=4)
    ap.add_argument("--eval-steps", type=int, default=50, help="env.max_episode_steps of the eval")
    ap.add_argument("--dead-after", type=float, default=10.0, help="the supervisor's --dead-after")
    ap.add_argument("--budget", type=float, default=3600.0,
                    help="seconds each of training and evaluation may take before it is ended")
    ap.add_argument("--mpiexec", default=None, help="the launcher (default: the venv's mpiexec)")
    ap.add_argument("--run-dir", type=Path, default=None,
                    help="the run folder (default: a temporary one, removed at the end)")
    ap.add_argument("--out", default="benchmarks/results/habitat_run.json")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the training run")
    args = ap.parse_args(argv)
    if args.show is None and args.config is None:
        ap.error("--config is required (or --show RAW to print an earlier run's tables)")
    args.config = args.config.resolve() if args.config else None
    args.mpiexec = args.mpiexec or mpiexec_path()
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.show:
        print(tables(json.loads(args.show.read_text())))
        return 0
    import habitat_sim  # which habitat-sim ran (the tests run this on their stand-in)

    record = provenance.facts(config={
        "config": str(args.config), "config_yaml": args.config.read_text(),
        "ranks": args.ranks, "frames": args.frames,
        "kill_at": args.kill_at, "eval_episodes": args.eval_episodes,
        "eval_steps": args.eval_steps, "dead_after": args.dead_after,
        "overrides": args.overrides,
        "habitat_sim": {"version": getattr(habitat_sim, "__version__", "?"),
                        "path": str(Path(habitat_sim.__file__).parent)}})
    import yaml
    envs = yaml.safe_load(args.config.read_text()).get("env", {}).get("num_envs", "?")
    for item in args.overrides:
        if item.startswith("env.num_envs="):
            envs = item.split("=", 1)[1]
    with tempfile.TemporaryDirectory(prefix="habitat-run-") as tmp:
        run_dir = (args.run_dir or Path(tmp) / "run").resolve()
        trained = train(args, run_dir, Path(tmp) / "supervisor.out")
        evaluated = evaluate(args, run_dir) if trained["frames"] else \
            {"rows": [], "error": "no checkpoint", "exit_status": None}
    result = {"setup": {"ranks": args.ranks, "envs": envs}, "train": trained, "eval": evaluated}
    print(tables(result))
    print(provenance.write_raw(args.out, record, **result))
    ok = trained["exit_status"] == 0 and evaluated["rows"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
