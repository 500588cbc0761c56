"""wagma_rl: distributed RL (DD-PPO for PointNav) and a straggler-tolerant optimizer API (WAGMA)."""

# MPI is initialised when mpi4py.MPI is first imported; the collective's MPI settings must come
# first (native_coll.mpienv explains why).
from native_coll.mpienv import prepare_mpi_environment as _prepare_mpi_environment

_prepare_mpi_environment()
