"""Runs WAGMA's collective in a loop on every rank, for the fault tests across nodes
(tests/test_cluster_faults.py) and of large transfers (tests/test_mpienv.py). Not a test module:
started under mpiexec by those tests.

    collective_loop.py ITERATIONS TIMEOUT [FLOATS]

Every rank adds 1 to its model (FLOATS float32 values, default 1024) before each average
(late="apply", so the sum over ranks is conserved), prints ``ready <rank> <pid>`` once the
collective exists and, after ITERATIONS averages (a multiple of
4, so the last is global), ``done <rank> <value>``. A CollectiveTimeout ends the rank with its one-line
message and exit code 3 (without MPI_Finalize, which would wait for the lost peers).
"""
import os
import signal
import sys
import time

import numpy as np

import native_coll  # before mpi4py: MPI settings
from mpi4py import MPI

iterations, timeout = int(sys.argv[1]), float(sys.argv[2])
floats = int(sys.argv[3]) if len(sys.argv) > 3 else 1024


def say(line: str) -> None:
    # One write per line: print() writes the newline separately, and Hydra interleaves ranks.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# Under mpiexec -disable-auto-cleanup Hydra sends SIGUSR1 to every rank when one ends (a notice,
# ignored by the trainer there too): a survivor must go on to detect the loss itself and report it.
signal.signal(signal.SIGUSR1, signal.SIG_IGN)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
buf = np.full(floats, float(rank), np.float32)
try:
    wa = native_coll.WaitAvoidingAllreduce(comm, buf, group_size=2, sync_period=4, timeout=timeout)
    say(f"ready {rank} {os.getpid()}")
    for _ in range(iterations):
        buf += 1.0
        info = wa.allreduce(late="apply")
        time.sleep(0.01)
    assert info.kind == "global"
    wa.close()
    say(f"done {rank} {float(buf[0])!r} {float(buf.min())!r} {float(buf.max())!r}")
except native_coll.CollectiveTimeout as exc:
    say(f"rank {rank} on {MPI.Get_processor_name()}: {exc}")
    os._exit(3)
