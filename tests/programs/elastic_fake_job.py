"""A job that acts out the elastic protocol for the supervisor's tests (tests/test_elastic.py).

    elastic_fake_job.py lose         at 2 ranks: rank 1 hangs (a stopped rank), rank 0 records it
                                     lost without a saved state and exits 3; at 1 rank: finishes
    elastic_fake_job.py state_error  rank 0 records a loss whose state could not be saved, exits 3
    elastic_fake_job.py die          at 2 ranks: every rank ends at once with no record (as when
                                     Hydra ends a job); at 1 rank: finishes
"""
import os
import sys
import time

from mpi4py import MPI

from wagma_rl import elastic

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
mode = sys.argv[1]
if size == 1 and mode in ("lose", "die"):
    elastic.write_finished(frames=1, update=1)
    sys.exit(0)
if mode == "die":
    os._exit(9)
if rank == 1:
    time.sleep(600)  # never answers; the supervisor ends it
    os._exit(0)
peer = {"rank": 1, "host": "h", "pid": 1}
error = "cannot write 'ckpt': No space left on device" if mode == "state_error" else None
elastic.write_loss(writer=0, world_size=size, lost=[peer], checkpoint=None, update=None,
                   frames=None, why="rank 1 did not answer", state_error=error)
os._exit(3)
