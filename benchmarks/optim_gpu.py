"""Throughput of the distributed optimizers on a ResNet, and the share of the step spent averaging.

Runs under mpiexec, one rank per process (ranks share the devices round-robin: four ranks on one
GPU is the case of issue 31). Every rank trains the project's ResNet (``wagma_rl.supervised.models``,
``--arch resnet50 --width 64``: 23.5M parameters, the shapes of ``configs/resnet_shapes.yaml
model.arch=resnet50``) on synthetic batches (no data loading in the measurement), once per row:

* ``none1``: rank 0 alone with the plain torch optimizer, the other ranks idle;
* ``none``: every rank with the plain torch optimizer, no averaging (the device shared);
* ``allreduce0``: AllreduceSGD averaging everything after the backward pass (``bucket_bytes=0``);
* ``allreduce``: AllreduceSGD with ``--bucket-mb`` buckets started during the backward pass;
* ``allreduce_node``: AllreduceSGD with ``exchange="node"`` (the ranks add each other's gradients
  in buffers they all map: CUDA IPC on a GPU, an MPI shared window on cpu);
* ``wagma``: WAGMA, groups of 2, a global average every 10;
* ``wagma_bg``: the same with ``background=True`` (each average runs on a thread while the next
  forward and backward pass compute);
* ``local_sgd`` / ``local_sgd_bg``: LocalSGD averaging after every step, blocking / in the background;
* ``dpsgd`` / ``dpsgd_bg``: D-PSGD ring gossip after every step, blocking / in the background;
* ``nonblocking``: NonBlockingSGD, each batch in 2 micro-batches.

(``--rows`` picks some; the default is the first six, in that order.)

Each row warms up, then runs windows of ``--window`` steps for about ``--seconds`` (or
``--max-steps``; every rank the same number of windows, sized by rank 0 from one untimed window); the device is synchronised at each window's end only (the benchmark may; the
optimizers never do). Columns: the job's samples/s (the median window, summed over ranks); the
share of the training time each rank spent inside the optimizers' communication (``stats.comm_time_s``
/ wall time, the figure of issue 31's table, mean over ranks; for a background row, the time the
step waited for the average in flight); the slowdown against ``none, N ranks``. ``--json`` writes
the rows with the run's facts (``benchmarks/provenance.py``: date, commit, dirty flag, host CPU
and cores, load at start and end, versions, command).

Tiny on cpu (a few seconds a row)::

    mpiexec -n 2 python benchmarks/optim_gpu.py --device cpu --arch resnet18 --width 4 \\
        --image-size 8 --batch 8 --seconds 2

ResNet-50 at 4 ranks on one GPU (about 3 minutes)::

    .venv/bin/mpiexec -n 4 .venv/bin/python benchmarks/optim_gpu.py --device cuda --seconds 25 \
        --json benchmarks/results/optim_gpu.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import provenance  # noqa: E402
from wagma_rl.job.precision import apply_precision, autocast  # noqa: E402
from wagma_rl.optim import build_optimizer  # noqa: E402
from wagma_rl.supervised.models import resnet18, resnet50  # noqa: E402

__all__ = ["main", "parse_args", "rows_to_markdown"]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda or cpu (ranks share the GPUs round-robin)")
    ap.add_argument("--arch", default="resnet50", choices=["resnet18", "resnet50"])
    ap.add_argument("--width", type=int, default=64, help="channels of the first stage (64: full size)")
    ap.add_argument("--image-size", type=int, default=32, help="pixels per side (CIFAR stem)")
    ap.add_argument("--classes", type=int, default=6)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--seconds", type=float, default=25.0, help="timed seconds per row")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per row")
    ap.add_argument("--window", type=int, default=5, help="steps per timed window")
    ap.add_argument("--max-steps", type=int, default=100_000, help="timed steps per row at most")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="AllreduceSGD's bucket size (after row)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--channels-last", action="store_true", help="NHWC weights and batches")
    ap.add_argument("--rows", default="none1,none,allreduce0,allreduce,wagma,wagma_bg",
                    help="comma-separated rows: none1, none, allreduce0, allreduce, wagma, wagma_bg, "
                         "local_sgd, local_sgd_bg, dpsgd, dpsgd_bg, nonblocking")
    ap.add_argument("--json", default="", help="also write the rows here (rank 0)")
    return ap.parse_args(argv)


def _device(name: str, comm: MPI.Comm) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available here; pass --device cpu")
    local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    return torch.device("cuda", local % torch.cuda.device_count())


def _quiet_barrier(comm: MPI.Comm) -> None:
    """A barrier that sleeps instead of spinning, so idle ranks leave the cores to the busy one."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(1e-3)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the benchmark's clock only; the optimizers never do this


