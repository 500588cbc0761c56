"""Allreduce-SGD: average the gradients over all ranks before every local step (what DDP does)."""
from __future__ import annotations

import time
from typing import Iterable

import torch
from mpi4py import MPI

from wagma_rl.job.deadline import DEFAULT_TIMEOUT

from .base import DistributedOptimizer
from .finite import NonFiniteError, is_finite
from .flat import FlatBuffer, pack_grads, unpack_grads

__all__ = ["AllreduceSGD"]


class AllreduceSGD(DistributedOptimizer):
    """Synchronous data parallelism: every ``step()`` averages gradients, then steps locally.

    ``reduce_gradients()`` before ``step()`` averages earlier, so a gradient clip in between
    clips the averaged gradient (as DDP + ``clip_grad_norm_``); that step then does not average.

    With equal-sized local batches and a mean loss, the result equals one process training on the
    union of the ranks' batches. Floating-point ``buffers`` are averaged at every step as well.

    Args:
        optimizer: the wrapped ``torch.optim.Optimizer``.
        comm: communicator (default ``MPI.COMM_WORLD``).
        buffers: module buffers to average with the gradients (e.g. BatchNorm statistics).
        timeout: seconds a step may wait for the slowest rank (then ``PeerTimeout`` names it).
        nonfinite: ``"raise"`` (every rank raises ``NonFiniteError`` when a rank's gradients hold
            NaN/inf, before any step) or ``"drop"`` (average the finite ranks' gradients only).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, comm: MPI.Comm | None = None,
                 buffers: Iterable[torch.Tensor] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 nonfinite: str = "raise"):
        super().__init__(optimizer, comm=comm, buffers=buffers, views=False, timeout=timeout,
                         nonfinite=nonfinite)
        n_grad = sum(p.numel() for p in self._params)
        # The buffers alone, so a step does not copy the parameters just to reach them.
        self._buf_flat = FlatBuffer(self._buffers, views=False) if self._buffers else None
        n_buf = self._buf_flat.numel if self._buf_flat else 0
        # [gradients | buffers | one "had a gradient" flag per parameter | one "non-finite" flag
        # per rank]: one allreduce moves the data and the verdict on it.
        self._grad = torch.zeros(n_grad + n_buf + len(self._params) + self.world_size,
                                 dtype=torch.float32)
        self._n_grad, self._n_buf = n_grad, n_buf
        self._reduced = False  # reduce_gradients() averaged; the next step() must not again

    def reduce_gradients(self) -> None:
        """Average the gradients over all ranks now; the next :meth:`step` applies them without
        averaging again (call order: backward, ``reduce_gradients()``, clip, ``step()``)."""
        if self._reduced:
            raise RuntimeError("AllreduceSGD.reduce_gradients() was called twice before step(); "
                               "call it once after backward()")
        self._check_step()
        self._average_gradients()
        self._reduced = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients; averaged ones not yet applied are dropped with them."""
        self._reduced = False
        super().zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """Average the gradients over all ranks (unless :meth:`reduce_gradients` just did), then
        run the wrapped optimizer's step."""
        if self._reduced:
            if closure is not None:
                raise ValueError("AllreduceSGD.step(closure) after reduce_gradients(): the closure "
                                 "would replace the averaged gradients; pass no closure")
            loss = None
        else:
            loss = self._run_closure(closure)
            self._check_step()
            self._average_gradients()
        self._reduced = False
        self.optimizer.step()
        self._stats.steps += 1
        return loss

    def _average_gradients(self) -> None:
        n, nb = self._n_grad, self._n_buf
        has = pack_grads(self._params, self._grad[:n])
        if nb:
            self._buf_flat.gather()
            self._grad[n:n + nb].copy_(self._buf_flat.flat)
        npar = len(self._params)
        self._grad[n + nb:n + nb + npar] = torch.tensor(has, dtype=torch.float32)
        status = self._grad[n + nb + npar:]
        status.zero_()
        if not is_finite(self._grad[: n + nb]):
            # Contribute nothing but the flag, so the sum stays finite on every rank.
            self._grad[: n + nb].zero_()
            status[self.rank] = 1.0
        t0 = time.perf_counter()
        if self.world_size > 1:
            self._deadline.allreduce(self._grad.numpy(), what="gradient allreduce")
        self._record_comm(time.perf_counter() - t0)
        bad = tuple(int(r) for r in torch.nonzero(status > 0.5).flatten().tolist())
        if bad and (self.nonfinite == "raise" or len(bad) == self.world_size):
            raise NonFiniteError(bad, self._stats.steps, "gradients")
        self._note_dropped(bad)
        self._grad[: n + nb] /= self.world_size - len(bad)
        # A parameter nobody computed a gradient for keeps grad None, as in single-process training.
        unpack_grads(self._grad[:n], self._params, keep=(self._grad[n + nb:n + nb + npar] > 0).tolist())
        if nb:
            self._buf_flat.flat.copy_(self._grad[n:n + nb])
            self._buf_flat.scatter()
        self._stats.averages += 1
