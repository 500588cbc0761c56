"""MPI averaging primitives shared by the optimizers (one flat float32 buffer), every wait bounded.

Each takes a :class:`wagma_rl.bounded_comm.BoundedComm`: a peer that does not answer within its timeout
raises ``PeerTimeout`` naming it (rank, host, pid) instead of hanging the job. The averages fold
a per-rank status slot into the data (see :mod:`.finite`), so all ranks agree whether a
contribution was non-finite without a second round trip.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from wagma_rl.bounded_comm import BoundedComm

from .finite import NonFiniteError, is_finite
from .precision import decode16, encode16, nonfinite16

__all__ = ["agree", "broadcast", "global_average", "ring_neighbours", "ring_average", "status_slots"]


def agree(comm: BoundedComm | MPI.Comm, problem: str | None, *, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` on every rank when any rank reports a ``problem`` (collective).

    A check that fails on one rank only must not leave the others waiting in the next collective,
    so every rank learns every rank's verdict and they all raise together. With a ``BoundedComm`` the
    exchange is bounded; a plain communicator is for start-up checks before one exists.
    """
    if isinstance(comm, BoundedComm):
        problems = comm.allgather_obj(problem, what="a start-up check")
    else:
        problems = comm.allgather(problem)
    bad = [(r, p) for r, p in enumerate(problems) if p is not None]
    if bad:
        raise error("; ".join(f"rank {r}: {p}" for r, p in bad))


def broadcast(deadline: BoundedComm, array: np.ndarray, *, root: int = 0) -> None:
    """Overwrite ``array`` on every rank with ``root``'s contents (bounded)."""
    deadline.bcast(array, root=root, what="parameter broadcast")


def status_slots(size: int) -> int:
    """Extra float32 slots an averaged buffer carries for the status of ``size`` ranks."""
    return size


def global_average(deadline: BoundedComm, array: np.ndarray, *, numel: int, step: int,
                   nonfinite: str = "raise", identical: bool = False, precision: str = "fp32",
                   base: np.ndarray | None = None) -> tuple[int, ...]:
    """Replace ``array[:numel]`` in place by its mean over all ranks; return the dropped ranks.

    ``array`` is ``[data (numel) | one status slot per rank]``. A rank whose data is not finite
    contributes zeros and marks its slot, so the sum stays finite; the mean is then over the
    finite contributions only, and with ``nonfinite="raise"`` every rank raises the same
    :class:`NonFiniteError` afterwards (``"drop"``: training goes on without them).

    ``identical=True`` guarantees a bitwise identical result on every rank whatever the MPI
    library's reduction order (reduce to rank 0, divide there, broadcast); otherwise one
    allreduce is used, which MPICH also makes identical in practice.

    ``precision="bf16"`` or ``"fp16"`` sends 16-bit pseudo-gradients against ``base`` (the last
    global model, ``numel`` float32 values identical on every rank) instead: see
    :func:`_global_average_16`. A contribution whose delta is not finite in 16 bits (an fp16
    overflow too) is then the non-finite one.
    """
    if precision != "fp32":
        return _global_average_16(deadline, array, numel=numel, step=step, nonfinite=nonfinite,
                                  precision=precision, base=base)
    size, rank = deadline.size, deadline.rank
    data, status = array[:numel], array[numel:numel + size]
    status[:] = 0.0
    if not is_finite(data):
        data[:] = 0.0
        status[rank] = 1.0
    if size > 1:
        if identical:
            deadline.reduce_to(array[:numel + size], root=0, what="global model average")
            if rank == 0:
                _divide(data, status, size)
            deadline.bcast(array[:numel + size], root=0, what="global model average")
        else:
            deadline.allreduce(array[:numel + size], what="global model average")
            _divide(data, status, size)
    return _verdict(status, step=step, nonfinite=nonfinite, what="model")


def _chunk(n: int, size: int, k: int) -> tuple[int, int]:
    """(offset, length) of chunk ``k`` of ``n`` values cut ``size`` ways, the first ``n % size``
    one longer (the native collective's ``wai_chunk_of``)."""
    base, rem = divmod(n, size)
    return k * base + min(k, rem), base + (1 if k < rem else 0)


