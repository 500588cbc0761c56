"""A sum over ranks that share a node, through buffers every rank maps: the ``exchange="node"``
path of :class:`~wagma_rl.optim.AllreduceSGD`.

MPI moves an allreduce between the processes of one node through its shared-memory transport:
each rank's data is copied into shared cells and out again in pieces, and GPU gradients first go
to the host and back (docs/results/optimizers.md: on an H200, 4 ranks sharing the GPU wait 40% of
a ResNet-50 step for that). When every rank can map every other rank's buffer, a sum needs none
of it: rank ``r`` adds chunk ``r`` of all the buffers in place (a reduce-scatter that reads the
peers' memory directly) and then copies the other chunks from the ranks that added them (an
allgather). Two kinds of memory, one algorithm:

* **cpu**: one MPI-3 shared window (``MPI_Win_allocate_shared``) over the ranks, a segment each.
* **cuda**: a device buffer per rank, mapped by the others through CUDA IPC handles (as
  ``torch.multiprocessing`` shares CUDA tensors), ordered by interprocess CUDA events: a phase
  records the rank's event on its current stream, the host meets its peers at a bounded barrier,
  and the stream then waits for every peer's event. The host never waits for the device, and no
  byte leaves the GPUs. The ranks must see the same GPUs (pick one with ``run.device=cuda:N``, not
  with a different ``CUDA_VISIBLE_DEVICES`` per rank); ranks on different GPUs of a node copy each
  other's chunks peer to peer.

Across nodes (the same number of ranks on each) the sum is hierarchical: between the two phases
below, the owner of chunk ``r`` on each node allreduces it by MPI with the owners of chunk ``r``
on the other nodes, so each rank sends ``1 / ranks per node`` of the buffer between nodes.

A sum has two phases, each closed by a barrier: every rank has written its contribution (the
barrier may carry a small MPI allreduce of the caller's, so it costs no extra meeting); rank ``r``
has added chunk ``r`` of every buffer, in rank order, into its own buffer. Then every rank copies
the other chunks from their owners. The rounds alternate between two buffers per rank, so a rank
that writes its next contribution never overwrites a chunk a peer is still copying: it writes
the buffer of the round before, and every peer finished copying from that one before it met the
others at the last round's first barrier. In no phase do two ranks write the same bytes or does a
rank read bytes another one writes, and every element is added in rank order by one rank (on
several nodes: each node's sum in rank order, then MPI's sum of the nodes'), so every rank gets
the same bits. Each barrier is the job's bounded one (``BoundedComm``), so a rank
that stops is named, as everywhere else.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from mpi4py import MPI

from wagma_rl.bounded_comm import BoundedComm

__all__ = ["NodeSum", "wants_node"]


def wants_node(params) -> bool:
    """Whether ``exchange="auto"`` tries the node sum for these parameters: all on one GPU (the
    case measured to pay: on one H200, 4 ranks, ResNet-50 waited 4% of its step against 38% with
    MPI and buckets; on cpu it gained 1-5% in training, so cpu stays on MPI)."""
    devices = {p.device for p in params}
    return len(devices) == 1 and next(iter(devices)).type == "cuda" and torch.cuda.is_available()


class NodeSum:
    """The sum of one float32 buffer per rank over ``comm``: within each node through the mapped
    buffers, across nodes (when the ranks span several) by MPI, chunk by chunk.

    Write a rank's contribution into :attr:`mine` (on ``device``), call :meth:`sum_`; it returns
    the sum (cuda: for work queued after it on the current stream), the same bits on every rank.
    Read it, never write it (peers may still be copying from it), until the next sum returns;
    :attr:`mine` is then the next round's buffer. Collective: every rank constructs it, calls
    :meth:`sum_` and :meth:`close`.

    Across nodes (the same number of ranks on each), the rank with node-local index ``r`` owns
    chunk ``r`` on every node: it adds its node's chunk ``r`` as above, then sums it with the
    other nodes' owners of chunk ``r`` in one MPI allreduce (through the host on cuda), so every
    rank moves ``1 / ranks per node`` of the buffer between nodes (a hierarchical allreduce).

    Raises ``ValueError`` (on every rank alike) when the nodes hold different numbers of ranks
    or, on cuda, a rank cannot map another's GPU memory or (``one_device``) a node's ranks use
    different GPUs.
    """

    def __init__(self, bounded: BoundedComm, comm: MPI.Comm, numel: int, device: torch.device | str,
                 *, one_device: bool = False):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"exchange='node' sums cpu or cuda tensors, not {self.device.type} "
                             "ones: use exchange='mpi'")
        self.numel = int(numel)
        self._bounded = bounded
        self._win = self._across = self._across_comm = None
        bounded.barrier("exchange='node' start-up")  # all here: the collectives below return at once
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        try:
            # Node-local index and size: the buffers and the chunks are the node's.
            self.rank, self.size = node.Get_rank(), node.Get_size()
            sizes = bounded.allgather_obj(self.size, what="exchange='node' start-up (node sizes)")
            if len(set(sizes)) > 1:  # the same answer on every rank, so all refuse alike
                raise ValueError(f"exchange='node' needs the same number of ranks on every node, "
                                 f"found {sorted(set(sizes))} ranks per node: use exchange='mpi'")
            self.nodes = comm.Get_size() // self.size
            members = node.allgather(comm.Get_rank())  # the job ranks of this node, node order
            count = max(self.numel, 1)
            if self.cuda:
                self._map_device(2 * count, members, one_device)
            else:
                self._win = MPI.Win.Allocate_shared(2 * count * 4, 4, comm=node)
                self._win.Lock_all(MPI.MODE_NOCHECK)
                self._bufs = [torch.from_numpy(np.frombuffer(self._win.Shared_query(r)[0],
                                                             dtype=np.float32, count=2 * count))
                              for r in range(self.size)]
        finally:
            node.Free()
        if self.nodes > 1:
            # The owners of the same chunk on every node (node-local index equal), bounded as
            # every other wait of the job.
            self._across_comm = comm.Split(self.rank, comm.Get_rank())
            self._across = BoundedComm(self._across_comm, timeout=bounded.timeout)
        # Round k uses part k % 2 of every rank's buffer.
        self._parts = [[buf[i * count: i * count + self.numel] for buf in self._bufs] for i in (0, 1)]
        self._round = 0
        self._bounds = [(r * self.numel // self.size, (r + 1) * self.numel // self.size)
                        for r in range(self.size)]
        a, b = self._bounds[self.rank]
        self._scratch = torch.empty(b - a, dtype=torch.float32, device=self.device)
        # Across nodes on cuda the chunk goes through the host (pinned) for MPI.
        self._host_chunk = (torch.empty(b - a, dtype=torch.float32, pin_memory=True)
                            if self.nodes > 1 and self.cuda else None)
        # A peer on another GPU of the node (one rank per GPU): its chunk is copied here first
        # (peer to peer), as kernels take tensors of one device.
        self._far = (torch.empty_like(self._scratch)
                     if any(buf.device != self.device for buf in self._bufs) else None)

    def _map_device(self, count: int, members: list[int], one_device: bool) -> None:
        """Allocate this rank's device buffer and map every node peer's (CUDA IPC); ``members``:
        the job ranks of this node in node order; ``one_device``: refuse peers on other GPUs."""
        from torch.multiprocessing.reductions import reduce_tensor

        stream = torch.cuda.current_stream(self.device)
        mine = torch.zeros(count, dtype=torch.float32, device=self.device)
        self._event = torch.cuda.Event(interprocess=True)
        self._event.record(stream)
        rebuild, args = reduce_tensor(mine)
        table = self._bounded.allgather_obj((rebuild, args, bytes(self._event.ipc_handle())),
                                            what="exchange='node' start-up (CUDA IPC handles)")
        self._bufs, self._peer_events, problem = [], [], ""
        for r, job_rank in enumerate(members):
            rebuild_r, args_r, event_r = table[job_rank]
            if r == self.rank:
                self._bufs.append(mine)
                continue
            try:
                self._bufs.append(rebuild_r(*args_r))
                self._peer_events.append(torch.cuda.Event.from_ipc_handle(self.device, event_r))
            except Exception as exc:  # noqa: BLE001 - reported on every rank below, in one line
                problem = problem or f"rank {members[self.rank]} cannot map rank {job_rank}'s GPU buffer " \
                    f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
                continue
            if one_device and self._bufs[-1].device != self.device:
                problem = problem or (f"rank {members[self.rank]} ({self.device}) and rank "
                                      f"{job_rank} ({self._bufs[-1].device}) use different GPUs")
        failed = self._bounded.allgather_obj(problem, what="exchange='node' start-up (mapping)")
        failed = [p for p in failed if p]
        if failed:
            self._bufs, self._peer_events = None, []  # nothing of a peer's stays mapped
            raise ValueError(f"exchange='node': {failed[0]}; the ranks must see the same GPUs "
                             "(choose one with run.device=cuda:N, not CUDA_VISIBLE_DEVICES per "
                             "rank), or use exchange='mpi'")

    @property
    def mine(self) -> torch.Tensor:
        """This rank's buffer of the coming sum (write its contribution here)."""
        return self._parts[self._round % 2][self.rank]

    def _phase(self, what: str, allreduce: np.ndarray | None = None) -> None:
        """Every rank's work on the buffers so far is visible to every rank from here on; the
        barrier is ``allreduce``'s bounded MPI allreduce (in place) when one is given."""
        stream = torch.cuda.current_stream(self.device) if self.cuda else None
        if self.cuda:
            self._event.record(stream)
        else:
            self._win.Sync()
        if allreduce is not None:
            self._bounded.allreduce(allreduce, what=what)
        else:
            self._bounded.barrier(what)  # every peer has recorded its event of this phase
        if self.cuda:
            for event in self._peer_events:
                stream.wait_event(event)
        else:
            self._win.Sync()

    @torch.no_grad()
    def sum_(self, allreduce: np.ndarray | None = None, *,
             divide_by: Callable[[], int] | None = None) -> torch.Tensor:
        """The sum of all ranks' :attr:`mine`, the same on every rank (read-only: see the class).

        ``allreduce``: a small array summed in place over the ranks by MPI at the same time (one
        meeting, not two). ``divide_by``: called once that is done (it may read the array); each
        rank divides its chunk's sums by what it returns before the others copy them, so the
        result is the sum divided, to the bit (an exception it raises leaves the sum undone, on
        every rank alike when it depends on the array only)."""
        bufs = self._parts[self._round % 2]
        mine = bufs[self.rank]
        self._phase("node sum (contributions written)", allreduce)
        divisor = divide_by() if divide_by is not None else None
        a, b = self._bounds[self.rank]
        acc = self._scratch
        if b > a:
            acc.copy_(bufs[0][a:b])
            for buf in bufs[1:]:
                if buf.device == self.device:
                    acc.add_(buf[a:b])
                else:
                    acc.add_(self._far.copy_(buf[a:b]))
        if self._across is not None:  # (every owner of this chunk calls it, empty or not)
            if self.cuda:
                self._host_chunk.copy_(acc)  # waits for the sums above (this stream)
                self._across.allreduce(self._host_chunk.numpy(), what="node sum (across nodes)")
                acc.copy_(self._host_chunk, non_blocking=True)
            else:
                self._across.allreduce(acc.numpy(), what="node sum (across nodes)")
        if b > a:
            if divisor is not None:
                acc /= divisor
            mine[a:b].copy_(acc)
        self._phase("node sum (chunks added)")
        for r, (ar, br) in enumerate(self._bounds):
            if r != self.rank and br > ar:
                mine[ar:br].copy_(bufs[r][ar:br])
        self._round += 1
        return mine

    def close(self) -> None:
        """Unmap the peers' buffers and free this rank's (collective)."""
        if self._bufs is None:
            return
        if self.cuda:  # every copy this rank queued from a peer's buffer has run
            torch.cuda.current_stream(self.device).synchronize()
        own = self._bufs[self.rank]
        self._bufs = self._parts = self._scratch = self._far = self._host_chunk = None
        self._peer_events = []
        # Every rank has let go of its peers' buffers before any rank frees its own, so no owner
        # exits while its memory is still mapped elsewhere (CUDA IPC would warn at exit).
        self._bounded.barrier("exchange='node' close")
        del own
        if self._across is not None:
            self._across.free()
            self._across_comm.Free()
            self._across = self._across_comm = None
        if self._win is not None:
            self._win.Unlock_all()
            self._win.Free()
            self._win = None
