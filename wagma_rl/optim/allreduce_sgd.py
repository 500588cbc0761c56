"""Allreduce-SGD: average the gradients over all ranks before every local step (what DDP does)."""
from __future__ import annotations

import time
from typing import Iterable

import torch
from mpi4py import MPI

from .base import DistributedOptimizer
from .flat import FlatBuffer, pack_grads, unpack_grads

__all__ = ["AllreduceSGD"]


class AllreduceSGD(DistributedOptimizer):
    """Synchronous data parallelism: every ``step()`` averages gradients, then steps locally.

    With equal-sized local batches and a mean loss, the result equals one process training on the
    union of the ranks' batches. Floating-point ``buffers`` are averaged at every step as well.

    Args:
        optimizer: the wrapped ``torch.optim.Optimizer``.
        comm: communicator (default ``MPI.COMM_WORLD``).
        buffers: module buffers to average with the gradients (e.g. BatchNorm statistics).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, comm: MPI.Comm | None = None,
                 buffers: Iterable[torch.Tensor] | None = None):
        super().__init__(optimizer, comm=comm, buffers=buffers, views=False)
        n_grad = sum(p.numel() for p in self._params)
        # The buffers alone, so a step does not copy the parameters just to reach them.
        self._buf_flat = FlatBuffer(self._buffers, views=False) if self._buffers else None
        n_buf = self._buf_flat.numel if self._buf_flat else 0
        # [gradients | buffers | one "had a gradient" flag per parameter]
        self._grad = torch.zeros(n_grad + n_buf + len(self._params), dtype=torch.float32)
        self._n_grad, self._n_buf = n_grad, n_buf

    def step(self, closure=None):
        """Average the gradients over all ranks, then run the wrapped optimizer's step."""
        loss = self._run_closure(closure)
        self._check_step()
        n, nb = self._n_grad, self._n_buf
        has = pack_grads(self._params, self._grad[:n])
        if nb:
            self._buf_flat.gather()
            self._grad[n:n + nb].copy_(self._buf_flat.flat)
        self._grad[n + nb:] = torch.tensor(has, dtype=torch.float32)
        t0 = time.perf_counter()
        arr = self._grad.numpy()
        if self.world_size > 1:
            self.comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM)
        self._record_comm(time.perf_counter() - t0)
        self._grad[: n + nb] /= self.world_size
        # A parameter nobody computed a gradient for keeps grad None, as in single-process training.
        unpack_grads(self._grad[:n], self._params, keep=(self._grad[n + nb:] > 0).tolist())
        if nb:
            self._buf_flat.flat.copy_(self._grad[n:n + nb])
            self._buf_flat.scatter()
        self.optimizer.step()
        self._stats.steps += 1
        self._stats.averages += 1
        return loss
