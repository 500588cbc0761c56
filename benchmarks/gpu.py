"""GPU benchmark of the trainer: the batch simulator alone, then whole training runs.

    python benchmarks/gpu.py --out benchmarks/results/gpu            # on a GPU node (~6 min)
    python benchmarks/gpu.py --device cpu --quick --out /tmp/gpu     # the same code on cpu

Part 1 steps :class:`envs.pointnav.torch_sim.TorchPointNavSim` with random actions (1 % STOP) at
several batch sizes and depth sizes and prints simulator steps per second (after warm-up and CUDA
graph capture; timed between two device synchronisations), with the numpy simulator in the same
run as the reference. Part 2 runs ``run_ddppo.py`` under the venv's ``mpiexec`` for each row of a
sweep (policy size x ranks x envs per rank x precision x simulator) and reads every rank's trace
(``<run>/trace/rank_*.csv``): frames per second of the whole GPU (all ranks' frames over rank 0's
wall time from the end of update ``--skip`` to the last), and the medians of collection, update
and averaging (communication + waiting) seconds per update. Each run has a frame budget and a wall
cap (a run past its cap is ended and counted up to its last flushed update). The table goes to
stdout and ``<out>.md``, the raw figures (with date, commit, host, versions) to ``<out>.json``.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402  (date, commit, host, load, versions)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from native_coll.mpienv import mpiexec_path  # noqa: E402
from wagma_rl.job.tblog import scalar_events  # noqa: E402
from wagma_rl.rl.trace import job_series  # noqa: E402

DEFAULT_POLICY = ["policy.hidden_size=128", "policy.rnn_type=gru", "policy.rnn_layers=1",
                  "policy.base_planes=8", "policy.resnet_layers=[1,1,1]", "env.depth_size=32",
                  "ppo.num_steps=64", "ppo.lr=2.0e-3"]
"""configs/wagma_pointnav.yaml's policy and rollout (the `make train` job), on ddppo_gpu.yaml."""


def sweep(quick: bool) -> list[dict]:
    """The training runs: name, ranks, overrides on configs/ddppo_gpu.yaml, frame budget, cap."""
    if quick:  # the same code paths at a size a 2-core CI machine runs in seconds
        tiny = ["policy.hidden_size=32", "policy.rnn_layers=1", "policy.base_planes=4",
                "policy.resnet_layers=[1]", "env.depth_size=16", "ppo.num_steps=16",
                "env.scenes=trivial", "ppo.num_mini_batch=2"]
        return [dict(name="tiny, batch sim", ranks=1, over=tiny + ["env.num_envs=4"],
                     frames=16 * 4 * 6, cap=120),
                dict(name="tiny, numpy sim", ranks=2, over=tiny + ["env.num_envs=4",
                                                                   "env.device=numpy"],
                     frames=16 * 8 * 6, cap=120)]
    # DD-PPO's policy takes configs/ddppo_gpu.yaml's mini-batch of 32 envs x 128 steps (4,096
    # frames, ~20 GB of activations in bf16); at 4 and 8 ranks on one 80 GB GPU 8 envs (1,024
    # frames). Rows: policy size x ranks x envs per rank x precision (``--only`` picks some by
    # name).
    runs = []
    for ranks, envs, precision in ((4, 64, "bf16"), (2, 128, "bf16"), (4, 64, "tf32"),
                                   (1, 256, "bf16"), (8, 32, "bf16")):
        runs.append(dict(name=f"DD-PPO policy, {ranks} x {envs}, {precision}", ranks=ranks,
                         over=[f"env.num_envs={envs}",
                               f"ppo.num_mini_batch={envs // (32 if ranks <= 2 else 8)}",
                               f"run.precision={precision}"],
                         frames=128 * ranks * envs * 7, cap=50))
    for ranks, envs, precision in ((4, 128, "fp32"), (8, 64, "fp32"), (1, 512, "fp32"),
                                   (4, 128, "bf16")):
        runs.append(dict(name=f"default policy, {ranks} x {envs}, {precision}", ranks=ranks,
                         over=DEFAULT_POLICY + [f"env.num_envs={envs}",
                                                f"run.precision={precision}"],
                         frames=64 * ranks * envs * 9, cap=40))
    runs.append(dict(name="default policy, 4 x 16, numpy sim (before)", ranks=4,
                     over=DEFAULT_POLICY + ["env.num_envs=16", "run.precision=fp32",
                                            "env.device=numpy"],
                     frames=64 * 4 * 16 * 9, cap=40))
    return runs


