"""The node sum (``wagma_rl.optim.node_sum``, AllreduceSGD's ``exchange="node"``) against MPI's
allreduce, per buffer size, on the ranks of one node.

Run under mpiexec::

    mpiexec -n 4 python benchmarks/node_sum.py --device cpu --json benchmarks/results/node_sum_cpu.json
    mpiexec -n 4 python benchmarks/node_sum.py --device cuda --json node_sum_cuda.json   # ranks share GPU 0

Each call sums one float32 buffer per rank: ``node``, the rank's values copied into its mapped
buffer (cpu: an MPI shared window; cuda: device memory shared through CUDA IPC) and the node sum;
``mpi``, the mpi path of AllreduceSGD: the values copied into a host buffer (pinned, from the
device on cuda), ``MPI_Allreduce`` in place, and on cuda copied back to the device. Both include
that copy-in, as a training step pays it either way. Time per call: the slowest rank's, after a
barrier, the device synchronised at the end (the benchmark's clock only); medians over
``--reps`` after two warm-up calls.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from mpi4py import MPI

import provenance
from wagma_rl.bounded_comm import BoundedComm
from wagma_rl.optim.node_sum import NodeSum


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--mib", type=float, nargs="+", default=[1, 4, 16, 64, 94],
                    help="buffer sizes, MiB per rank (94: ResNet-50's gradients)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="", help="also write the rows here (rank 0)")
    return ap.parse_args(argv)


def timed(comm: MPI.Comm, fn, device: torch.device, reps: int) -> float:
    """Median over ``reps`` (after 2 warm-ups) of the slowest rank's seconds for ``fn()``."""
    times = []
    for i in range(reps + 2):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        took = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if i >= 2:
            times.append(took)
    return statistics.median(times)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    record = provenance.facts(args.device, config=vars(args)) if comm.rank == 0 else None
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device here; use --device cpu")
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    bounded = BoundedComm(comm, timeout=120)
    rows = []
    for mib in args.mib:
        numel = int(mib * 2**20) // 4
        values = torch.randn(numel, generator=torch.Generator().manual_seed(comm.rank)).to(device)
        node = NodeSum(bounded, bounded.comm, numel, device)

        def node_call():
            node.mine.copy_(values)
            node.sum_()

        host = torch.empty(numel, dtype=torch.float32, pin_memory=device.type == "cuda")
        back = torch.empty_like(values)

        def mpi_call():
            host.copy_(values)  # (from the device: synchronous, as the host reads it next)
            comm.Allreduce(MPI.IN_PLACE, host.numpy())
            if device.type == "cuda":
                back.copy_(host, non_blocking=True)

        t_node = timed(comm, node_call, device, args.reps)
        t_mpi = timed(comm, mpi_call, device, args.reps)
        node.close()
        rows.append({"mib": mib, "node_ms": 1e3 * t_node, "mpi_ms": 1e3 * t_mpi,
                     "ratio": t_node / t_mpi})
        if comm.rank == 0:
            print(f"{mib:g} MiB: node {1e3 * t_node:.2f} ms, mpi {1e3 * t_mpi:.2f} ms", flush=True)
    bounded.free()
    if comm.rank == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        lines = [f"\n{comm.size} ranks on {name}, time per sum (slowest rank, median of {args.reps})\n",
                 "| buffer per rank | node sum | MPI allreduce" + (" of a host copy" if device.type == "cuda" else "")
                 + " | node / mpi |", "|---:|---:|---:|---:|"]
        lines += [f"| {r['mib']:g} MiB | {r['node_ms']:.2f} ms | {r['mpi_ms']:.2f} ms | {r['ratio']:.2f}x |"
                  for r in rows]
        print("\n".join(lines), flush=True)
        if args.json:
            provenance.write_raw(args.json, record, device=name, ranks=comm.size, rows=rows)
    return rows


if __name__ == "__main__":
    main()
