"""run_ddppo.py with one rank made faulty; launched by tests/test_faults_mpi.py under mpiexec.

    mpiexec -n N python tests/mpi/fault_run.py FAULT RANK AFTER -- [run_ddppo.py arguments]

FAULT ``stuck_env``: rank RANK's ``env.step`` blocks for an hour at its AFTER-th call, as a
simulator that hangs would. ``nan``: rank RANK's policy parameters turn NaN after its AFTER-th
environment step (one corrupted replica). ``none``: no fault (the plain run).
"""
import sys
import time

import torch
from mpi4py import MPI

fault, who, after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
argv = sys.argv[sys.argv.index("--") + 1:]
rank = MPI.COMM_WORLD.Get_rank()

if rank == who and fault in ("stuck_env", "nan"):
    import envs

    make = envs.make_vector_env

    def faulty_make(*args, **kwargs):
        venv = make(*args, **kwargs)
        step, calls = venv.step, [0]

        def faulty_step(actions):
            calls[0] += 1
            if calls[0] == after:
                if fault == "stuck_env":
                    time.sleep(3600)
                else:
                    import gc
                    for obj in gc.get_objects():  # the policy: the module that owns "act"
                        if isinstance(obj, torch.nn.Module) and hasattr(obj, "act"):
                            with torch.no_grad():
                                next(obj.parameters()).fill_(float("nan"))
            return step(actions)

        venv.step = faulty_step
        return venv

    envs.make_vector_env = faulty_make

import run_ddppo  # noqa: E402  (after the patch)

sys.exit(run_ddppo.main(argv))