# ------------------------------------------------------------------------------ the simulator
SIM_CASTS = {"eager": {}, "fixed": dict(early_exit=False), "compiled": dict(compile=True)}
"""The batch simulator's ray casts (``--sim-casts``): its default (eager; early exit on cpu
only), eager through every chunk (as on a GPU), and torch.compile'd (every chunk)."""


def bench_sim(device: str, num_envs: int, depth: int, seconds: float, *,
              cast: str = "eager") -> float:
    """Steps per second of the batch simulator with ``num_envs`` envs on ``device`` and the ray
    cast ``cast`` (a key of :data:`SIM_CASTS`; a compiled cast compiles before the clock starts)."""
    from envs.pointnav.torch_sim import TorchPointNavSim

    sim = TorchPointNavSim(num_envs, device=device, depth_size=depth, seed=0, **SIM_CASTS[cast])
    gen = torch.Generator(device=device).manual_seed(0)
    probs = torch.tensor([0.01, 0.33, 0.33, 0.33], device=device)
    actions = torch.multinomial(probs.expand(num_envs * 64, 4), 1, generator=gen).view(64, -1)
    sim.reset()
    for k in range(5):  # eager steps, then the CUDA graph capture
        sim.step(actions[k])
    _sync(device)
    k, start = 0, time.perf_counter()
    while True:
        for _ in range(20):
            sim.step(actions[k % 64])
            k += 1
        _sync(device)
        if time.perf_counter() - start >= seconds:
            break
    return k * num_envs / (time.perf_counter() - start)


def bench_numpy_sim(num_envs: int, depth: int, seconds: float) -> float:
    """Steps per second of the numpy simulator (the reference) in this process."""
    from envs.pointnav.sim import PointNavSim

    sim = PointNavSim(num_envs, depth_size=depth, seed=0)
    actions = np.random.default_rng(0).choice(4, (64, num_envs), p=[0.01, 0.33, 0.33, 0.33])
    sim.reset()
    for k in range(5):
        sim.step(actions[k])
    k, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sim.step(actions[k % 64])
        k += 1
    return k * num_envs / (time.perf_counter() - start)


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------ the PPO update
UPDATE_ROWS = (  # name, precision, memory format, cudnn.benchmark, frames per mini-batch,
    # where GroupNorm computes (policy.norm_precision), torch.compile of the encoder
    ("bf16, NCHW", "bf16", "contiguous", False, 1024, "fp32", False),
    ("bf16, NCHW, cudnn.benchmark", "bf16", "contiguous", True, 1024, "fp32", False),
    ("bf16, channels-last", "bf16", "channels_last", False, 1024, "fp32", False),
    ("bf16, NCHW, GroupNorm in bf16", "bf16", "contiguous", False, 1024, "autocast", False),
    ("bf16, NCHW, 4,096-frame mini-batches", "bf16", "contiguous", False, 4096, "fp32", False),
    ("bf16, NCHW, GroupNorm in bf16, 4,096-frame mini-batches", "bf16", "contiguous", False, 4096,
     "autocast", False),
    ("bf16, NCHW, GroupNorm in bf16, 8,192-frame mini-batches", "bf16", "contiguous", False, 8192,
     "autocast", False),
    ("bf16, NCHW, compiled encoder, 4,096-frame mini-batches", "bf16", "contiguous", False, 4096,
     "fp32", True),
    ("bf16, NCHW, GroupNorm in bf16, compiled encoder, 4,096-frame mini-batches", "bf16",
     "contiguous", False, 4096, "autocast", True),
    ("tf32, NCHW", "tf32", "contiguous", False, 1024, "fp32", False),
)


