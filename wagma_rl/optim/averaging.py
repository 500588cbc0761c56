"""Blocking MPI averaging primitives shared by the optimizers (mpi4py, one flat float32 buffer)."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

__all__ = ["agree", "broadcast", "global_average", "ring_neighbours", "ring_average"]


def agree(comm: MPI.Comm, problem: str | None, *, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` on every rank when any rank reports a ``problem`` (collective).

    A check that fails on one rank only must not leave the others waiting in the next collective,
    so every rank learns every rank's verdict and they all raise together.
    """
    problems = comm.allgather(problem)
    bad = [(r, p) for r, p in enumerate(problems) if p is not None]
    if bad:
        raise error("; ".join(f"rank {r}: {p}" for r, p in bad))


def broadcast(comm: MPI.Comm, array: np.ndarray, *, root: int = 0) -> None:
    """Overwrite ``array`` on every rank with ``root``'s contents."""
    comm.Bcast(array, root=root)


def global_average(comm: MPI.Comm, array: np.ndarray, *, identical: bool = False) -> None:
    """Replace ``array`` in place by its mean over all ranks of ``comm``.

    ``identical=True`` guarantees a bitwise identical result on every rank whatever the MPI
    library's reduction order (reduce to rank 0, divide there, broadcast); otherwise one
    ``Allreduce`` is used, which MPICH also makes identical in practice.
    """
    size = comm.Get_size()
    if size == 1:
        return
    if identical:
        if comm.Get_rank() == 0:
            comm.Reduce(MPI.IN_PLACE, array, op=MPI.SUM, root=0)
            np.divide(array, np.float32(size), out=array)
        else:
            comm.Reduce(array, None, op=MPI.SUM, root=0)
        comm.Bcast(array, root=0)
    else:
        comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)
        np.divide(array, np.float32(size), out=array)


def ring_neighbours(rank: int, size: int) -> list[int]:
    """The distinct ring neighbours of ``rank`` (left, then right), without ``rank`` itself."""
    out = []
    for peer in ((rank - 1) % size, (rank + 1) % size):
        if peer != rank and peer not in out:
            out.append(peer)
    return out


def ring_average(comm: MPI.Comm, array: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """Replace ``array`` by the mean of itself and its ring neighbours' arrays (D-PSGD gossip).

    ``scratch`` (optional) is reused for the received copies: shape ``(2, len(array))`` float32.
    Returns the scratch buffer so the caller can keep it.
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    peers = ring_neighbours(rank, size)
    if not peers:
        return scratch
    if scratch is None or scratch.shape != (2, array.size):
        scratch = np.empty((2, array.size), dtype=np.float32)
    reqs = []
    for i, peer in enumerate(peers):
        reqs.append(comm.Irecv(scratch[i], source=peer, tag=17))
    for peer in peers:
        reqs.append(comm.Isend(array, dest=peer, tag=17))
    MPI.Request.Waitall(reqs)
    # Summing in rank order (not "self first") makes two ranks that average the same set of
    # models, as at 2 ranks, end with bitwise identical results.
    members = sorted([rank] + peers)
    parts = {rank: array.copy()}
    for i, peer in enumerate(peers):
        parts[peer] = scratch[i]
    total = parts[members[0]].copy()
    for m in members[1:]:
        total += parts[m]
    np.divide(total, np.float32(len(members)), out=array)
    return scratch
