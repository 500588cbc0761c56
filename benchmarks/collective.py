"""Benchmark of native_coll's wait-avoiding group allreduce against blocking allreduces.

Run under mpiexec (4 and 8 ranks in docs/collective.md)::

    mpiexec -n 4 python benchmarks/collective.py --group-size 4 --out benchmarks/results/collective_4.md

Part 1, everyone on time: time per call (median over repetitions of the slowest rank's time, with a
barrier before every call) for buffers of 4 KiB to 64 MiB: our group allreduce, MPI_Allreduce over
a communicator of the group's size, MPI_Allreduce over all ranks, torch.distributed (gloo) over all
ranks. Part 2, a straggler: one member of rank 0's group calls D ms late; the table shows the time
per call seen by the other members of that group, ours against blocking MPI_Allreduce.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import numpy as np
from mpi4py import MPI

import provenance
from native_coll import WaitAvoidingAllreduce

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


def human(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def timed(fn, reps: int, warmup: int = 4) -> float:
    """Median over reps of the slowest rank's duration of fn(), in seconds (after warm-up calls
    that also fill the collective's buffer pool)."""
    per_call = []
    for i in range(warmup + reps):
        COMM.Barrier()
        t0 = time.perf_counter()
        fn()
        dt = COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if i >= warmup:
            per_call.append(dt)
    return statistics.median(per_call)


def gloo_group():
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    port = None
    if RANK == 0:
        with socket.socket() as s:  # a free loopback port for gloo's rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = COMM.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=RANK,
                            world_size=SIZE)
    return torch, dist