def _run_row(row: str, args, comm: MPI.Comm, device: torch.device) -> dict | None:
    """Train one row on this rank; returns its figures (None on a rank that sits the row out)."""
    active = comm.rank == 0 if row == "none1" else True
    torch.manual_seed(0)
    build = resnet50 if args.arch == "resnet50" else resnet18
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = build(num_classes=args.classes, width=args.width, small_input=True).to(device, memory_format=fmt)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    opt = sgd
    if row in OPTIMIZERS:
        name, kw = OPTIMIZERS[row]
        if name == "allreduce" and "bucket_bytes" not in kw and "exchange" not in kw:
            kw = dict(bucket_bytes=int(args.bucket_mb * 2**20))
        if name == "wagma":
            kw = dict(kw, group_size=min(2, comm.size))
        opt = build_optimizer(name, sgd, comm=comm, buffers=list(model.buffers()), **kw)
    g = torch.Generator(device="cpu").manual_seed(comm.rank)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g).to(device, memory_format=fmt)
    y = torch.randint(0, args.classes, (args.batch,), generator=g).to(device)
    params = sum(p.numel() for p in model.parameters())

    def step() -> None:
        if row == "nonblocking":  # its micro-batches, each published after its backward pass
            for xs, ys in zip(x.chunk(2), y.chunk(2)):
                with autocast(device, args.precision):
                    loss = torch.nn.functional.cross_entropy(model(xs), ys)
                loss.backward()
                if not opt.micro_step():
                    break
        else:
            with autocast(device, args.precision):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()

    if not active:
        _quiet_barrier(comm)
        return None
    for _ in range(args.warmup):
        step()
    _sync(device)
    averaging = opt is not sgd
    # Every rank runs the same number of windows (a rank that stopped early would leave a peer
    # alone in a global average): rank 0 sizes them to --seconds from one calibration window.
    t0 = time.perf_counter()
    for _ in range(args.window):
        step()
    _sync(device)
    per_window = time.perf_counter() - t0
    n_windows = max(1, min(int(args.seconds / max(per_window, 1e-9)), args.max_steps // args.window))
    if row != "none1":  # (none1: rank 0 alone)
        n_windows = comm.bcast(n_windows if comm.rank == 0 else None, root=0)
    comm0 = opt.stats.comm_time_s if averaging else 0.0
    windows, steps, start = [], 0, time.perf_counter()
    while len(windows) < n_windows:
        t0 = time.perf_counter()
        for _ in range(args.window):
            step()
        _sync(device)
        windows.append(args.window * args.batch / (time.perf_counter() - t0))
        steps += args.window
    wall = time.perf_counter() - start
    comm_s = opt.stats.comm_time_s - comm0 if averaging else 0.0
    extra = dict(opt.stats.extra) if averaging else {}
    if averaging:
        opt.close()
    _quiet_barrier(comm)
    return {"samples_per_s": statistics.median(windows), "comm_share": comm_s / wall, "steps": steps,
            "wall_s": wall, "params": params,
            "buckets": extra.get("buckets"), "buckets_in_backward": extra.get("buckets_in_backward")}


#: row -> (build_optimizer name, options); the rows not here train with the plain torch optimizer.
OPTIMIZERS = {"allreduce0": ("allreduce", dict(bucket_bytes=0)), "allreduce": ("allreduce", {}),
              "allreduce_node": ("allreduce", dict(exchange="node")),
              "wagma": ("wagma", dict(sync_period=10)),
              "wagma_bg": ("wagma", dict(sync_period=10, background=True)),
              "local_sgd": ("local_sgd", dict(local_steps=1)),
              "local_sgd_bg": ("local_sgd", dict(local_steps=1, background=True)),
              "dpsgd": ("dpsgd", {}), "dpsgd_bg": ("dpsgd", dict(background=True)),
              "nonblocking": ("nonblocking", dict(micro_batches=2))}

LABELS = {"none1": "none, 1 rank", "none": "none, {n} ranks", "allreduce0": "AllreduceSGD, bucket_mb=0",
          "allreduce": "AllreduceSGD, bucket_mb={b:g}",
          "allreduce_node": "AllreduceSGD, exchange=node (shared buffers, no buckets)", "wagma": "WAGMA (group 2, global every 10)",
          "wagma_bg": "WAGMA (group 2, global every 10), background",
          "local_sgd": "LocalSGD (every step)", "local_sgd_bg": "LocalSGD (every step), background",
          "dpsgd": "D-PSGD", "dpsgd_bg": "D-PSGD, background",
          "nonblocking": "NonBlockingSGD (2 micro-batches)"}


def rows_to_markdown(rows: list[dict]) -> str:
    """The table rank 0 prints: one line per row of :func:`main`'s output."""
    ref = next((r["samples_per_s"] for r in rows if r["row"] == "none"), None)
    out = ["| optimizer | ranks | samples/s (median) | waiting for averaging | vs no averaging |",
           "|---|---:|---:|---:|---:|"]
    for r in rows:
        vs = f"{r['samples_per_s'] / ref:.2f}x" if ref and r["row"] != "none1" else "-"
        share = f"{100 * r['comm_share']:.0f}%" if r["row"] not in ("none", "none1") else "-"
        out.append(f"| {r['label']} | {r['ranks']} | {r['samples_per_s']:,.0f} | {share} | {vs} |")
    return "\n".join(out)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    record = provenance.facts(args.device, config=vars(args)) if comm.rank == 0 else None
    device = _device(args.device, comm)
    apply_precision(args.precision)
    if device.type == "cpu":
        torch.set_num_threads(1)
    rows = []
    for row in [r.strip() for r in args.rows.split(",") if r.strip()]:
        if row not in LABELS:
            raise SystemExit(f"--rows: unknown row {row!r}; choose from {sorted(LABELS)}")
        mine = _run_row(row, args, comm, device)
        if row == "none1":
            got = [mine] if comm.rank == 0 else []
            ranks = 1
        else:
            got = [g for g in comm.gather(mine, root=0) or [] if g is not None]
            ranks = comm.size
        if comm.rank == 0:
            rows.append({"row": row, "label": LABELS[row].format(n=comm.size, b=args.bucket_mb),
                         "ranks": ranks, "samples_per_s": sum(g["samples_per_s"] for g in got),
                         "comm_share": float(np.mean([g["comm_share"] for g in got])),
                         "steps": got[0]["steps"], "params": got[0]["params"],
                         "buckets": got[0]["buckets"], "buckets_in_backward": got[0]["buckets_in_backward"]})
            print(f"{rows[-1]['label']}: {rows[-1]['samples_per_s']:,.0f} samples/s, "
                  f"{100 * rows[-1]['comm_share']:.0f}% averaging", flush=True)
    if comm.rank == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(f"\n{args.arch} width {args.width} ({rows[0]['params']:,} parameters), "
              f"{args.image_size}x{args.image_size}, batch {args.batch} per rank, {args.precision}"
              f"{', channels-last' if args.channels_last else ''}, {comm.size} ranks on {name}\n")
        print(rows_to_markdown(rows), flush=True)
        if args.json:
            provenance.write_raw(args.json, record, args=vars(args), device=name, ranks=comm.size, rows=rows)
    return rows


if __name__ == "__main__":
    main()
