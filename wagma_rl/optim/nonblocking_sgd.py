"""Non-blocking mini-batch SGD (He and Dube): the round closes when the first rank finishes.

Each rank splits its batch into ``micro_batches`` micro-batches and publishes the gradient it has
accumulated after each one (a sum and a count). The first rank to finish its batch fires a
wait-avoiding allreduce over all ranks; every rank contributes whatever it had published by then,
so a straggler's finished micro-batches count and its unfinished ones are dropped. Every rank
applies the same averaged gradient (sum over ranks / number of finished micro-batches), so the
replicas stay bitwise identical.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterable

import numpy as np
import torch
from mpi4py import MPI

from wagma_rl.deadline import DEFAULT_TIMEOUT

from ._native import native_coll
from .base import DistributedOptimizer
from .finite import NonFiniteError, is_finite
from .flat import pack_grads, unpack_grads

__all__ = ["NonBlockingSGD", "RoundResult"]

# The native collective's global (blocking) iterations are never wanted here; a period this long
# is never reached.
_NEVER = 2 ** 31 - 1


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """What one non-blocking round used (``opt.last_round`` and ``opt.stats.extra``)."""

    counts: tuple[int, ...]
    """Finished micro-batches each rank contributed."""
    total: int
    """Sum of ``counts``: the divisor of the gradient sum."""
    local_done: int
    """Micro-batches this rank had finished when it took the result."""
    dropped: int
    """This rank's finished micro-batches that missed the round (``local_done - counts[rank]``)."""
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
    the finished micro-batches' gradients over all ranks.

    Args:
        optimizer: the wrapped ``torch.optim.Optimizer``.
        micro_batches: micro-batches in one rank's batch.
        comm: communicator (default ``MPI.COMM_WORLD``).
        timeout: seconds a collective may wait for an unresponsive rank.
        nonfinite: a micro-batch gradient holding NaN/inf is never added to the accumulator.
            ``"raise"`` (default): the rank marks its count slot instead, and every rank raises
            the same :class:`~wagma_rl.optim.finite.NonFiniteError` when that round completes;
            ``"drop"``: the micro-batch is left out and the round goes on.
        buffers: module buffers; averaged by :meth:`synchronize` only (they are not gradients).
    """

    _collective_first_check = False

    def __init__(self, optimizer: torch.optim.Optimizer, *, micro_batches: int,
                 comm: MPI.Comm | None = None, timeout: float = DEFAULT_TIMEOUT,
                 nonfinite: str = "raise", buffers: Iterable[torch.Tensor] | None = None):
        if not isinstance(micro_batches, int) or isinstance(micro_batches, bool) or micro_batches < 1:
            raise ValueError(f"NonBlockingSGD micro_batches must be a positive integer, got {micro_batches!r}")
        if not timeout > 0:
            raise ValueError(f"NonBlockingSGD timeout must be positive seconds, got {timeout!r}")
        nc = native_coll()
        self.micro_batches = micro_batches
        super().__init__(optimizer, comm=comm, buffers=buffers, views=False,
                         options={"micro_batches": micro_batches}, timeout=timeout,
                         nonfinite=nonfinite)
        n = sum(p.numel() for p in self._params)
        self._n = n
        # [gradient sum | one count slot per rank]: per-rank slots make every rank's count known.
        self._acc = torch.zeros(n + self.world_size, dtype=torch.float32)
        self._scratch = torch.zeros(n, dtype=torch.float32)
        self._done = 0
        self._closed_early = False
        self._poisoned = False  # a non-finite gradient was seen: the count slot carries the mark
        self.last_round: RoundResult | None = None
        self._deadline.barrier("NonBlockingSGD collective start-up")
        self._wa = nc.WaitAvoidingAllreduce(self.comm, self._acc, group_size=self.world_size,
                                            sync_period=_NEVER, timeout=float(timeout))

    @property
    def done(self) -> int:
        """Micro-batches this rank has finished in the current round."""
        return self._done

    def _absorb_grads(self) -> bool:
        """Add the pending gradients to the accumulator as one finished micro-batch."""
        if all(p.grad is None for p in self._params):
            return False
        pack_grads(self._params, self._scratch)
        for p in self._params:
            p.grad = None
        if not self._poisoned and not is_finite(self._scratch):
            if self.nonfinite == "drop":
                self._note_dropped((self.rank,))
                return True
            self._poisoned = True
        if self._poisoned:
            # A negative count: every rank sees it in the round's result and raises.
            self._acc[self._n + self.rank] = -1.0
            return True
        self._acc[: self._n] += self._scratch
        self._done += 1
        self._acc[self._n + self.rank] = float(self._done)
        return True

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
        if self._done > self.micro_batches:
            raise RuntimeError(f"micro_step() called {self._done} times in one round, more than "
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
        """Fire the round (or take its result) and apply the averaged gradient."""
        loss = self._run_closure(closure)
        self._check_step()
        if not self._closed_early and not self._wa.ready():
            # Gradients from a backward() not yet published count as one more micro-batch.
            self._absorb_grads()
        t0 = time.perf_counter()
        info = self._native(self._wa.allreduce, late="discard", reset=True)
        self._record_comm(time.perf_counter() - t0)
        # The result is the mean over ranks of [sum | counts]; the world size cancels out in
        # sum/total, and every rank computes this from the same bytes, so all get the same update.
        counts_mean = self._acc[self._n:].numpy().astype(np.float64)
        counts = tuple(int(c) for c in np.rint(counts_mean * self.world_size))
        marked = [r for r, c in enumerate(counts) if c < 0]
        if marked:
            raise NonFiniteError(marked, self._stats.steps, "gradients")
        total = sum(counts)
        if total > 0:
            grad = self._acc[: self._n] / self._acc[self._n:].sum()
            unpack_grads(grad, self._params)
            self.optimizer.step()
        result = RoundResult(counts=counts, total=total, local_done=self._done,
                             dropped=max(0, self._done - counts[self.rank]),
                             closed_early=self._closed_early or self._done < self.micro_batches)
        self.last_round = result
        self._acc.zero_()
        if self._poisoned:  # the mark missed this round (it had closed): carry it to the next,
            self._acc[self._n + self.rank] = -1.0  # published now, as the round may fire without us
            self._wa.publish()
        self._done = 0
        self._closed_early = False
        for p in self._params:
            p.grad = None
        self._stats.steps += 1
        self._stats.averages += 1
        self._stats.info = info
        self._stats.staleness = int(info.staleness)
        self._stats.extra = {**dataclasses.asdict(result),
                             **{k: v for k, v in self._stats.extra.items() if k.startswith("nonfinite")}}
        return loss

    def _close(self) -> None:
        self._wa.close()