def _fill_rollout(storage, policy, envs: int, steps: int, depth: int, dev: torch.device) -> None:
    """A full lock-step rollout of random observations and steps, recorded through the storage's
    own calls (an episode starts every 20 steps)."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):
        return torch.rand(*shape, generator=g).to(dev)

    storage.set_first(depth=rand(envs, depth, depth, 1), goal=rand(envs, 2))
    hidden = policy.initial_state(envs, device=dev)
    for t in range(steps):
        storage.insert(actions=torch.randint(0, policy.num_actions, (envs,), generator=g).to(dev),
                       log_probs=rand(envs).log(), values=rand(envs), rewards=rand(envs) - 0.5,
                       next_depth=rand(envs, depth, depth, 1), next_goal=rand(envs, 2),
                       next_hidden=hidden,
                       next_masks=torch.full((envs,), float((t + 1) % 20 != 0), device=dev))


def bench_update(device: str, *, quick: bool, repeats: int, profile: str | None,
                 only: list[str] | None = None) -> list[dict]:
    """Seconds of one PPO update (2 epochs) of DD-PPO's policy on a synthetic rollout (64 envs x
    128 steps of 128x128 depth, an episode start every 20 steps), per row of
    :data:`UPDATE_ROWS`: the median of ``repeats`` after one untimed update; ``profile``: a path
    for the first row's kernel table (torch.profiler, one update); ``only``: the rows whose names
    are among these (all when None). A compiled row's untimed update pays the compilation."""
    from wagma_rl.job.device import memory_format
    from wagma_rl.job.precision import apply_run_settings
    from wagma_rl.rl.policy import PointNavPolicy
    from wagma_rl.rl.ppo import ppo_update
    from wagma_rl.rl.storage import RolloutStorage

    dev = torch.device(device)
    envs, steps, depth = (8, 16, 32) if quick else (64, 128, 128)
    size = dict(hidden_size=32, rnn_layers=1, base_planes=4, resnet_layers=(1, 1)) if quick else \
        dict(hidden_size=512, rnn_layers=2, base_planes=32, resnet_layers=(3, 4, 6, 3))
    rows = []
    for name, precision, layout, benchmark, mb_frames, norm, compiled in UPDATE_ROWS:
        if only is not None and name not in only:
            continue
        if quick:  # the code path only: bf16 autocast on a cpu without bf16 units is slow
            precision = "fp32"
        apply_run_settings(precision, cudnn_benchmark=benchmark)
        torch.manual_seed(0)
        # quick: torch.compile's graph capture without TorchInductor's C++ build
        backend = ("eager" if quick else True) if compiled else False
        policy = PointNavPolicy(depth_size=depth, rnn_type="lstm", memory_format=memory_format(
            layout, dev), norm_precision=norm, compile_encoder=backend, **size).to(dev)
        optimizer = torch.optim.Adam(policy.parameters(), lr=2.5e-4)
        storage = RolloutStorage(num_steps=steps, num_envs=envs, depth_shape=(depth, depth, 1),
                                 num_recurrent_layers=policy.num_recurrent_layers,
                                 hidden_size=size["hidden_size"], device=dev)
        _fill_rollout(storage, policy, envs, steps, depth, dev)
        mini_batches = max(1, envs * steps // (mb_frames if not quick else 32))

        def once(seed: int) -> float:
            _sync(device)
            start = time.perf_counter()
            ppo_update(policy, optimizer, storage, gamma=0.99, lam=0.95, clip=0.2, ppo_epoch=2,
                       num_mini_batch=mini_batches, value_coef=0.5, entropy_coef=0.01,
                       max_grad_norm=0.2, generator=torch.Generator().manual_seed(seed),
                       precision=precision)
            _sync(device)
            return time.perf_counter() - start

        try:
            once(0)
            times = [once(seed) for seed in range(1, repeats + 1)]
        except (RuntimeError, ValueError) as exc:  # e.g. out of memory: say so, go on
            rows.append(dict(name=name, failed=str(exc).splitlines()[0]))
            continue
        rows.append(dict(name=name, precision=precision, memory_format=layout,
                         cudnn_benchmark=benchmark, norm_precision=norm, compiled=compiled,
                         mini_batches=mini_batches,
                         frames=envs * steps, update_s=round(statistics.median(times), 4),
                         all_s=[round(t, 4) for t in times]))
        if profile and len(rows) == 1:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
            with torch_profile(activities=acts) as prof:
                once(99)
            key = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
            Path(profile).write_text(prof.key_averages().table(sort_by=key, row_limit=30,
                                                               max_name_column_width=70))
        if dev.type == "cuda":  # the next row's model replaces this one
            torch.cuda.empty_cache()
    apply_run_settings("fp32", cudnn_benchmark=False)
    return rows


# ------------------------------------------------------------------------------ time to success
def success_rows(quick: bool) -> list[dict]:
    """Runs of ``make train``'s job (configs/wagma_pointnav.yaml: the default policy, WAGMA at 4
    ranks) to a success target: on the node's cpu as `make train` runs it (4 ranks sharing the
    cores this process may use: ``threads`` torch threads each), and on the GPU with more envs
    per rank."""
    if quick:
        tiny = ["policy.hidden_size=16", "policy.base_planes=4", "policy.resnet_layers=[1]",
                "env.depth_size=16", "ppo.num_steps=16", "env.scenes=trivial"]
        return [dict(name="cpu, tiny, 1 x 4", device="cpu", ranks=1, threads=1,
                     over=tiny + ["env.num_envs=4"], cap=60)]
    threads = max(1, len(os.sched_getaffinity(0)) // 4)  # the cores this process may use
    cpu = dict(device="cpu", ranks=4, threads=threads, over=["env.num_envs=4"], cap=330)
    rows = [dict(name=f"make train's job on cpu, 4 x 4, {threads} threads per rank", **cpu)]
    for envs, cap in ((16, 100), (32, 100), (128, 120)):
        rows.append(dict(name=f"make train's job on the GPU, 4 x {envs}", device="cuda", ranks=4,
                         threads=1, over=[f"env.num_envs={envs}"], cap=cap))
    # More Adam steps per frame at 32 envs: on cpu (docs/results/gpu.md, frames to success at
    # a GPU's envs per rank) 16-step rollouts reached 0.8 in 0.69-0.77x the frames 8 mini-batches
    # took, and the config's 64-step rollouts in 2 mini-batches not within 600k frames.
    for label, over in (("16 steps", ["ppo.num_steps=16"]),
                        ("8 mini-batches", ["ppo.num_mini_batch=8"])):
        rows.append(dict(name=f"make train's job on the GPU, 4 x 32, {label}", device="cuda",
                         ranks=4, threads=1, over=["env.num_envs=32", *over], cap=100))
    return rows


def _success_times(folder: Path) -> list[tuple[float, int, float]]:
    """(Unix time, frames, success) of each TensorBoard point of ``metrics/success``."""
    return sorted((wall, step, value) for tag, wall, step, value in scalar_events(folder)
                  if tag == "metrics/success")


def time_to_success(run: dict, *, target: float, workdir: Path, mpiexec: str = "") -> dict:
    """Train ``run`` until its logged success first reaches ``target`` (or its cap); the time is
    counted from the launch, start-up included."""
    folder = workdir / ("success_" + "".join(c if c.isalnum() else "_" for c in run["name"]))
    shutil.rmtree(folder, ignore_errors=True)
    over = [f"run.dir={folder}", f"run.device={run['device']}", "run.total_frames=100000000",
            "run.auto_resume=false", "run.log_interval=2", "run.checkpoint_interval=0",
            f"run.torch_threads={run['threads']}", *run["over"]]
    mpiexec = mpiexec or mpiexec_path()
    cmd = [mpiexec, "-n", str(run["ranks"]), sys.executable, str(ROOT / "run_ddppo.py"),
           "--config", str(ROOT / "configs" / "wagma_pointnav.yaml"), *over]
    env = dict(os.environ, OMP_NUM_THREADS=str(run["threads"]), PYTHONUNBUFFERED="1")
    # The run's output goes to a file: nothing reads a pipe while it trains (a full pipe would
    # stall it).
    log_path = workdir / (folder.name + ".log")
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, env=env)
    reached = None
    while proc.poll() is None and time.time() - start < run["cap"]:
        time.sleep(2.0)
        if (folder / "tb").is_dir():
            points = _success_times(folder)
            hit = [p for p in points if p[2] >= target]
            if hit:
                reached = hit[0]
                break
    _stop(proc)
    points = _success_times(folder) if (folder / "tb").is_dir() else []
    out = dict(name=run["name"], device=run["device"], ranks=run["ranks"], overrides=run["over"],
               target=target, cap_s=run["cap"], command=" ".join(cmd),
               best=max((p[2] for p in points), default=None))
    first = _first_traced(folder / "trace", target)
    if reached and first:
        # WAGMA logs success only at its global averages; the trace has it at every update.
        out.update(seconds=round(first[0] - start, 1), frames=first[1],
                   seconds_logged=round(reached[0] - start, 1), frames_logged=reached[1],
                   success_from="trace")
    elif reached:
        out.update(seconds=round(reached[0] - start, 1), frames=reached[1],
                   success_from="tensorboard")
    else:
        out.update(status=f"not reached in {run['cap']} s",
                   frames_at_cap=points[-1][1] if points else 0)
        if not points:
            out["tail"] = log_path.read_text()[-2000:]
    return out


def _first_traced(trace: Path, target: float) -> tuple[float, int] | None:
    """(Unix time, frames) at the end of the first update whose job success (every worker's
    episode window, :func:`job_series`) reached ``target``; None without such an update or a
    trace with the episode columns."""
    try:
        job = job_series(trace)
    except ValueError:
        return None
    with np.errstate(invalid="ignore"):
        hit = np.flatnonzero(job["success"] >= target)
    return (float(job["end"][hit[0]]), int(job["frames"][hit[0]])) if hit.size else None


def _stop(proc: subprocess.Popen) -> str:
    """End ``proc``'s process group if it still runs (SIGTERM, SIGKILL after 15 s); the output
    left in its pipe ("" when it writes elsewhere)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    return out or ""


# ------------------------------------------------------------------------------ training runs
def run_training(run: dict, *, device: str, workdir: Path, skip: int, mpiexec: str = "") -> dict:
    """One training run under mpiexec; its figures from the ranks' traces."""
    folder = workdir / run["name"].replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
    over = [f"run.dir={folder}", f"run.device={device}", f"run.total_frames={run['frames']}",
            "run.auto_resume=false", "run.log_interval=1000", "run.checkpoint_interval=0",
            "run.tensorboard=false", "averaging.sync_period=2", *run["over"]]
    mpiexec = mpiexec or mpiexec_path()
    cmd = [mpiexec, "-n", str(run["ranks"]), sys.executable, str(ROOT / "run_ddppo.py"),
           "--config", str(ROOT / "configs" / "ddppo_gpu.yaml"), *over]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=run["cap"])
        status = "finished" if proc.returncode == 0 else f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        out = _stop(proc)
        status = f"capped at {run['cap']} s"
    figures = dict(name=run["name"], ranks=run["ranks"], overrides=run["over"], status=status,
                   wall_s=round(time.perf_counter() - start, 1), command=" ".join(cmd))
    figures.update(_trace_figures(folder, skip=skip, num_envs=_num_envs(run["over"])))
    if "fps" not in figures:
        figures["tail"] = out[-2000:]
        errors = [line for line in out.splitlines() if "Error" in line or "error:" in line]
        figures["first_errors"] = errors[:5]
    return figures


