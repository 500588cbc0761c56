"""One flat float32 host buffer over a list of tensors (model parameters and buffers).

Every collective in :mod:`wagma_rl.optim` moves a single contiguous float32 CPU buffer, because
that is what MPI and ``native_coll`` take. Two ways to keep it in step with the model:

* ``"view"``: the tensors become views into the flat buffer (``t.data = flat[a:b].view_as(t)``),
  so averaging the buffer averages the model in place and :meth:`FlatBuffer.gather` /
  :meth:`FlatBuffer.scatter` cost nothing. Needs every tensor to be a dense float32 CPU tensor.
* ``"pack"``: the tensors are copied into the buffer before a collective and back after it. Used
  for GPU tensors (staged through pinned host memory) and other dtypes.

``benchmarks/optim_flat.py`` measures what the copies cost.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import torch

__all__ = ["FlatBuffer", "pack_grads", "unpack_grads"]


class FlatBuffer:
    """A contiguous float32 host buffer that mirrors ``tensors``.

    Args:
        tensors: the tensors to mirror, in a fixed order (the same order on every rank).
        views: ``True`` to make the tensors views into the buffer (falls back to packing when a
            tensor is not a dense float32 CPU tensor), ``False`` to always pack.
        extra: number of additional float32 slots after the tensors (scratch for counters).
    """

    def __init__(self, tensors: Sequence[torch.Tensor], *, views: bool = True, extra: int = 0):
        self.tensors = list(tensors)
        self.sizes = [t.numel() for t in self.tensors]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes, dtype=np.int64)]).tolist()
        self.numel = int(self.offsets[-1])
        self.extra = int(extra)
        on_gpu = any(t.device.type != "cpu" for t in self.tensors)
        can_view = all(t.device.type == "cpu" and t.dtype == torch.float32 and not t.is_sparse
                       for t in self.tensors)
        self.mode = "view" if (views and can_view) else "pack"
        # Pinned memory makes the device<->host copies of GPU tensors asynchronous and fast.
        self.flat = torch.zeros(self.numel + self.extra, dtype=torch.float32,
                                pin_memory=on_gpu and torch.cuda.is_available())
        self._on_gpu = on_gpu
        if self.mode == "view":
            with torch.no_grad():
                for t, a, b in zip(self.tensors, self.offsets[:-1], self.offsets[1:]):
                    view = self.flat[a:b].view_as(t)
                    view.copy_(t)
                    t.data = view
            self._ptrs = [t.data_ptr() for t in self.tensors]
        else:
            self.gather()

    @property
    def array(self) -> np.ndarray:
        """The buffer as a numpy array sharing its memory."""
        return self.flat.numpy()

    @property
    def body(self) -> torch.Tensor:
        """The part of the buffer that mirrors the tensors (without the extra slots)."""
        return self.flat[: self.numel]

    def gather(self) -> None:
        """Copy the tensors into the buffer (no-op in view mode)."""
        if self.mode == "view":
            return
        with torch.no_grad():
            for t, a, b in zip(self.tensors, self.offsets[:-1], self.offsets[1:]):
                self.flat[a:b].copy_(t.detach().reshape(-1), non_blocking=self._on_gpu)
        if self._on_gpu:
            torch.cuda.synchronize()

    def scatter(self) -> None:
        """Copy the buffer back into the tensors (no-op in view mode)."""
        if self.mode == "view":
            return
        with torch.no_grad():
            for t, a, b in zip(self.tensors, self.offsets[:-1], self.offsets[1:]):
                t.copy_(self.flat[a:b].view(t.shape), non_blocking=self._on_gpu)
        if self._on_gpu:
            # The next gather overwrites the pinned buffer, so the copies must have finished.
            torch.cuda.synchronize()

    def intact(self) -> bool:
        """False when a mirrored tensor no longer views the buffer (its ``.data`` was replaced)."""
        if self.mode != "view":
            return True
        return all(t.data_ptr() == p for t, p in zip(self.tensors, self._ptrs))


def pack_grads(params: Sequence[torch.Tensor], out: torch.Tensor) -> list[bool]:
    """Write the gradients of ``params`` into the flat float32 tensor ``out``.

    A parameter without a gradient contributes zeros. Returns, per parameter, whether it had one.
    """
    has = []
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            if p.grad is None:
                out[offset:offset + n].zero_()
                has.append(False)
            else:
                out[offset:offset + n].copy_(p.grad.detach().reshape(-1))
                has.append(True)
            offset += n
    if any(p.grad is not None and p.grad.device.type == "cuda" for p in params):
        torch.cuda.synchronize()
    return has


def unpack_grads(src: torch.Tensor, params: Sequence[torch.Tensor],
                 keep: Iterable[bool] | None = None) -> None:
    """Set each parameter's gradient from the flat float32 tensor ``src``.

    ``keep[i]`` False sets parameter ``i``'s gradient to ``None`` instead (nobody had one).
    """
    keep = [True] * len(params) if keep is None else list(keep)
    offset = 0
    with torch.no_grad():
        for p, k in zip(params, keep):
            n = p.numel()
            if not k:
                p.grad = None
            else:
                g = src[offset:offset + n].view(p.shape)
                if p.grad is None or p.grad.shape != p.shape:
                    p.grad = torch.empty_like(p)
                p.grad.copy_(g)
            offset += n
