"""wagma_rl: distributed RL (DD-PPO for PointNav) and a straggler-tolerant optimizer API (WAGMA)."""

# MPI is initialised when mpi4py.MPI is first imported; the collective's network settings must
# come first (native_coll.mpienv explains why).
from native_coll.mpienv import choose_netmod as _choose_netmod

_choose_netmod()
