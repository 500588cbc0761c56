"""Calibrate the simulator's alpha-beta network model on the machine(s) this runs on.

    mpiexec -n 2 python benchmarks/netcal.py                       # ping-pong: alpha, beta
    mpiexec -n 4 python benchmarks/netcal.py --allreduce 169981     # + MPI allreduce of a model
    MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp mpiexec -n 2 python benchmarks/netcal.py
        # the same over TCP instead of shared memory (loopback on one host; across the namespaced
        # nodes of cluster/ when the ranks are placed on two nodes)

Ranks 0 and 1 ping-pong messages of 8 B to 16 MiB (median of the repetitions); alpha is half the
round trip of the smallest message and beta the least-squares slope of the one-way time over the
large ones (>= 64 KiB). With more ranks, ``--allreduce N`` also times ``Allreduce`` of N float32
and a barrier, to check the model's allreduce formula. Rank 0 prints a table and one JSON line
(``{"alpha_s": ..., "beta_s_per_byte": ...}``) to paste into ``wagma_rl/scale/network.py``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import provenance

__all__ = ["pingpong", "main"]


def pingpong(comm: MPI.Comm, nbytes: int, reps: int) -> float:
    """Median one-way time (s) of an ``nbytes`` message between ranks 0 and 1."""
    buf = np.zeros(max(nbytes, 1), dtype=np.uint8)
    rank = comm.Get_rank()
    times = []
    for _ in range(reps + 2):
        comm.Barrier()
        t0 = time.perf_counter()
        if rank == 0:
            comm.Send([buf, nbytes, MPI.BYTE], dest=1, tag=5)
            comm.Recv([buf, nbytes, MPI.BYTE], source=1, tag=5)
        elif rank == 1:
            comm.Recv([buf, nbytes, MPI.BYTE], source=0, tag=5)
            comm.Send([buf, nbytes, MPI.BYTE], dest=0, tag=5)
        times.append((time.perf_counter() - t0) / 2)
    return statistics.median(times[2:])


def _timed(comm: MPI.Comm, fn, reps: int) -> float:
    times = []
    for _ in range(reps + 2):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return statistics.median(times[2:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=30, help="repetitions per size (median kept)")
    p.add_argument("--allreduce", type=int, default=0, help="also time Allreduce of N float32")
    p.add_argument("--out", default=None, help="raw JSON file (the run's facts, every size, the fit)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    facts = provenance.facts(config=vars(args)) if comm.Get_rank() == 0 else None
    if comm.Get_size() < 2:
        print("netcal: run under mpiexec with at least 2 ranks (mpiexec -n 2 python "
              "benchmarks/netcal.py)", file=sys.stderr)
        return 2
    sizes = [8] + [2 ** k for k in range(10, 25, 2)]
    one_way = [pingpong(comm, n, args.reps) for n in sizes]
    big = [(n, t) for n, t in zip(sizes, one_way) if n >= 65536]
    slope, _ = np.polyfit([n for n, _ in big], [t for _, t in big], 1)
    out = {"alpha_s": one_way[0], "beta_s_per_byte": float(slope), "ranks": comm.Get_size()}
    if args.allreduce:
        arr = np.ones(args.allreduce, dtype=np.float32)
        out["allreduce_s"] = _timed(comm, lambda: comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM),
                                    args.reps)
        out["allreduce_floats"] = args.allreduce
        out["barrier_s"] = _timed(comm, comm.Barrier, args.reps)
    if comm.Get_rank() == 0:
        print("| bytes | one-way s | MB/s |\n|---|---|---|")
        for n, t in zip(sizes, one_way):
            print(f"| {n} | {t:.3g} | {n / t / 1e6:.0f} |")
        print(json.dumps(out))
        if args.out:
            provenance.write_raw(args.out, facts, fit=out,
                                 one_way=[dict(bytes=n, s=t) for n, t in zip(sizes, one_way)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
