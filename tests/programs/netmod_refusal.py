"""Constructs the collective with mpi4py imported first (so native_coll cannot choose the network
module) and prints what happened on each rank (tests/test_cluster.py)."""
import sys

import numpy as np
from mpi4py import MPI  # first: MPI starts with whatever MPIR_CVAR_CH4_NETMOD says

import native_coll

rank = MPI.COMM_WORLD.Get_rank()
try:
    with native_coll.WaitAvoidingAllreduce(MPI.COMM_WORLD, np.zeros(4, np.float32), group_size=2,
                                           sync_period=2, timeout=20) as wa:
        wa.allreduce(late="merge")
    sys.stdout.write(f"rank {rank}: constructed\n")
except RuntimeError as exc:
    sys.stdout.write(f"rank {rank}: refused: {exc}\n")
sys.stdout.flush()