def _num_envs(over: list[str]) -> int:
    for item in over:
        if item.startswith("env.num_envs="):
            return int(item.split("=", 1)[1])
    return 64


def _trace_figures(folder: Path, *, skip: int, num_envs: int) -> dict:
    rows = {}
    for path in sorted((folder / "trace").glob("rank_*.csv")):
        with open(path) as fh:
            rows[path.stem] = list(csv.DictReader(fh))
    if not rows or not rows.get("rank_00000"):
        return {}
    updates = min(len(r) for r in rows.values())
    if updates < skip + 2:
        return {"updates": updates}
    first, last = skip, updates - 1
    t0 = float(rows["rank_00000"][first]["time"])
    t1 = float(rows["rank_00000"][last]["time"])
    frames = sum(int(r[u]["steps"]) * num_envs for r in rows.values()
                 for u in range(first + 1, last + 1))
    med = lambda key: statistics.median(float(r[u][key]) for r in rows.values()
                                        for u in range(first + 1, last + 1))
    return dict(updates=updates, fps=round(frames / (t1 - t0), 1),
                collect_s=round(med("collect_s"), 4), update_s=round(med("update_s"), 4),
                average_s=round(statistics.median(
                    float(r[u]["comm_s"]) + float(r[u]["wait_s"]) for r in rows.values()
                    for u in range(first + 1, last + 1)), 4))


