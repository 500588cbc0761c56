"""A deadline-bounded allgather of small Python objects that names the ranks that did not arrive.

Used where a plain collective would wait forever for a rank that never comes (a collective's
construction). Every rank sends its object to rank 0 and rank 0 answers every rank with either the
full list or the list of ranks it did not hear from; all waiting goes through
:func:`native_coll.polling.poll_until`, so a waiting rank does not burn a core.
"""
from __future__ import annotations

import time

from mpi4py import MPI

from native_coll.errors import CollectiveTimeout
from native_coll.polling import poll_until

#: Seconds a rank waits for its peers unless told otherwise: the one default of the project
#: (``averaging.timeout``; native_coll.collective and wagma_rl.bounded_comm use it).
DEFAULT_TIMEOUT = 300.0

__all__ = ["HANDSHAKE_TAG", "DEFAULT_TIMEOUT", "bounded_allgather"]

# MPI guarantees tags up to 32767; this one is reserved for the handshake on the caller's
# communicator (no duplicate exists yet: creating one is itself a collective that could block).
HANDSHAKE_TAG = 32_000


def bounded_allgather(comm: MPI.Comm, obj, *, timeout: float, what: str = "the handshake"):
    """Return ``[obj of rank 0, obj of rank 1, ...]`` on every rank, like ``comm.allgather``.

    Raises :class:`CollectiveTimeout` on every rank that is present when some rank did not call
    within ``timeout`` seconds; the message and ``ranks`` name the missing ranks (rank 0 itself
    when it is the one missing). ``what`` names the operation in the message.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return [obj]
    deadline = time.monotonic() + timeout
    tag = HANDSHAKE_TAG
    if rank != 0:
        req = comm.issend((rank, obj), dest=0, tag=tag)
        msg = poll_until(lambda: comm.improbe(source=0, tag=tag), deadline=deadline + 1.0)
        if msg is None:
            req.Cancel()
            req.Free()
            raise CollectiveTimeout(
                f"{what} did not complete within {timeout:g} s: rank(s) [0] did not answer", (0,))
        status, payload = msg.recv()
        req.Wait()
        if status == "missing":
            raise CollectiveTimeout(_missing_message(what, timeout, payload), tuple(payload))
        return payload
    got: dict[int, object] = {0: obj}
    while len(got) < size:
        msg = poll_until(lambda: comm.improbe(source=MPI.ANY_SOURCE, tag=tag), deadline=deadline)
        if msg is None:
            break
        src, value = msg.recv()
        got[src] = value
    missing = [r for r in range(size) if r not in got]
    answer = ("missing", missing) if missing else ("ok", [got[r] for r in range(size)])
    reqs = [comm.issend(answer, dest=r, tag=tag) for r in sorted(got) if r != 0]
    # The present ranks are waiting for this answer; a rank that vanished since would leave the
    # synchronous send pending, so it is bounded too.
    poll_until(lambda: MPI.Request.Testall(reqs), deadline=time.monotonic() + timeout)
    if missing:
        raise CollectiveTimeout(_missing_message(what, timeout, missing), tuple(missing))
    return answer[1]


def _missing_message(what: str, timeout: float, missing) -> str:
    return (f"{what} did not complete within {timeout:g} s: rank(s) "
            f"[{', '.join(map(str, missing))}] did not answer")
