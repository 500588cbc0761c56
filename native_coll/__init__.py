"""native_coll: a wait-avoiding, externally triggerable group allreduce over MPI.

The collective is written in C over MPI point-to-point with a progress thread
(``native_coll/src``); this package is its Python face::

    import native_coll
    with native_coll.WaitAvoidingAllreduce(comm, buf, group_size=4, sync_period=10) as wa:
        info = wa.allreduce()      # averages buf in place

See :class:`WaitAvoidingAllreduce` for the contract.
"""
from native_coll.mpienv import choose_netmod

choose_netmod()  # before mpi4py initialises MPI (native_coll.collective imports it)

from native_coll.collective import (  # noqa: E402
    CollectiveInfo,
    CollectiveTimeout,
    WaitAvoidingAllreduce,
    group_of,
)

__all__ = ["WaitAvoidingAllreduce", "CollectiveInfo", "CollectiveTimeout", "group_of"]
