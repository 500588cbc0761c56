"""What the finiteness guards cost next to the averages they guard (not a test).

On a ResNet-50-sized flat buffer (25.6M float32), every rank times:

- the other optimizers' guard, one pass over the buffer (``wagma_rl.optim.finite.is_finite``),
  next to the averages it guards: the synchronous global average with the check folded in
  (``averaging.global_average``, LocalSGD and ``synchronize``) and D-PSGD's ring average with its
  tiny agreement allreduce; and the tiny bounded agreement (``BoundedComm.allreduce`` of one value
  per rank) that WAGMA runs before each blocking global average;
- WAGMA's guard, fused into the native collective's reduction (wa.h): the native group average,
  blocking global average and overlapped global average (the global call, then ``settle``) with
  the guard on and with it switched off (``set_nonfinite_guard``, for this measurement only),
  in pairs of calls in alternating order (``3 * repeat`` pairs; for the group average pairs of
  blocks of a whole period of the group schedule, whose phases differ in cost across nodes); its
  cost is the median paired difference over the median average. The last column is what the pass
  WAGMA ran before every average until the guard was fused cost next to the same average.

Prints markdown tables (rank 0) of medians, the slowest rank's.

    mpiexec -n 4 python benchmarks/faults_finite.py [--numel 25600000] [--repeat 7] [--out FILE]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import provenance
from wagma_rl.bounded_comm import BoundedComm
from wagma_rl.optim.averaging import global_average, ring_average
from wagma_rl.optim.finite import is_finite


def slowest(times: list[float], comm: MPI.Comm) -> float:
    """The slowest rank's median, in ms: what the job sees."""
    return comm.allreduce(statistics.median(times), op=MPI.MAX) * 1e3


def median_ms(fn, repeat: int, comm: MPI.Comm) -> float:
    fn()
    times = []
    for _ in range(repeat):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return slowest(times, comm)


def schedule_period(size: int, group_size: int, limit: int = 64) -> int:
    """The number of calls after which WAGMA's group schedule repeats (the same groups on every
    rank): 2 for 4 ranks in groups of 2. Across nodes one phase's groups stay inside the nodes and
    the next cross the link, so a guard-on call and a guard-off call are only comparable as
    blocks of whole periods."""
    from native_coll.collective import group_of

    def groups(t):
        return [tuple(group_of(size, group_size, t, r)) for r in range(size)]

    return next((k for k in range(1, limit) if groups(k) == groups(0)), 1)


def guarded_ms(wa, fn, repeat: int, comm: MPI.Comm, block: int = 1) -> tuple[float, float, float]:
    """``fn()`` with ``wa``'s non-finite guard on and off, in pairs of blocks of ``block``
    consecutive calls (whole periods of the group schedule: :func:`schedule_period`) that
    alternate which goes first, so that both see the same load and the same groups (every rank
    switches at the same point). Returns the median ms per call with the guard off and on, and
    the guard's cost: the median over the pairs of on - off (the ranks' mean) over the median
    off. Paired, the load that drifts from one pair to the next cancels out of the cost, though
    not out of the two medians."""
    engine = wa._live_engine()
    times = {True: [], False: []}
    for i in range(repeat + 1):
        for guard in (True, False) if i % 2 else (False, True):
            engine.set_nonfinite_guard(guard)
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(block):
                fn()
            if i:  # the first pair warms up
                times[guard].append((time.perf_counter() - t0) / block)
    engine.set_nonfinite_guard(True)
    extra = statistics.median(on - off for on, off in zip(times[True], times[False]))
    extra = comm.allreduce(extra) / comm.Get_size() * 1e3
    off = slowest(times[False], comm)
    return off, slowest(times[True], comm), extra / off


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--numel", type=int, default=25_600_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--out", default="", help="the table (markdown); the raw figures go beside it (.json)")
    args = p.parse_args()
    import torch
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    facts = provenance.facts(config=dict(vars(args), ranks=size)) if rank == 0 else None
    deadline = BoundedComm(comm, timeout=600)
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
    fused = []
    try:
        import native_coll
    except ImportError:
        native_coll = None
    if native_coll is not None:
        t = torch.from_numpy(buf[:n])
        group = min(2, size)
        cycle = schedule_period(size, group)  # calls per block of the group average
        for name, period, mode in (("group average", 1_000_000, "blocking"),
                                   ("global average, blocking", 1, "blocking"),
                                   ("global average, overlapped (call + settle)", 1, "overlap")):
            wa = native_coll.WaitAvoidingAllreduce(comm, t, group_size=group,
                                                   sync_period=period, global_mode=mode)
            fn = (lambda wa=wa: wa.allreduce(late="merge")) if mode == "blocking" else \
                (lambda wa=wa: (wa.allreduce(late="merge"), wa.settle()))
            block = cycle if mode == "blocking" and period > 1 else 1
            off, on, cost = guarded_ms(wa, fn, 3 * args.repeat, comm, block=block)
            # Before: the pass (and, before a blocking global, the agreement: it stays) per average.
            before = check + (agree if name == "global average, blocking" else 0.0)
            fused.append((f"WAGMA {name}", off, on, cost, before / off))
            wa.close()
    if rank == 0:
        lines = [f"{size} ranks, {n / 1e6:.1f}M float32 ({n * 4 / 2**20:.0f} MiB), median of {args.repeat}, "
                 "slowest rank", "",
                 "| operation | ms | check cost / average |", "|---|---:|---:|"]
        for name, ms, ratio in rows:
            lines.append(f"| {name} | {ms:.2f} | {'-' if ratio is None else f'{100 * ratio:.1f}%'} |")
        if fused:
            lines += ["", f"WAGMA, the guard fused into the native reduction: {3 * args.repeat} pairs of "
                      "calls, guard on and off (the group average: of blocks of one period of its "
                      f"schedule, {cycle} calls)", "",
                      "| operation | ms, guard off | ms, guard on | guard cost (paired) "
                      "| before: pass / average |", "|---|---:|---:|---:|---:|"]
            for name, off, on, cost, before in fused:
                lines.append(f"| {name} | {off:.2f} | {on:.2f} | {100 * cost:+.1f}% | {100 * before:.1f}% |")
        text = "\n".join(lines)
        print(text, flush=True)
        if args.out:
            with open(args.out, "w") as fh:
                fh.write(text + "\n")
            provenance.write_raw(
                provenance.beside(args.out), facts, ranks=size, numel=n,
                rows=[dict(operation=name, ms=ms, check_share=ratio) for name, ms, ratio in rows],
                fused=[dict(operation=name, guard_off_ms=off, guard_on_ms=on, guard_cost=cost,
                            before_share=before) for name, off, on, cost, before in fused])
    deadline.free()


if __name__ == "__main__":
    main()