def on_time_table(sizes, group_size, gloo):
    group_comm = COMM.Split(RANK // group_size, RANK)
    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        reps = int(np.clip((64 << 20) // nbytes, 5, 40))
        buf = np.random.default_rng(RANK).random(n, dtype=np.float32)
        out = np.empty_like(buf)
        with WaitAvoidingAllreduce(COMM, buf, group_size=group_size, sync_period=None,
                                   timeout=600) as wa:
            ours = timed(wa.allreduce, reps)
        mpi_group = timed(lambda: group_comm.Allreduce(buf, out, op=MPI.SUM), reps)
        mpi_all = timed(lambda: COMM.Allreduce(buf, out, op=MPI.SUM), reps)
        row = [human(nbytes), ours, mpi_group, mpi_all]
        if gloo:
            torch, dist = gloo
            t = torch.from_numpy(buf.copy())
            row.append(timed(lambda: dist.all_reduce(t), reps))
        rows.append(row)
        if RANK == 0:
            print("  " + " | ".join(str(x) for x in row), flush=True)
    group_comm.Free()
    return rows


def straggler_table(nbytes, group_size, delays_ms, reps):
    n = nbytes // 4
    buf = np.ones(n, np.float32)
    out = np.empty_like(buf)
    group_comm = COMM.Split(RANK // group_size, RANK)
    rows = []
    with WaitAvoidingAllreduce(COMM, buf, group_size=group_size, sync_period=None,
                               timeout=600) as wa:
        for d_ms in delays_ms:
            ours, blocking = [], []
            for rep in range(reps + 1):
                # ours: the last member of rank 0's group at this iteration is late by D
                g = wa.group(wa.iteration)
                late = g[-1] if len(g) > 1 else -1
                COMM.Barrier()
                if RANK == late:
                    time.sleep(d_ms / 1e3)
                t0 = time.perf_counter()
                wa.allreduce(late="merge")
                dt = time.perf_counter() - t0
                seen = COMM.gather(dt if (RANK in g and RANK != late) else None, root=0)
                # blocking MPI_Allreduce over a fixed group containing rank 0, same delay
                late_b = group_size - 1 if group_size > 1 else -1
                COMM.Barrier()
                if RANK == late_b:
                    time.sleep(d_ms / 1e3)
                t0 = time.perf_counter()
                if RANK < group_size:
                    group_comm.Allreduce(buf, out, op=MPI.SUM)
                dtb = time.perf_counter() - t0
                seen_b = COMM.gather(dtb if (RANK < group_size and RANK != late_b) else None,
                                     root=0)
                if RANK == 0 and rep > 0:  # the first repetition warms up
                    ours.append(max(x for x in seen if x is not None))
                    blocking.append(max(x for x in seen_b if x is not None))
            if RANK == 0:
                rows.append([d_ms, statistics.median(ours), statistics.median(blocking)])
                print(f"  D={d_ms} ms: ours {rows[-1][1]*1e3:.2f} ms, "
                      f"MPI_Allreduce {rows[-1][2]*1e3:.2f} ms", flush=True)
    group_comm.Free()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--min-bytes", type=int, default=4 << 10)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--straggler-bytes", type=int, default=1 << 20)
    ap.add_argument("--delays-ms", type=int, nargs="+", default=[0, 10, 100, 1000])
    ap.add_argument("--straggler-reps", type=int, default=5)
    ap.add_argument("--no-gloo", action="store_true", help="skip torch.distributed (gloo)")
    ap.add_argument("--out", default=None, help="also write the tables (markdown) to this file, "
                    "and the raw figures with the run's facts beside it (.json)")
    args = ap.parse_args()
    facts = provenance.facts(config=dict(vars(args), ranks=SIZE)) if RANK == 0 else None
    S = min(args.group_size, SIZE)
    sizes, b = [], args.min_bytes
    while b <= args.max_bytes:
        sizes.append(b)
        b *= 4
    gloo = None if args.no_gloo else gloo_group()
    if RANK == 0:
        print(f"{SIZE} ranks, group size {S}; on time:", flush=True)
    rows = on_time_table(sizes, S, gloo)
    if RANK == 0:
        print("straggler:", flush=True)
    srows = straggler_table(args.straggler_bytes, S, args.delays_ms, args.straggler_reps)
    if RANK != 0:
        return
    cores = os.cpu_count()
    lines = [f"### {SIZE} ranks on {cores} cores, group size {S}", "",
             "Everyone on time (median time per call, slowest rank; ratio = ours / MPI_Allreduce "
             "over a same-size communicator):", "",
             "| buffer | ours (group) | MPI_Allreduce (group comm) | ratio | MPI_Allreduce (all) |"
             + (" gloo allreduce (all) |" if gloo else ""),
             "|---|---|---|---|---|" + ("---|" if gloo else "")]
    for r in rows:
        cells = [r[0], f"{r[1]*1e3:.3f} ms", f"{r[2]*1e3:.3f} ms", f"{r[1]/r[2]:.2f}x",
                 f"{r[3]*1e3:.3f} ms"] + ([f"{r[4]*1e3:.3f} ms"] if gloo else [])
        lines.append("| " + " | ".join(cells) + " |")
    base_ours, base_mpi = srows[0][1], srows[0][2]
    lines += ["", f"One member of the group {human(args.straggler_bytes)} late by D (median time "
              "per call seen by the other members):", "",
              "| D | ours | ours - ours(D=0) | MPI_Allreduce | MPI - MPI(D=0) |", "|---|---|---|---|---|"]
    for d, o, m in srows:
        lines.append(f"| {d} ms | {o*1e3:.2f} ms | {(o-base_ours)*1e3:+.2f} ms | {m*1e3:.2f} ms | "
                     f"{(m-base_mpi)*1e3:+.2f} ms |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
        names = ["buffer", "ours_s", "mpi_group_s", "mpi_all_s"] + (["gloo_s"] if gloo else [])
        provenance.write_raw(provenance.beside(args.out), facts, ranks=SIZE, group_size=S,
                             on_time=[dict(zip(names, r)) for r in rows],
                             straggler=[dict(delay_ms=d, ours_s=o, mpi_group_s=m)
                                        for d, o, m in srows])


if __name__ == "__main__":
    main()
