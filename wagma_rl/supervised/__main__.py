"""``mpiexec -n 4 python -m wagma_rl.supervised --config configs/resnet_shapes.yaml [key=value ...]``"""
import sys
import traceback

from .train import main

if __name__ == "__main__":
    try:
        main()
    except Exception as exc:
        from mpi4py import MPI

        from ..config import ConfigError
        if isinstance(exc, (ConfigError, FileNotFoundError, ValueError, ImportError)):
            print(f"error (rank {MPI.COMM_WORLD.Get_rank()}): {exc}", file=sys.stderr, flush=True)
        else:
            traceback.print_exc()
        # A rank that stops alone would leave its peers blocked in their next collective (and
        # in MPI_Finalize); abort the whole job instead.
        if MPI.COMM_WORLD.Get_size() > 1:
            MPI.COMM_WORLD.Abort(2)
        sys.exit(2)
