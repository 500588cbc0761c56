"""Builds an env worker pool on every rank of an mpiexec job from a script that imports mpi4py
at the top (what a worker must not inherit) and prints, per rank, the launcher variables its
workers see and a lock-step result (tests/test_envs_pool.py)."""
import json
import os
import sys

from mpi4py import MPI  # first, as a user's training script may

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from test_envs_pool import probes  # noqa: E402

from envs import ProcessVectorEnv  # noqa: E402

rank = MPI.COMM_WORLD.Get_rank()
with ProcessVectorEnv(probes(2), timeout=60, start_timeout=120) as pool:
    pool.reset(seed=rank)
    seen = sorted(k for k in pool.get_attr("environ")[0]
                  if k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "MPI_")))
    x = pool.step(np.array([1, 2]))[0]["x"].tolist()
mine = sorted(k for k in os.environ if k.startswith(("PMI_", "HYDRA_")))
# One write per line: print() writes the text and its newline apart (PYTHONUNBUFFERED), and the
# launcher once joined the two ranks' lines between them.
sys.stdout.write(json.dumps({"rank": rank, "workers_see": seen, "rank_has": bool(mine), "x": x})
                 + "\n")
sys.stdout.flush()
MPI.COMM_WORLD.Barrier()
