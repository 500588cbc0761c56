"""Non-blocking mini-batch SGD (He and Dube): the round closes when the first rank finishes.

Each rank splits its batch into ``micro_batches`` micro-batches and publishes what it has finished
after each one (a gradient sum and a count). The first rank to finish its batch fires a
wait-avoiding allreduce over all ranks; every rank contributes whatever it had published by then.
No finished micro-batch is wasted: one that missed the round (finished after the fire, or while
the rank had not yet noticed it) is *carried* into the rank's contribution to the next round.

Two variants, as in the paper:

* :class:`NonBlockingSGD` (on ring allreduce): the round averages the gradients; every rank applies
  the same averaged gradient (sum over ranks / number of finished micro-batches), so the replicas
  stay bitwise identical.
* :class:`NonBlockingDPSGD` (on D-PSGD gossip): the round only closes the batch (it averages the
  per-rank counts); each rank steps with the mean of its own finished micro-batches, then averages
  its model with its two ring neighbours. Models differ between ranks, as in D-PSGD.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterable

import numpy as np
import torch
from mpi4py import MPI

from wagma_rl.bounded_comm import DEFAULT_TIMEOUT

from ._native import native_coll
from .averaging import ring_average, ring_neighbours
from .base import DistributedOptimizer
from .buckets import GradBuckets, check_bucket_bytes, default_bucket_bytes
from .finite import NonFiniteError, is_finite
from .flat import pack_grads, unpack_grads

__all__ = ["NonBlockingSGD", "NonBlockingDPSGD", "RoundResult"]


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """What one non-blocking round used (``opt.last_round`` and ``opt.stats.extra``)."""

    counts: tuple[int, ...]
    """Micro-batches each rank contributed (carried-in ones included)."""
    total: int
    """Sum of ``counts``: the divisor of the gradient sum."""
    local_done: int
    """Micro-batches this rank held when it took the result (carried-in ones included)."""
    carried: int
    """This rank's finished micro-batches that missed the round: they go into the next one
    (``local_done - counts[rank]``)."""
    closed_early: bool
    """True when the round had closed before this rank finished its batch."""


class NonBlockingSGD(DistributedOptimizer):
    """Gradient averaging in which nobody waits for a whole batch of a slow rank.

    Usage per batch::

        for mb in micro_batches:
            loss_fn(model(mb)).backward()
            if not opt.micro_step():   # the round closed: stop this batch
                break
        opt.step()                     # fire the round (first rank) or take its result
        opt.zero_grad()

    The loss of each micro-batch should be a mean over the micro-batch; the update is the mean of
    the contributed micro-batches' gradients over all ranks. A micro-batch finished after its round
    closed joins the next round, computed one update earlier (staleness at most one round per
    round it waited); nothing a rank computed is thrown away. Micro-batches of at least 16 samples
    keep a CPU's compute per sample near that of the whole batch (docs/optimizers.md).

    Args:
        optimizer: the wrapped ``torch.optim.Optimizer``.
        micro_batches: micro-batches in one rank's batch.
        comm: communicator (default ``MPI.COMM_WORLD``).
        timeout: seconds a collective may wait for an unresponsive rank.
        nonfinite: a micro-batch gradient holding NaN/inf is never added to the accumulator.
            ``"raise"`` (default): the rank marks its count slot instead, and every rank raises
            the same :class:`~wagma_rl.optim.finite.NonFiniteError` when a round completes with
            the mark; ``"drop"``: the micro-batch is left out and the round goes on.
        buffers: module buffers; averaged by :meth:`synchronize` only (they are not gradients).
        bucket_bytes: each micro-batch's gradients reach the host in buckets of about this many
            bytes, in the order backward produces them, each copied as soon as backward
            completes it (GPU: on a side stream, :mod:`.buckets`), so :meth:`micro_step` waits
            only for the last bucket's copy. 0: one copy at :meth:`micro_step`. Default (None):
            25 MiB for GPU parameters, 0 for cpu ones (as :class:`~wagma_rl.optim.AllreduceSGD`).
            The round itself stays one wait-avoiding allreduce of the whole accumulator: what
            each rank contributes is decided when the first finisher fires it. A gradient that
            changes after its bucket was copied (a second backward before ``micro_step()``) is
            packed again whole, so the result never depends on the buckets.
    """

    _collective_first_check = False
    #: The round averages gradients (False) or only counts, followed by ring gossip (True).
    _gossip = False

    def __init__(self, optimizer: torch.optim.Optimizer, *, micro_batches: int,
                 comm: MPI.Comm | None = None, timeout: float = DEFAULT_TIMEOUT,
                 nonfinite: str = "raise", buffers: Iterable[torch.Tensor] | None = None,
                 bucket_bytes: int | None = None):
        name = type(self).__name__
        check_bucket_bytes(name, bucket_bytes)
        if not isinstance(micro_batches, int) or isinstance(micro_batches, bool) or micro_batches < 1:
            raise ValueError(f"{name} micro_batches must be a positive integer, got {micro_batches!r}")
        if not timeout > 0:
            raise ValueError(f"{name} timeout must be positive seconds, got {timeout!r}")
        nc = native_coll()
        self.micro_batches = micro_batches
        # Gossip steps the parameters through the flat buffer (views); the allreduce variant
        # writes gradients only, and its flat buffer serves synchronize().
        super().__init__(optimizer, comm=comm, buffers=buffers, views=self._gossip,
                         options={"micro_batches": micro_batches}, timeout=timeout,
                         nonfinite=nonfinite)
        n = sum(p.numel() for p in self._params)
        self._n = n
        # Gradients (the accumulator, the scratch, the pending micro-batches) are laid out in the
        # order backward produces them, so the buckets are contiguous; sums are per element, so
        # the layout changes no value.
        self._order = self._params[::-1]
        # What the round averages: [gradient sum | one count slot per rank] (the gossip variant:
        # the count slots only). Per-rank slots make every rank's count known to all.
        shared = 0 if self._gossip else n
        self._acc = torch.zeros(shared + self.world_size, dtype=torch.float32)
        self._slots = self._acc[shared:]
        # Pinned on GPUs: the gradients come to it on the side stream (flat.pack_grads).
        on_gpu = any(p.device.type == "cuda" for p in self._params) and torch.cuda.is_available()
        self._scratch = torch.zeros(n, dtype=torch.float32, pin_memory=on_gpu)
        if bucket_bytes is None:
            bucket_bytes = default_bucket_bytes(self._params)
        self.bucket_bytes = bucket_bytes
        self._buckets = GradBuckets(self._order, self._scratch, bucket_bytes) if bucket_bytes else None
        # This rank's finished micro-batch gradients not yet known to be in a round, oldest first.
        # Each publish sends a prefix of them (sum and count), so the round's count for this rank
        # says which ones it used and which are carried.
        self._pending: list[torch.Tensor] = []
        self._new = 0  # micro-batches computed in this round (carried-in ones not counted)
        self._closed_early = False
        self._poisoned = False  # a non-finite gradient was seen: the count slot carries the mark
        self._ring_scratch = None
        self.last_round: RoundResult | None = None
        self._deadline.barrier(f"{name} collective start-up")
        self._wa = nc.WaitAvoidingAllreduce(self.comm, self._acc, group_size=self.world_size,
                                            sync_period=None, timeout=float(timeout))

    @property
    def done(self) -> int:
        """Micro-batches this rank holds for the current round (carried-in ones included)."""
        return len(self._pending)

    def _absorb_grads(self) -> bool:
        """Add the pending gradients to the accumulator as one finished micro-batch."""
        if all(p.grad is None for p in self._params):
            return False
        self._pack()
        self._drop_grads()
        self._new += 1
        if not self._poisoned and not is_finite(self._scratch):
            if self.nonfinite == "drop":
                self._note_dropped((self.rank,))
                return True
            self._poisoned = True
        if self._poisoned:
            # A negative count: every rank sees it in the round's result and raises.
            self._slots[self.rank] = -1.0
            return True
        self._pending.append(self._scratch.clone())
        if not self._gossip:
            self._acc[: self._n] += self._scratch
        self._slots[self.rank] = float(len(self._pending))
        return True

    def _pack(self) -> None:
        """The gradients into the scratch buffer: the buckets backward copied and the rest, or
        all of them anew when one changed after its bucket was copied."""
        buckets = self._buckets
        if buckets is None:
            pack_grads(self._order, self._scratch)
            return
        extra = self._stats.extra
        extra["buckets"] = len(buckets)
        extra["buckets_in_backward"] = sum(c is not False for c in buckets.copied)
        if buckets.finish():
            extra["bucket_fallbacks"] = extra.get("bucket_fallbacks", 0) + 1
            pack_grads(self._order, self._scratch)  # after the copies on the same stream
        else:
            buckets.wait()

    def _drop_grads(self) -> None:
        """Set the gradients to None: the next backward starts the buckets' next round."""
        for p in self._params:
            p.grad = None
        if self._buckets is not None:
            self._buckets.new_round()

    def micro_step(self) -> bool:
        """Publish the gradient accumulated so far (after one more ``backward()``).

        Returns False when the round has already closed (another rank fired it): stop the batch
        and call :meth:`step` to take the result.
        """
        self._check_step()
        if self._closed_early:
            return False
        if not self._absorb_grads():
            raise RuntimeError("micro_step() found no gradients: call loss.backward() for the "
                               "micro-batch first")
        if self._new > self.micro_batches:
            raise RuntimeError(f"micro_step() called {self._new} times in one round, more than "
                               f"micro_batches={self.micro_batches}; call step() after the last one")
        self._wa.publish()
        if self._wa.ready():
            self._closed_early = True
            return False
        return True

    def reduce_gradients(self) -> None:
        """Not available: the round closes inside :meth:`step` (when the first rank finishes),
        so the averaged gradient exists only there."""
        raise RuntimeError(f"{type(self).__name__} closes its round inside step(), when the first "
                           "rank finishes; call step() alone (a clip must go in a step pre-hook of "
                           "the wrapped optimizer)")

    def step(self, closure=None):
        """Fire the round (or take its result) and apply the update."""
        loss = self._run_closure(closure)
        self._check_step()
        if not self._closed_early and not self._wa.ready():
            # Gradients from a backward() not yet published count as one more micro-batch.
            self._absorb_grads()
        new = self._new
        t0 = time.perf_counter()
        info = self._native(self._wa.allreduce, late="discard", reset=True)
        comm_s = time.perf_counter() - t0
        # The result is the mean over ranks of [sum | counts]; the world size cancels out in
        # sum/total, and every rank computes this from the same bytes, so all get the same update.
        counts_mean = self._slots.numpy().astype(np.float64)
        counts = tuple(int(c) for c in np.rint(counts_mean * self.world_size))
        marked = [r for r, c in enumerate(counts) if c < 0]
        if marked:
            raise NonFiniteError(marked, self._stats.steps, "gradients")
        total = sum(counts)
        mine = counts[self.rank]
        used, carry = self._pending[:mine], self._pending[mine:]
        if self._gossip:
            if used:  # this rank's own mean gradient; the models meet in the gossip below
                unpack_grads(torch.stack(used).sum(0) / float(mine), self._order)
                self.optimizer.step()
        elif total > 0:
            grad = self._acc[: self._n] / self._slots.sum()
            unpack_grads(grad, self._order)
            self.optimizer.step()
        result = RoundResult(counts=counts, total=total, local_done=len(self._pending),
                             carried=len(carry), closed_early=self._closed_early or new < self.micro_batches)
        self.last_round = result
        # Start the next round's contribution from the carried micro-batches, published at once
        # since the next round may fire before this rank finishes another one.
        self._acc.zero_()
        self._pending = carry
        for g in carry:
            if not self._gossip:
                self._acc[: self._n] += g
        self._slots[self.rank] = -1.0 if self._poisoned else float(len(carry))
        if carry or self._poisoned:
            self._wa.publish()
        self._new = 0
        self._closed_early = False
        self._drop_grads()
        if self._gossip:
            t1 = time.perf_counter()
            self._gossip_models()
            comm_s += time.perf_counter() - t1
        self._record_comm(comm_s)
        self._stats.steps += 1
        self._stats.averages += 1
        self._stats.info = info
        self._stats.staleness = int(info.staleness)
        self._stats.extra = {**dataclasses.asdict(result),
                             **{k: v for k, v in self._stats.extra.items()
                                if k.startswith(("nonfinite", "bucket"))}}
        return loss

    def _gossip_models(self) -> None:
        """Average the model with the ring neighbours (every rank, once per round)."""

    def _close(self) -> None:
        self._wa.close()
        if self._buckets is not None:
            self._buckets.close()


class NonBlockingDPSGD(NonBlockingSGD):
    """The non-blocking rounds on D-PSGD gossip: each round closes when the first rank finishes.

    Same protocol as :class:`NonBlockingSGD` (``micro_step()`` per micro-batch, then ``step()``),
    but the round's allreduce carries only the per-rank counts: each rank steps with the mean
    gradient of its own micro-batches that the round counted (none: no local step), then replaces
    its model by the mean of it and its ring neighbours' models (r-1, r+1). A rank waits for its
    neighbours' models, never for more than the micro-batch they are in. Models are not identical
    between ranks; call :meth:`synchronize` before evaluating.
    """

    _gossip = True

    @property
    def neighbours(self) -> list[int]:
        """This rank's gossip partners."""
        return ring_neighbours(self.rank, self.world_size)

    def _gossip_models(self) -> None:
        self._flat.gather()
        self._ring_scratch, dropped = ring_average(
            self._deadline, self._flat.array[: self._flat.numel], self._ring_scratch,
            step=self._stats.steps, nonfinite=self.nonfinite)
        self._note_dropped(dropped)
        self._flat.scatter()
