"""Throughput of the embedded PointNav simulator: ``python -m envs.bench``.

Steps ``PointNavVectorEnv`` with 1, 16 and 64 environments in this process at 64x64 and
128x128 depth and prints agent steps per second (wall clock, and per CPU-second of this
process, which is what one core delivers when the machine is shared). A step includes motion
with collision, depth rendering, geodesic lookup, metrics and auto-reset. Actions are random:
STOP with probability 1 % (episodes of ~100 steps), otherwise MOVE_FORWARD / TURN_LEFT /
TURN_RIGHT uniformly. Scenes are loaded before timing, so the numbers are steady state; the
one-off scene load time is printed separately. ``--workers process`` times the same lock-step
steps with one worker process per env (:class:`envs.ProcessVectorEnv`); its CPU-seconds are
this process's and the workers'. ``--rgb`` times each configuration with the depth camera alone
and with the RGB camera beside it (``sensors=["depth", "rgb"]``). ``--json FILE`` writes every
run with the date, host, load and commit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

from .pointnav.scenes import get_scene_set, load_scene

__all__ = ["run_benchmark", "main"]


def _cpu_seconds(pids):
    """CPU seconds (user + system) used so far by processes ``pids`` (Linux /proc)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def run_benchmark(*, num_envs, depth_size, scenes="default", seconds=3.0, seed=0,
                  workers="inprocess", sensors=("depth",)):
    """Measure one configuration (``workers``: ``"inprocess"`` or ``"process"``; ``sensors``
    the cameras); returns a dict with ``steps_per_s`` and ``steps_per_cpu_s``."""
    from . import make_vector_env

    env = make_vector_env("pointnav", num_envs, workers=workers, scenes=scenes, seed=seed,
                          depth_size=depth_size, sensors=list(sensors))
    pids = getattr(env, "pids", [])
    rng = np.random.default_rng(seed)
    # Actions are drawn up front so that only the environment is timed.
    actions = rng.choice(4, (1000, num_envs), p=[0.01, 0.33, 0.33, 0.33])
    env.reset()
    for k in range(20):
        env.step(actions[k])
    steps = episodes = 0
    k = 0
    wall0, cpu0 = time.perf_counter(), time.process_time() + _cpu_seconds(pids)
    while time.perf_counter() - wall0 < seconds:
        for _ in range(10):
            _, _, term, trunc, _ = env.step(actions[k % len(actions)])
            episodes += int(np.sum(term | trunc))
            k += 1
        steps += 10 * num_envs
    wall = time.perf_counter() - wall0
    cpu = time.process_time() + _cpu_seconds(pids) - cpu0
    env.close()
    return {"num_envs": num_envs, "depth_size": depth_size, "workers": workers,
            "sensors": list(sensors), "steps": steps, "episodes": episodes,
            "steps_per_s": steps / wall, "steps_per_cpu_s": steps / cpu}


def _facts():
    """When, where and on what this ran, for a raw results file: the keys of the project's
    ``benchmarks/provenance.py`` (``load_end`` is stamped when the file is written)."""
    from importlib import metadata

    def git(*args):
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                                  cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "none"

    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain")),
            "host": platform.node(), "cpu": cpu, "cores": os.cpu_count(),
            "load": list(os.getloadavg()), "load_end": None, "python": platform.python_version(),
            "torch": version("torch"), "mpi": f"mpich {version('mpich')}",
            "command": " ".join(["python -m envs.bench", *sys.argv[1:]])}


def main(argv=None):
    """Command-line entry point; prints a Markdown table."""
    parser = argparse.ArgumentParser(prog="python -m envs.bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--scenes", default="default", help="scene set (default: default)")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 16, 64],
                        help="numbers of environments per process (default: 1 16 64)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128],
                        help="depth image sizes (default: 64 128)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="timed seconds per configuration (default: 3)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per configuration; the best is shown, which filters out "
                             "interference on a shared machine (default: 1)")
    parser.add_argument("--stat", choices=("best", "median"), default="best",
                        help="what --repeat keeps of its runs (default: best)")
    parser.add_argument("--rgb", action="store_true",
                        help="time each configuration with depth alone and with depth + rgb")
    parser.add_argument("--json", metavar="FILE",
                        help="also write every run, with date, host, load and commit, to FILE")
    parser.add_argument("--workers", nargs="+", choices=("inprocess", "process"),
                        default=["inprocess"],
                        help="where the envs run: in this process (one batched step) and/or "
                             "one worker process per env (default: inprocess)")
    args = parser.parse_args(argv)

    record = _facts()
    sset = get_scene_set(args.scenes)
    t0 = time.perf_counter()
    for sid in sset.scene_ids("train"):
        load_scene(sid)
    load_s = time.perf_counter() - t0
    print(f"scene set {args.scenes!r}: {len(sset.scene_ids('train'))} train scenes loaded in "
          f"{load_s:.1f} s ({load_s / len(sset.scene_ids('train')) * 1e3:.0f} ms per scene)")
    print()
    pick = max if args.stat == "best" else statistics.median
    print("| envs | size | workers | sensors | steps/s (wall) | steps/s per CPU-second | "
          "episodes ended |")
    print("|-----:|-----:|:--------|:--------|---------------:|-----------------------:|"
          "---------------:|")
    every = []
    cameras = [("depth",), ("depth", "rgb")] if args.rgb else [("depth",)]
    for size in args.sizes:
        for n in args.envs:
            for workers in args.workers:
                for sensors in cameras:
                    runs = [run_benchmark(num_envs=n, depth_size=size, scenes=args.scenes,
                                          seconds=args.seconds, workers=workers, sensors=sensors)
                            for _ in range(max(1, args.repeat))]
                    every += runs
                    wall = pick([x["steps_per_s"] for x in runs])
                    cpu = pick([x["steps_per_cpu_s"] for x in runs])
                    episodes = pick([x["episodes"] for x in runs])
                    print(f"| {n} | {size}x{size} | {workers} | {'+'.join(sensors)} | "
                          f"{wall:,.0f} | {cpu:,.0f} | {episodes:,.0f} |", flush=True)
    if args.json:
        record["load_end"] = list(os.getloadavg())
        with open(args.json, "w") as fh:
            json.dump({"facts": record, "stat": args.stat, "scene_load_s": load_s,
                       "runs": every}, fh, indent=1)


if __name__ == "__main__":
    main()
