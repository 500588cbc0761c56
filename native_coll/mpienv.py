"""MPI settings that must be in place before MPI is initialised (before ``mpi4py.MPI`` loads).

MPICH's UCX network module (the default of the PyPI ``mpich`` wheel, which carries both UCX and
libfabric) stalls point-to-point messages between hosts when the receiver polls with
``MPI_Test`` and sleeps in between, as this engine's progress thread does: a plain mpi4py
``Isend``/``Irecv``/``Test`` loop across two network namespaces lost messages within a few
hundred rounds, while blocking collectives (which spin inside MPI) passed. The libfabric (OFI)
module does not, so it is chosen unless the user chose a module (``MPIR_CVAR_CH4_NETMOD``).
Other MPI libraries ignore the variable. See docs/cluster.md.
"""
from __future__ import annotations

import os
import sys

__all__ = ["NETMOD_VAR", "DEFAULT_NETMOD", "choose_netmod", "with_netmod"]

NETMOD_VAR = "MPIR_CVAR_CH4_NETMOD"
DEFAULT_NETMOD = "ofi"


def with_netmod(env: dict[str, str]) -> dict[str, str]:
    """``env`` (changed in place and returned) with the OFI module chosen unless it names one:
    for the environment of ranks that a launcher starts (mpiexec, a benchmark, a test)."""
    env.setdefault(NETMOD_VAR, DEFAULT_NETMOD)
    return env


def choose_netmod() -> bool:
    """Select MPICH's OFI network module unless the user set one; True when it took effect.

    It takes effect only when MPI is not initialised yet (mpi4py's ``MPI`` module not imported).
    """
    if "mpi4py.MPI" in sys.modules:
        return False
    with_netmod(os.environ)
    return True