def rest(report: dict) -> dict:
    """The report without its facts (write_raw puts those first)."""
    return {k: v for k, v in report.items() if k != "facts"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--out", required=True, help="output path without extension")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a cpu check)")
    parser.add_argument("--sim-only", action="store_true", help="the simulator only")
    parser.add_argument("--parts", default="sim,training",
                        help="comma-separated, in this order: sim (the simulator alone), update "
                             "(the PPO update's settings, one process), training (the sweep), "
                             "success (time to --target success against the cpu run)")
    parser.add_argument("--update-repeats", type=int, default=3, help="timed updates per row")
    parser.add_argument("--profile", default=None, help="update part: write the first row's "
                        "kernel table here")
    parser.add_argument("--target", type=float, default=0.8, help="success part: the target")
    parser.add_argument("--extra", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides added to every row of the training part and "
                             "to the GPU rows of the success part")
    parser.add_argument("--sim-seconds", type=float, default=3.0)
    parser.add_argument("--sim-sizes", nargs="*", default=None, metavar="ENVSxDEPTH",
                        help="simulator sizes, e.g. 1024x64 (default: a sweep for the device)")
    parser.add_argument("--sim-casts", nargs="+", default=["eager"], choices=list(SIM_CASTS),
                        help="the batch simulator's ray casts, a row each per size: eager (its "
                             "default; early exit on cpu only), fixed (eager through every "
                             "chunk), compiled (torch.compile, every chunk); default: eager")
    parser.add_argument("--skip", type=int, default=1, help="warm-up updates not timed")
    parser.add_argument("--workdir", default="runs/bench_gpu")
    parser.add_argument("--only", nargs="*", default=None,
                        help="run only the training rows whose name contains one of these")
    parser.add_argument("--update-rows", nargs="*", default=None, metavar="NAME",
                        help="update part: only these rows (their full names; default: all)")
    parser.add_argument("--cap", type=float, default=0,
                        help="training part: seconds per run at most (default: each row's own)")
    parser.add_argument("--mpiexec", default="",
                        help="the launcher of the training runs (default: the venv's mpiexec, "
                             "else PATH's); it must belong to the MPI mpi4py loads")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("benchmarks/gpu.py: CUDA is not available here; run it on a GPU node or pass "
              "--device cpu", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = {"sim"} if args.sim_only else set(args.parts.split(","))
    unknown = parts - {"sim", "update", "training", "success"}
    if unknown:
        parser.error(f"unknown --parts {sorted(unknown)}: use sim, update, training, success")
    names = [row[0] for row in UPDATE_ROWS]
    if args.update_rows is not None and (unknown := set(args.update_rows) - set(names)):
        parser.error(f"unknown --update-rows {sorted(unknown)}: the rows are {names}")
    facts = provenance.facts(args.device, config=vars(args))
    report = dict(facts=facts, simulator=[], update=[], training=[], success=[])
    lines = [f"# GPU benchmark ({facts['date']}, {facts.get('gpu', args.device)}, commit "
             f"{facts['commit']}{' dirty' if facts['dirty'] else ''})"]
    if "sim" in parts:
        _sim_part(args, report, lines)
    if "update" in parts:
        _update_part(args, report, lines, out)
    if "training" in parts:
        _training_part(args, report, lines, out, facts)
    if "success" in parts:
        _success_part(args, report, lines, out, facts)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    provenance.write_raw(out.with_suffix(".json"), facts, **rest(report))
    return 0


def _sim_part(args, report: dict, lines: list[str]) -> None:
    lines += ["", "## The simulator alone (random actions, steps/s)", "",
              "| simulator | device | envs | depth | steps/s |", "|---|---|---:|---:|---:|"]
    sizes = [(64, 32), (256, 64)] if args.quick else \
        [(1024, 64), (4096, 64), (16384, 64), (1024, 128)]
    if args.sim_sizes:
        sizes = [tuple(int(v) for v in item.lower().split("x")) for item in args.sim_sizes]
    for (n, depth), cast in ((size, cast) for size in sizes for cast in args.sim_casts):
        label = "batch (torch)" + ("" if args.sim_casts == ["eager"] else f", {cast} cast")
        try:
            rate = bench_sim(args.device, n, depth, args.sim_seconds, cast=cast)
        except (RuntimeError, ValueError) as exc:  # e.g. out of memory, Inductor: say so, go on
            reason = str(exc).strip().partition("\n")[0]
            print(f"| {label} | {args.device} | {n} | {depth} | failed: {reason} |", flush=True)
            continue
        report["simulator"].append(dict(sim="batch", cast=cast, device=args.device, envs=n,
                                         depth=depth, steps_per_s=round(rate)))
        lines.append(f"| {label} | {args.device} | {n} | {depth} | {rate:,.0f} |")
        print(lines[-1], flush=True)
    # The reference in the same run: at every size on a cpu run, else at one size.
    for n, depth in (sizes if torch.device(args.device).type == "cpu" else [(64, 64)]):
        rate = bench_numpy_sim(n, depth, args.sim_seconds)
        report["simulator"].append(dict(sim="numpy", device="cpu (1 core)", envs=n, depth=depth,
                                        steps_per_s=round(rate)))
        lines.append(f"| numpy (reference) | cpu, 1 core | {n} | {depth} | {rate:,.0f} |")
        print(lines[-1], flush=True)


def _update_part(args, report: dict, lines: list[str], out: Path) -> None:
    lines += ["", "## The PPO update alone (DD-PPO's policy, 64 envs x 128 steps, 2 epochs; "
              f"median of {args.update_repeats})", "",
              "| settings | mini-batches | update s |", "|---|---:|---:|"]
    for row in bench_update(args.device, quick=args.quick, repeats=args.update_repeats,
                            profile=args.profile, only=args.update_rows):
        report["update"].append(row)
        if "failed" in row:
            lines.append(f"| {row['name']} | - | failed: {row['failed']} |")
        else:
            lines.append(f"| {row['name']} | {row['mini_batches']} | {row['update_s']:.3f} |")
        print(lines[-1], flush=True)


def _picked(args, name: str) -> bool:
    return args.only is None or any(key in name for key in args.only)


def _training_part(args, report: dict, lines: list[str], out: Path, facts: dict) -> None:
    lines += ["", "## Training (frames/s of the whole device; medians per update)", "",
              "| run | ranks | frames/s | collect s | update s | averaging s | status |",
              "|---|---:|---:|---:|---:|---:|---|"]
    for run in sweep(args.quick):
        if not _picked(args, run["name"]):
            continue
        run = dict(run, over=run["over"] + list(args.extra), cap=args.cap or run["cap"],
                   name=run["name"] + "".join(f", {item}" for item in args.extra))
        fig = run_training(run, device=args.device, workdir=Path(args.workdir),
                           skip=args.skip, mpiexec=args.mpiexec)
        report["training"].append(fig)
        if "fps" in fig:
            lines.append(f"| {fig['name']} | {fig['ranks']} | {fig['fps']:,.0f} | "
                         f"{fig['collect_s']} | {fig['update_s']} | {fig['average_s']} | "
                         f"{fig['status']} |")
        else:
            lines.append(f"| {fig['name']} | {fig['ranks']} | - | - | - | - | "
                         f"{fig['status']}, {fig.get('updates', 0)} updates |")
        print(lines[-1], flush=True)
        provenance.write_raw(out.with_suffix(".json"), facts, **rest(report))


def _success_part(args, report: dict, lines: list[str], out: Path, facts: dict) -> None:
    lines += ["", f"## Time to success {args.target} (make train's job; seconds from the launch)",
              "", "| run | device | seconds | frames | best success |", "|---|---|---:|---:|---:|"]
    for run in success_rows(args.quick):
        if not _picked(args, run["name"]):
            continue
        if run["device"] == "cuda":  # (the cpu row is the reference: GPU keys stay off it)
            run = dict(run, over=run["over"] + list(args.extra),
                       name=run["name"] + "".join(f", {item}" for item in args.extra))
        fig = time_to_success(run, target=args.target, workdir=Path(args.workdir),
                              mpiexec=args.mpiexec)
        report["success"].append(fig)
        seconds = fig.get("seconds", fig.get("status"))
        frames = fig.get("frames", fig.get("frames_at_cap"))
        lines.append(f"| {fig['name']} | {fig['device']} | {seconds} | {frames:,} | "
                     f"{fig['best'] if fig['best'] is None else round(fig['best'], 3)} |")
        print(lines[-1], flush=True)
        provenance.write_raw(out.with_suffix(".json"), facts, **rest(report))


if __name__ == "__main__":
    raise SystemExit(main())
