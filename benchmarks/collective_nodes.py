"""The collective across namespaced nodes: node-aware schedule, direct schedule and MPI_Allreduce.

One table for every cluster shape and link rate, each row measured in one run (the three methods
alternate call by call, so a disturbance of the shared machine hits all three alike)::

    python benchmarks/collective_nodes.py --out benchmarks/results/collective_nodes   # as root

For each (nodes x 2 ranks, rate) it brings up the namespaced cluster (cluster.netns) and runs itself
under mpiexec there (``--worker``): an average over every rank (group size = all ranks), buffers of
1 to 64 MiB, each rank's time per call (slowest rank, median over repetitions) for our collective
with the node-aware schedule, our collective with it turned off (``WA_HIERARCHY=off``: the direct
schedule) and ``MPI_Allreduce`` over the same ranks (MPICH's own, node-aware, algorithm).
Also writes ``<out>.json`` with every repetition, which ``wagma_rl.scale``'s network model is
checked against (docs/scale.md).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def worker(args) -> None:
    import numpy as np
    from mpi4py import MPI

    from native_coll import WaitAvoidingAllreduce

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rows = []
    for nbytes in args.sizes:
        n = nbytes // 4
        buf = np.random.default_rng(rank).random(n, dtype=np.float32)
        out = np.empty_like(buf)
        engines = {}
        for name, mode in (("node-aware", "auto"), ("direct", "off")):
            os.environ["WA_HIERARCHY"] = mode  # read when the engine is made
            engines[name] = WaitAvoidingAllreduce(comm, buf, group_size=size, sync_period=None,
                                                  timeout=600)
        calls = {name: (lambda wa=wa: wa.allreduce(late="merge")) for name, wa in engines.items()}
        calls["MPI_Allreduce"] = lambda: comm.Allreduce(buf, out, op=MPI.SUM)
        reps = max(args.min_reps, min(40, int(args.budget_mb * 2**20 / nbytes)))
        times = {k: [] for k in calls}
        nodes_seen = {}
        for rep in range(reps + 2):  # two warm-up rounds fill the buffer pools
            for name, fn in calls.items():
                comm.Barrier()
                t0 = time.perf_counter()
                info = fn()
                dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                if rep >= 2:
                    times[name].append(dt)
                if name in engines:
                    nodes_seen[name] = info.nodes
        for wa in engines.values():
            wa.close()
        rows.append({"bytes": nbytes, "times": times, "nodes": nodes_seen})
        if rank == 0:
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"  {nbytes >> 20} MiB: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in
                                                       med.items()) + f" (nodes {nodes_seen})",
                  flush=True)
    if rank == 0:
        Path(args.worker_out).write_text(json.dumps(rows))


def run_shape(nodes: int, rate: str | None, args) -> list[dict]:
    out = Path(args.out + f".part_{nodes}_{rate or 'unshaped'}.json")
    cmd = [sys.executable, "-m", "cluster.netns", "--name", "wabench", "run", "--nodes", str(nodes),
           "--ppn", str(args.ppn)]
    if rate:
        cmd += ["--rate", rate]
    cmd += ["--", str(Path(__file__).resolve()), "--worker", "--worker-out", str(out.resolve()),
            "--budget-mb", str(args.budget_mb), "--min-reps", str(args.min_reps), "--sizes",
            *map(str, args.sizes)]
    print(f"== {nodes} nodes x {args.ppn} ranks, {rate or 'unshaped'}", flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, timeout=3600)
    rows = json.loads(out.read_text())
    out.unlink()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--ppn", type=int, default=2)
    ap.add_argument("--rates", nargs="+", default=["unshaped", "10gbit", "1gbit"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 4 << 20, 16 << 20, 64 << 20])
    ap.add_argument("--budget-mb", type=float, default=512,
                    help="repetitions per size: this many MiB moved per method (5 to 40 reps)")
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/collective_nodes")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import provenance
    facts = provenance.facts(config=vars(args))
    t0 = time.time()
    load = os.getloadavg()[0]
    results = []
    for nodes in args.nodes:
        for rate in args.rates:
            rows = run_shape(nodes, None if rate == "unshaped" else rate, args)
            results.append({"nodes": nodes, "ppn": args.ppn, "rate": rate, "rows": rows})
    lines = [f"{len(args.nodes)} cluster shapes x {len(args.rates)} link rates, an average over "
             f"every rank, median time per call of the slowest rank; load {load:.1f} at the start, "
             f"{time.time() - t0:.0f} s in all.", "",
             "| nodes x ranks | link | buffer | node-aware | direct | MPI_Allreduce | "
             "node-aware / MPI | direct / MPI | node-aware / direct |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for res in results:
        for row in res["rows"]:
            med = {k: statistics.median(v) for k, v in row["times"].items()}
            h, d, m = med["node-aware"], med["direct"], med["MPI_Allreduce"]
            lines.append(f"| {res['nodes']} x {res['ppn']} | {res['rate']} | "
                         f"{row['bytes'] >> 20} MiB | {h * 1e3:.1f} ms | {d * 1e3:.1f} ms | "
                         f"{m * 1e3:.1f} ms | {h / m:.2f}x | {d / m:.2f}x | {h / d:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".md").write_text(text)
    provenance.write_raw(args.out + ".json", facts, runs=results)


if __name__ == "__main__":
    main()
