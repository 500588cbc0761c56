"""What the finiteness check costs next to the average it guards (not a test).

On a ResNet-50-sized flat buffer (25.6M float32), every rank times: the check itself
(``wagma_rl.optim.finite.is_finite``); the synchronous global average with the check folded in
(``averaging.global_average``, LocalSGD and ``synchronize``); D-PSGD's ring average with its tiny
agreement allreduce; the WAGMA native group and global averages; and the tiny bounded agreement
(``Deadline.allreduce`` of one value per rank) that WAGMA runs before each global average.
Prints a markdown table (rank 0) of medians.

    mpiexec -n 4 python benchmarks/faults_finite.py [--numel 25600000] [--repeat 7] [--out FILE]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

from wagma_rl.job.deadline import Deadline
from wagma_rl.optim.averaging import global_average, ring_average
from wagma_rl.optim.finite import is_finite


def median_ms(fn, repeat: int, comm: MPI.Comm) -> float:
    fn()
    times = []
    for _ in range(repeat):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    # The slowest rank's time: what the job sees.
    return comm.allreduce(statistics.median(times), op=MPI.MAX) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--numel", type=int, default=25_600_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--out", default="")
    args = p.parse_args()
    import torch
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    deadline = Deadline(comm, timeout=600)
    n = args.numel
    buf = np.random.default_rng(rank).standard_normal(n + size).astype(np.float32)
    rows = []
    check = median_ms(lambda: is_finite(buf[:n]), args.repeat, comm)
    rows.append(("finiteness check (one pass over the buffer)", check, None))
    avg = median_ms(lambda: global_average(deadline, buf, numel=n, step=0), args.repeat, comm)
    rows.append(("global average (allreduce, check folded in)", avg, check / (avg - check)))
    scratch = [None]

    def ring():
        scratch[0], _ = ring_average(deadline, buf[:n], scratch[0], step=0)
    ringt = median_ms(ring, args.repeat, comm)
    rows.append(("D-PSGD ring average (+ tiny agreement)", ringt, check / (ringt - check)))
    tiny = np.zeros(size, dtype=np.float64)
    agree = median_ms(lambda: deadline.allreduce(tiny), args.repeat * 20, comm)
    rows.append(("tiny bounded agreement (one value per rank)", agree, None))
    try:
        import native_coll
        t = torch.from_numpy(buf[:n])
        for kind, period in (("group", 1_000_000), ("global", 1)):
            wa = native_coll.WaitAvoidingAllreduce(comm, t, group_size=min(2, size), sync_period=period)
            ms = median_ms(lambda: wa.allreduce(), args.repeat, comm)
            extra = check + (agree if kind == "global" else 0.0)
            rows.append((f"WAGMA {kind} average (native)", ms, extra / ms))
            wa.close()
    except ImportError:
        pass
    if rank == 0:
        lines = [f"{size} ranks, {n / 1e6:.1f}M float32 ({n * 4 / 2**20:.0f} MiB), median of {args.repeat}, "
                 "slowest rank", "",
                 "| operation | ms | check cost / average |", "|---|---:|---:|"]
        for name, ms, ratio in rows:
            lines.append(f"| {name} | {ms:.2f} | {'-' if ratio is None else f'{100 * ratio:.1f}%'} |")
        text = "\n".join(lines)
        print(text, flush=True)
        if args.out:
            with open(args.out, "w") as fh:
                fh.write(text + "\n")
    deadline.free()


if __name__ == "__main__":
    main()
