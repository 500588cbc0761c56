"""native_coll: a wait-avoiding, externally triggerable group allreduce over MPI.

The collective is written in C over MPI point-to-point with a progress thread
(``native_coll/src``); this package is its Python face::

    import native_coll
    with native_coll.WaitAvoidingAllreduce(comm, buf, group_size=4, sync_period=10) as wa:
        info = wa.allreduce()      # averages buf in place

See :class:`WaitAvoidingAllreduce` for the contract.
"""
from native_coll.errors import CollectiveTimeout, NonFiniteResult
from native_coll.mpienv import prepare_mpi_environment

prepare_mpi_environment()  # before mpi4py initialises MPI (native_coll.collective imports it)

__all__ = ["WaitAvoidingAllreduce", "CollectiveInfo", "CollectiveTimeout", "NonFiniteResult", "group_of",
           "wire_round"]

_ENGINE_NAMES = ("WaitAvoidingAllreduce", "CollectiveInfo", "group_of", "wire_round")


def __getattr__(name: str):
    # The compiled engine loads on first use, so importing the package for its MPI settings
    # (wagma_rl does, before mpi4py) works where the engine is not built (a tools-only venv).
    if name in _ENGINE_NAMES:
        from native_coll import collective
        return getattr(collective, name)
    raise AttributeError(f"module 'native_coll' has no attribute {name!r}")