def _global_average_16(deadline: BoundedComm, array: np.ndarray, *, numel: int, step: int,
                       nonfinite: str, precision: str, base: np.ndarray | None) -> tuple[int, ...]:
    """The global average on the 16-bit wire: a reduce-scatter and an allgather of uint16 over the
    bounded point-to-point exchange, the arithmetic of the native collective's 16-bit global
    (wa.h, ``wa_set_global_precision``). Rank r owns chunk r. Every rank sends
    ``[its status, round16(x - B) of chunk j]`` to the owner of chunk j; the owner decodes the
    finite contributions, sums them in rank order, divides by their number and rounds that mean
    to 16 bits once; the means go to every rank, and every rank sets ``x = B + decode(mean)`` in
    float32: bitwise identical everywhere. The status words travel with the data (every rank
    hears every other rank's in the first round), so the verdict needs no round trip of its own.
    """
    size, rank = deadline.size, deadline.rank
    if base is None or base.shape[0] < numel:
        raise ValueError(f"global_precision={precision!r} needs the last global model as base "
                         f"({numel} float32 values)")
    data, status = array[:numel], array[numel:numel + size]
    b = base[:numel]
    delta = encode16(data - b, precision)
    flag = 0
    if nonfinite16(delta, precision):  # NaN or inf in the model, or a delta beyond 16 bits' range
        delta[:] = 0
        flag = 1
    off, length = _chunk(numel, size, rank)
    pieces = np.empty((size, length + 1), dtype=np.uint16)  # row r: [r's status, r's piece]
    pieces[rank, 0], pieces[rank, 1:] = flag, delta[off:off + length]
    sends, recvs = [], []
    for peer in range(size):
        if peer == rank:
            continue
        o, n = _chunk(numel, size, peer)
        msg = np.empty(n + 1, dtype=np.uint16)
        msg[0], msg[1:] = flag, delta[o:o + n]
        sends.append((msg, peer))
        recvs.append((pieces[peer], peer))
    deadline.exchange(sends, recvs, what="global model average (16-bit reduce-scatter)")
    flags = pieces[:, 0].copy()
    healthy = [r for r in range(size) if flags[r] == 0]
    means = np.zeros(numel, dtype=np.uint16)
    if healthy and length:
        total = decode16(pieces[healthy[0], 1:], precision)
        for r in healthy[1:]:
            total += decode16(pieces[r, 1:], precision)
        means[off:off + length] = encode16(total / np.float32(len(healthy)), precision)
    sends, recvs = [], []
    for peer in range(size):
        o, n = _chunk(numel, size, peer)
        if peer != rank and length:
            sends.append((means[off:off + length], peer))
        if peer != rank and n:
            recvs.append((means[o:o + n], peer))
    deadline.exchange(sends, recvs, what="global model average (16-bit allgather)")
    np.add(b, decode16(means, precision), out=data)
    status[:] = flags
    return _verdict(status, step=step, nonfinite=nonfinite, what="model")


def _divide(data: np.ndarray, status: np.ndarray, size: int) -> None:
    healthy = size - int(np.count_nonzero(status > 0.5))
    if healthy > 0:
        np.divide(data, np.float32(healthy), out=data)


def _verdict(status: np.ndarray, *, step: int, nonfinite: str, what: str) -> tuple[int, ...]:
    bad = tuple(int(r) for r in np.flatnonzero(status > 0.5))
    n = status.size
    status[:] = 0.0  # the slots may be averaged along with the data later (WAGMA): keep them 0
    if bad and (nonfinite == "raise" or len(bad) == n):
        raise NonFiniteError(bad, step, what)
    return bad


def ring_neighbours(rank: int, size: int) -> list[int]:
    """The distinct ring neighbours of ``rank`` (left, then right), without ``rank`` itself."""
    out = []
    for peer in ((rank - 1) % size, (rank + 1) % size):
        if peer != rank and peer not in out:
            out.append(peer)
    return out


def ring_average(deadline: BoundedComm, array: np.ndarray, scratch: np.ndarray | None = None, *, step: int,
                 nonfinite: str = "raise") -> tuple[np.ndarray, tuple[int, ...]]:
    """Replace ``array`` by the mean of itself and its ring neighbours' arrays (D-PSGD gossip).

    Every rank first learns every rank's finiteness in one tiny bounded allreduce (gossip is not
    a reduction to fold it into), so all raise the same :class:`NonFiniteError` before any data
    moves; with ``nonfinite="drop"`` non-finite models are left out of their neighbours' means.
    ``scratch`` (optional) is reused for the received copies: shape ``(2, len(array))`` float32.
    Returns (the scratch buffer, the dropped ranks).
    """
    size, rank = deadline.size, deadline.rank
    status = np.zeros(size, dtype=np.float32)
    status[rank] = 0.0 if is_finite(array) else 1.0
    if size > 1:
        deadline.allreduce(status, what="finiteness check")
    dropped = _verdict(status, step=step, nonfinite=nonfinite, what="model")
    peers = ring_neighbours(rank, size)
    if not peers:
        return scratch, dropped
    if scratch is None or scratch.shape != (2, array.size):
        scratch = np.empty((2, array.size), dtype=np.float32)
    deadline.exchange([(array, p) for p in peers], [(scratch[i], p) for i, p in enumerate(peers)],
                what="ring exchange with neighbours")
    # Summing in rank order (not "self first") makes two ranks that average the same set of
    # models, as at 2 ranks, end with bitwise identical results.
    members = sorted(m for m in [rank] + peers if m not in dropped)
    if not members:  # this rank and its neighbours all dropped: keep the model as it is
        return scratch, dropped
    parts = {rank: array.copy()}
    for i, peer in enumerate(peers):
        parts[peer] = scratch[i]
    total = parts[members[0]].copy()
    for m in members[1:]:
        total += parts[m]
    np.divide(total, np.float32(len(members)), out=array)
    return scratch, dropped
