"""Time and bytes of one global model average on the float32 and the 16-bit wires (global_precision).

Run under mpiexec (docs/optimizers.md#low-precision-global-exchange)::

    mpiexec -n 4 python benchmarks/global_precision.py --mib 16

Every call is a global average over all ranks, everyone on time (a barrier before each): the native
collective's blocking global (WAGMA's; bytes from ``CollectiveInfo.bytes_sent``), and LocalSGD's
global average (MPI_Iallreduce for fp32, the bounded 16-bit reduce-scatter + allgather otherwise).
Median over repetitions of the slowest rank's time.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

import provenance
from native_coll import WaitAvoidingAllreduce
from wagma_rl.bounded_comm import BoundedComm
from wagma_rl.optim.averaging import global_average

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


def timed(fn, reps: int, warmup: int = 2) -> float:
    """Median over reps of the slowest rank's duration of fn(), in seconds."""
    per_call = []
    for i in range(warmup + reps):
        COMM.Barrier()
        t0 = time.perf_counter()
        fn()
        dt = COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if i >= warmup:
            per_call.append(dt)
    return statistics.median(per_call)


def native_row(n: int, precision: str, reps: int) -> tuple[float, int]:
    rng = np.random.default_rng(RANK)
    base = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    buf = (base + rng.standard_normal(n).astype(np.float32) * np.float32(1e-2)).astype(np.float32)
    sent = []
    with WaitAvoidingAllreduce(COMM, buf, group_size=1, sync_period=1, timeout=600,
                               global_precision=precision,
                               global_base=None if precision == "fp32" else base) as wa:
        ms = timed(lambda: sent.append(wa.allreduce(late="merge").bytes_sent), reps)
    return ms, sent[-1]


def local_sgd_row(n: int, precision: str, reps: int, deadline: BoundedComm) -> float:
    rng = np.random.default_rng(RANK)
    base = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    model = (base + rng.standard_normal(n).astype(np.float32) * np.float32(1e-2)).astype(np.float32)
    array = np.zeros(n + SIZE, np.float32)

    def once():
        array[:n] = model
        global_average(deadline, array, numel=n, step=0, precision=precision,
                       base=None if precision == "fp32" else base)

    return timed(once, reps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=16, help="model size in MiB of float32")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None, help="also write the table (markdown) to this file, "
                    "and the raw figures with the run's facts beside it (.json)")
    args = ap.parse_args()
    facts = provenance.facts(config=dict(vars(args), ranks=SIZE)) if RANK == 0 else None
    n = (args.mib << 20) // 4
    deadline = BoundedComm(COMM, timeout=600)
    rows = []
    for precision in ("fp32", "bf16", "fp16"):
        ms, sent = native_row(n, precision, args.reps)
        py = local_sgd_row(n, precision, args.reps, deadline)
        rows.append((precision, ms, sent, py))
        if RANK == 0:
            print(f"  {precision}: native {ms*1e3:.1f} ms, {sent} bytes sent; "
                  f"LocalSGD {py*1e3:.1f} ms", flush=True)
    deadline.free()
    if RANK != 0:
        return
    lines = [f"### {SIZE} ranks on {os.cpu_count()} cores, {args.mib} MiB model, load average "
             f"{os.getloadavg()[0]:.2f} at the end", "",
             "| global_precision | native blocking global | bytes sent per rank | LocalSGD global average |",
             "|---|---|---|---|"]
    for precision, ms, sent, py in rows:
        lines.append(f"| {precision} | {ms*1e3:.1f} ms | {sent / 2**20:.2f} MiB | {py*1e3:.1f} ms |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
        provenance.write_raw(provenance.beside(args.out), facts, ranks=SIZE, mib=args.mib,
                             rows=[dict(precision=p, native_s=ms, bytes_sent=sent, local_sgd_s=py)
                                   for p, ms, sent, py in rows])


if __name__ == "__main__":
    main()
