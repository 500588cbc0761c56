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
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import threading
import time

import numpy as np

import native_coll
from mpi4py import MPI

N = 4099  # not a multiple of the group sizes: uneven chunks


def fail(rank: int, why: str) -> None:
    print(f"FAILED rank {rank}: {why}", flush=True)
    MPI.COMM_WORLD.Abort(1)  # the other survivors may be waiting for this one in shrink()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--victim", type=int, required=True)
    ap.add_argument("--at", type=int, required=True)
    ap.add_argument("--when", choices=("before", "during", "between"), required=True)
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
    lost = wa.shrink(start_iteration=1)  # 1: a global iteration with sync period 2
    if lost != (args.victim,):
        fail(rank, f"shrink() lost {lost}, expected ({args.victim},)")
    new = wa.comm
    if new.Get_size() != size - 1 or new.Get_rank() != rank - (rank > args.victim):
        fail(rank, f"shrunk communicator: rank {new.Get_rank()} of {new.Get_size()}")
    # A global over the survivors: every buf holds its new rank + 1, the mean is (P' + 1) / 2.
    buf[:] = new.Get_rank() + 1.0
    wa.publish()
    info = wa.allreduce(late="merge")
    want = (new.Get_size() + 1) / 2.0
    if info.kind != "global" or not np.all(buf == np.float32(want)):
        fail(rank, f"global over the survivors: {info.kind}, buf[0] {buf[0]} != {want}")
    # A group iteration over the survivors' groups: each member's value its new rank squared.
    buf[:] = float(new.Get_rank() ** 2)
    wa.publish()
    new.Barrier()  # every contribution published before any member activates the group
    info = wa.allreduce(late="merge")
    if info.kind != "group":
        fail(rank, f"iteration 2 was {info.kind}, not a group iteration")
    mean = np.float32(sum(np.float32(r * r) for r in info.group)) / np.float32(len(info.group))
    if not np.all(buf == mean):  # a stale stand-in is the same published value
        fail(rank, f"group {info.group} (stale {info.stale}): buf[0] {buf[0]} != {mean}")
    wa.close()
    print(f"SURVIVOR rank {rank} -> {new.Get_rank()}: iteration {it} raised after {waited:.3f} s "
          f"naming {exc.ranks}; lost {lost}; group {info.group}", flush=True)


if __name__ == "__main__":
    main()
