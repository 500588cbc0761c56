"""The bounded communicator (:class:`BoundedComm`): collectives with a deadline, so every wait for
other ranks ends, and names who did not answer. Below ``job/`` (the loops' barriers, statistics
and checkpoint gathers) and ``optim/`` (every optimizer's averages), which both import it.

One mechanism bounds every point where a rank of this project waits for its peers (the
trainer's barriers, statistics reductions and checkpoint gathers, the synchronous strategies'
and optimizers' gradient and model averages, D-PSGD's ring exchange):

1. **Arrival.** Entering sync point ``k`` (a counter every rank advances in the same order),
   a rank sends a one-integer message ``k`` to each peer on a private duplicate of the
   communicator and waits for the peers' ``k`` (non-blocking ``Isend``/``Irecv`` polled with
   ``Test`` and a sleep that backs off from 50 us to 5 ms (``native_coll.polling``), so a rank
   waiting for a straggler for minutes costs well under 1% of a core). When the deadline passes, the peers whose ``k``
   has not arrived are exactly the ranks that did not answer; they are named with the host and
   pid from a table every rank exchanged once at construction.
2. **Data.** Once everyone has arrived, the data moves in the matching non-blocking MPI
   collective (``Iallreduce``, ``Ibcast``, ...), polled in a tight loop (MPICH progresses a
   transfer only inside MPI calls, and all peers are known to be present, so this phase lasts
   as long as the blocking call would) but still against the deadline: a rank stopped in the
   middle of a transfer is reported too.

On expiry :class:`PeerTimeout` (a ``native_coll.CollectiveTimeout`` when the native collective
is installed, so one ``except`` catches both) is raised on every rank that is still running.
The object is then unusable: peers are at different points and nothing that follows could
match. Callers stop the job (see ``wagma_rl.job.exits``); nothing is checkpointed after a timeout,
because checkpoints are only written after a sync point completed on every rank.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import time
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

__all__ = ["BoundedComm", "Peer", "PeerTimeout", "DEFAULT_TIMEOUT", "describe_ranks"]

from native_coll import CollectiveTimeout  # one exception type for "a peer did not answer"
from native_coll import faults
from native_coll.handshake import DEFAULT_TIMEOUT, bounded_allgather  # the one default timeout
from native_coll.polling import poll_until


_SPIN_S = 1.0  # a data phase polls without sleeping for this long (longer than any transfer here)
_ARRIVE_SPIN_S = 2e-3  # peers that are in step arrive within this; later ones are stragglers


@dataclasses.dataclass(frozen=True)
class Peer:
    """Where one rank runs."""

    rank: int
    host: str
    pid: int

    def __str__(self) -> str:
        return f"rank {self.rank} (host {self.host}, pid {self.pid})"


class PeerTimeout(CollectiveTimeout):
    """Peers did not reach a sync point in time. ``ranks``: their ranks; ``peers``: :class:`Peer`s;
    ``what``: the sync point (e.g. ``"statistics reduction"``)."""

    def __init__(self, message: str, peers: Sequence[Peer] = (), what: str = ""):
        super().__init__(message, tuple(p.rank for p in peers))
        self.peers = tuple(peers)
        self.what = what


def describe_ranks(peers: Sequence[Peer]) -> str:
    """``"rank 1 (host a, pid 12), rank 3 (host b, pid 40)"``."""
    return ", ".join(str(p) for p in peers)


class BoundedComm:
    """Collectives with a deadline over a private duplicate of ``comm``.

    Construction is collective and itself bounded: a rank that never constructs the object makes
    the others raise :class:`PeerTimeout` after ``timeout`` seconds (the duplicate is an
    ``Idup`` waited on against the deadline; its waiters cannot name the absent rank, since no
    table exists yet, and say so). Every method is collective over ``comm`` and must be called
    in the same order on every rank (as the blocking MPI collectives it replaces).

    Args:
        comm: the communicator the collectives run over (duplicated, never used directly).
        timeout: seconds any one call may wait for the slowest peer.
    """

    def __init__(self, comm: MPI.Comm, *, timeout: float = DEFAULT_TIMEOUT):
        if not timeout > 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.peers: tuple[Peer, ...] = ()
        self._seq = 0
        self._broken: str | None = None
        self._others = [r for r in range(self.size) if r != self.rank]
        self._pending_notices: list = []
        self._arrive_out = np.zeros(1, dtype=np.int64)
        self._arrive_in = np.zeros(max(len(self._others), 1), dtype=np.int64)
        # The host table first, through the collective's bounded handshake: a rank that never
        # starts is named by rank (there is no table yet to name its host).
        # Each rank also draws a token; rank 0's marks this object's notices. A notice a peer
        # never read stays queued after free(), and MPICH gives the freed communicator's context
        # to a later duplicate: a BoundedComm built there discards it instead of acting on it.
        try:
            table = bounded_allgather(comm, (socket.gethostname(), os.getpid(),
                                             int.from_bytes(os.urandom(7), "little")),
                                      timeout=self.timeout, what="start-up")
        except CollectiveTimeout as exc:
            raise PeerTimeout(str(exc), tuple(Peer(r, "?", 0) for r in exc.ranks),
                              "start-up") from None
        # Two private communicators: arrivals never match data, and neither matches user traffic.
        # Everyone is known to be here, so the duplicates complete at once (still bounded).
        self.comm = self._bounded_dup(comm, "start-up (communicator duplicate)")
        self._arrivals = self._bounded_dup(comm, "start-up (communicator duplicate)")
        # Under Open MPI's fault tolerance a lost rank revokes these with every other
        # communicator of the job, so no survivor waits here for a peer that is gone (docs/mpi.md).
        faults.track(self.comm)
        faults.track(self._arrivals)
        self.peers = tuple(Peer(r, host, int(pid)) for r, (host, pid, _) in enumerate(table))
        self._token = int(table[0][2])

    # ------------------------------------------------------------------------------ collectives
    def barrier(self, what: str = "barrier") -> None:
        """Wait until every rank has called this (bounded)."""
        self.arrive(what)

    def allreduce(self, array: np.ndarray, *, op: MPI.Op = MPI.SUM, what: str = "allreduce") -> np.ndarray:
        """Reduce ``array`` in place over all ranks (bounded); returns it."""
        deadline = self.arrive(what)
        if self.size > 1:
            self._poll([self.comm.Iallreduce(MPI.IN_PLACE, array, op=op)], deadline=deadline,
                       what=what, spin=_SPIN_S)
        return array

    def allgather(self, array: np.ndarray, *, what: str = "allgather") -> np.ndarray:
        """Every rank's ``array`` (the same shape and type on every rank) as the rows of one
        array, row ``r`` from rank ``r`` (bounded)."""
        deadline = self.arrive(what)
        out = np.empty((self.size,) + array.shape, dtype=array.dtype)
        if self.size > 1:
            self._poll([self.comm.Iallgather(array, out)], deadline=deadline, what=what, spin=_SPIN_S)
        else:
            out[0] = array
        return out

    def bcast(self, array: np.ndarray, *, root: int = 0, what: str = "broadcast") -> np.ndarray:
        """Overwrite ``array`` with ``root``'s contents on every rank (bounded); returns it."""
        deadline = self.arrive(what)
        if self.size > 1:
            self._poll([self.comm.Ibcast(array, root=root)], deadline=deadline, what=what, spin=_SPIN_S)
        return array

    def reduce_to(self, array: np.ndarray, *, root: int = 0, op: MPI.Op = MPI.SUM,
                  what: str = "reduce") -> np.ndarray:
        """Reduce ``array`` onto ``root`` in place (bounded); other ranks' ``array`` is unchanged."""
        deadline = self.arrive(what)
        if self.size > 1:
            send = MPI.IN_PLACE if self.rank == root else array
            recv = array if self.rank == root else None
            self._poll([self.comm.Ireduce(send, recv, op=op, root=root)], deadline=deadline,
                       what=what, spin=_SPIN_S)
        return array

    def allgather_obj(self, obj: Any, *, what: str = "allgather") -> list[Any]:
        """Every rank's picklable ``obj``, in rank order, on every rank (bounded)."""
        deadline = self.arrive(what)
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        sizes = np.zeros(self.size, dtype=np.int64)
        self._poll([self.comm.Iallgather(np.array([data.size], dtype=np.int64), sizes)],
                   deadline=deadline, what=what, spin=_SPIN_S)
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        displs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self._poll([self.comm.Iallgatherv(data, [out, (sizes, displs), MPI.BYTE])],
                   deadline=deadline, what=what, spin=_SPIN_S)
        return [pickle.loads(out[a:a + n].tobytes()) for a, n in zip(displs, sizes)]

    def bcast_obj(self, obj: Any, *, root: int = 0, what: str = "broadcast") -> Any:
        """``root``'s picklable ``obj`` on every rank (bounded)."""
        deadline = self.arrive(what)
        if self.size == 1:
            return obj
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if self.rank == root else b""
        n = np.array([len(data)], dtype=np.int64)
        self._poll([self.comm.Ibcast(n, root=root)], deadline=deadline, what=what, spin=_SPIN_S)
        buf = np.frombuffer(data, dtype=np.uint8).copy() if self.rank == root else \
            np.empty(int(n[0]), dtype=np.uint8)
        self._poll([self.comm.Ibcast(buf, root=root)], deadline=deadline, what=what, spin=_SPIN_S)
        return obj if self.rank == root else pickle.loads(buf.tobytes())

    def exchange(self, sends: Sequence[tuple[np.ndarray, int]], recvs: Sequence[tuple[np.ndarray, int]],
                 *, what: str = "exchange") -> None:
        """Point-to-point: send each ``(array, peer)`` and receive into each ``(array, peer)``
        (bounded; collective: every rank calls it, with or without messages)."""
        deadline = self.arrive(what)
        reqs = [self.comm.Irecv(buf, source=src, tag=7) for buf, src in recvs]
        reqs += [self.comm.Isend(buf, dest=dst, tag=7) for buf, dst in sends]
        if reqs:
            self._poll(reqs, deadline=deadline, what=what, spin=_SPIN_S)

    def wait(self, reqs: Sequence[MPI.Request], *, peers: Sequence[int], what: str) -> None:
        """Wait (bounded) for requests that depend on ``peers`` only (e.g. one-sided operations
        targeting them); on expiry they are the ranks named. Not a sync point: local."""
        self._poll(list(reqs), deadline=time.monotonic() + self.timeout, what=what,
                   missing=lambda: tuple(self.peers[p] for p in peers), spin=_ARRIVE_SPIN_S)

    # ------------------------------------------------------------------------------ notices
    def notify(self, value: int) -> None:
        """Send ``value`` to every peer without waiting (a notice they read with :meth:`notices`);
        for events a wait-avoiding algorithm must spread without a collective."""
        msg = np.array([self._token, value], dtype=np.int64)
        for p in self._others:
            self._pending_notices.append((self._arrivals.Isend(msg, dest=p, tag=2), msg))

    def notices(self) -> list[tuple[int, int]]:
        """``(rank, value)`` of every notice received so far (non-blocking; each returned once).
        A stale notice (sent to an earlier BoundedComm whose communicator's context this one got)
        is received and dropped."""
        out = []
        status = MPI.Status()
        while self.size > 1 and self._arrivals.Iprobe(source=MPI.ANY_SOURCE, tag=2, status=status):
            buf = np.zeros(2, dtype=np.int64)
            self._arrivals.Recv(buf, source=status.Get_source(), tag=2)
            if int(buf[0]) == self._token:
                out.append((status.Get_source(), int(buf[1])))
        return out

    # --------------------------------------------------------------------------- the mechanism
    def arrive(self, what: str) -> float:
        """Announce this rank at the next sync point and wait until every peer has announced
        itself there; return the deadline (monotonic seconds) for the data that follows."""
        if self._broken:
            raise RuntimeError(f"the collectives stopped after an earlier failure ({self._broken}); "
                               "the job must end")
        deadline = time.monotonic() + self.timeout
        if self.size == 1:
            return deadline
        self._seq += 1
        self._arrive_out[0] = self._seq
        reqs, sends, failed, cause = [], [], [], ""
        for i, p in enumerate(self._others):
            try:  # (the transport may refuse at once a peer whose process or node is gone)
                reqs.append(self._arrivals.Irecv(self._arrive_in[i:i + 1], source=p, tag=1))
                sends.append(self._arrivals.Isend(self._arrive_out, dest=p, tag=1))
            except MPI.Exception as exc:
                failed.append(p)
                cause = exc.Get_error_string().splitlines()[-1].strip()[:160]
        if failed:
            self._expire(what, lambda: tuple(self.peers[p] for p in failed if self.peers),
                         cause=cause)

        def missing() -> tuple[Peer, ...]:
            gone = []
            for p, r in zip(self._others, reqs):
                try:
                    arrived = r.Test()
                except MPI.Exception:  # the transport lost that peer
                    arrived = False
                if not arrived:
                    gone.append(self.peers[p])
            return tuple(gone)

        self._poll(reqs, deadline=deadline, what=what, missing=missing)
        # Sends to peers that arrived complete at once (tiny messages go eagerly).
        self._poll(sends, deadline=deadline, what=what, spin=_SPIN_S)
        if np.any(self._arrive_in[: len(self._others)] != self._seq):
            raise RuntimeError(f"{what}: ranks are at different sync points ({self._arrive_in.tolist()} "
                               f"vs {self._seq}); every rank must call the collectives in the same order")
        return deadline

    def _poll(self, reqs: list[MPI.Request], *, deadline: float, what: str, spin: float = _ARRIVE_SPIN_S,
              missing=None) -> None:
        """Test ``reqs`` until all complete or ``deadline`` passes (then raise PeerTimeout).

        The first ``spin`` seconds poll without sleeping: moving data with everyone present (MPICH
        progresses a transfer only inside MPI calls). After that the wait is for a straggler (or a
        transfer that stalled), so it backs off to cost next to no CPU, and before each sleep looks
        whether a peer that timed out first already said whom it missed."""
        done = poll_until(lambda: self._testall(reqs, what, missing), deadline=deadline, spin_s=spin,
                          before_sleep=lambda: self._reported_timeout(what))
        if done is None:
            self._expire(what, missing)

    def _testall(self, reqs, what: str, missing) -> bool:
        try:
            return MPI.Request.Testall(reqs)
        except MPI.Exception as exc:
            # A peer's process or node is gone and the transport noticed before the deadline
            # (a reset TCP connection): the same report, sooner.
            self._expire(what, missing, cause=exc.Get_error_string().splitlines()[0][:160])

    def _reported_timeout(self, what: str) -> None:
        """Raise PeerTimeout when a peer already timed out and told us whom it missed."""
        status = MPI.Status()
        if self.size == 1 or not self.peers or \
                not self._arrivals.Iprobe(source=MPI.ANY_SOURCE, tag=3, status=status):
            return
        note = np.zeros(self.size + 1, dtype=np.int64)
        self._arrivals.Recv(note, source=status.Get_source(), tag=3)
        gone = tuple(self.peers[r] for r in note[1:1 + int(note[0])])
        self._broken = f"{what} timed out"
        raise PeerTimeout(f"{what}: {describe_ranks(gone) or 'a rank'} did not answer within "
                          f"{self.timeout:g} s (timeout, found by rank {status.Get_source()}); the "
                          "job must stop", gone, what)

    def _tell_survivors(self, gone: Sequence[Peer]) -> None:
        """Send whom we missed to every other peer, so all survivors stop now with one list."""
        note = np.zeros(self.size + 1, dtype=np.int64)
        note[0] = len(gone)
        note[1:1 + len(gone)] = [p.rank for p in gone]
        lost = {p.rank for p in gone}
        reqs = [self._arrivals.Isend(note, dest=p, tag=3) for p in self._others if p not in lost]
        # Small eager messages: gone in microseconds unless a link is dead, so 1 s bounds it.
        if reqs:
            poll_until(lambda: MPI.Request.Testall(reqs), deadline=time.monotonic() + 1.0)

    def _expire(self, what: str, missing, cause: str = "") -> None:
        if missing is None:
            # Everyone had arrived, so the peers stuck in the transfer cannot be told apart from
            # the rest: name every peer (the data phase only stalls when one stopped mid-way).
            gone = tuple(self.peers[p] for p in self._others) if self.peers else ()
        else:
            try:
                gone = tuple(missing())
            except MPI.Exception:
                gone = tuple(self.peers[p] for p in self._others) if self.peers else ()
        # The pending requests are left alone: the job is about to end, and cancelling sends
        # would itself talk to the unresponsive peer.
        self._broken = f"{what} timed out"
        faults.revoke_all()  # under fault tolerance: every survivor stops waiting, wherever it is
        if gone and self.peers:
            try:
                self._tell_survivors(gone)
            except MPI.Exception:
                pass  # the survivors find out by their own deadline
        if gone:
            who = f"{describe_ranks(gone)} did not answer"
        elif self.peers:
            who = "no peer answered"
        else:
            who = "a rank did not start (no host table yet, so it cannot be named)"
        when = f"(MPI reported: {cause})" if cause else f"within {self.timeout:g} s (timeout)"
        raise PeerTimeout(f"{what}: {who} {when}; the job must stop", gone, what)

    def describe(self, ranks: Sequence[int]) -> str:
        """Name ``ranks`` with host and pid (e.g. the ranks of a native ``CollectiveTimeout``)."""
        return describe_ranks([self.peers[r] for r in ranks if 0 <= r < len(self.peers)])

    def free(self) -> None:
        """Release the communicators (local: no waiting)."""
        for c in (getattr(self, "comm", MPI.COMM_NULL), getattr(self, "_arrivals", MPI.COMM_NULL)):
            if c != MPI.COMM_NULL and self._broken is None:
                c.Free()

    def _bounded_dup(self, comm: MPI.Comm, what: str) -> MPI.Comm:
        new, req = comm.Idup()
        self._poll([req], deadline=time.monotonic() + self.timeout, what=what, missing=lambda: ())
        return new
