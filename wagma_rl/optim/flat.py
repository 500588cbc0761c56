"""One flat float32 host buffer over a list of tensors (model parameters and buffers), and the
device<->host copies that fill and empty it.

Every collective in :mod:`wagma_rl.optim` moves a single contiguous float32 CPU buffer, because
that is what MPI and ``native_coll`` take. Two ways to keep it in step with the model:

* ``"view"``: the tensors become views into the flat buffer (``t.data = flat[a:b].view_as(t)``),
  so averaging the buffer averages the model in place and :meth:`FlatBuffer.gather` /
  :meth:`FlatBuffer.scatter` cost nothing. Needs every tensor to be a dense float32 CPU tensor.
* ``"pack"``: the tensors are copied into the buffer before a collective and back after it. Used
  for GPU tensors and other dtypes.

GPU tensors (torch DDP's reducer is the model): the host buffer is pinned, and every copy runs on
one side CUDA stream per device (:class:`DeviceCopies`), ordered by CUDA events, never by a
device-wide synchronize:

* device -> host: the side stream waits for the compute stream (the values were written there),
  copies, records an event; the host waits for that event only, right before MPI reads the buffer.
* host -> device: the side stream copies and records an event; the compute stream waits for it
  (kernels queued next see the new values) and the host does not wait at all.
* the host buffer is written again only after the last host -> device copy out of it has read it:
  a copy to the host is queued behind it on the same stream (waiting for that copy's event covers
  it), and a host write without one first calls :meth:`DeviceCopies.host_writable` (an event wait,
  free in steady state, where a forward and a backward pass ran since).

That one stream gives the ordering a second ("double") host buffer would: the next copy to the
host never waits on the host for the previous copy to the device, and no host memcpy into a spare
buffer is paid. On cpu the same calls are plain ``copy_`` and the stream and event parts are
no-ops, so behaviour and speed there are as before.

``benchmarks/optim_flat.py`` measures what the copies cost.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import torch

__all__ = ["FlatBuffer", "DeviceCopies", "copies_for", "to_host", "to_device", "host_writable",
           "pack_grads", "unpack_grads"]


class DeviceCopies:
    """Copies between host memory and one device, ordered by events on a side stream (CUDA) or
    plain synchronous copies (cpu and any other device).

    Use :func:`copies_for` to get the shared one of a device.
    """

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._to_device_done = None  # event after the last host -> device copies

    def to_host(self, pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]):
        """Queue ``dst.copy_(src)`` for each ``(host dst, device src)``; returns the event that
        marks them done (``None`` on cpu, where they are done already). Pass it to :meth:`wait`
        before the host reads ``dst``."""
        if not self.cuda:
            with torch.no_grad():
                for dst, src in pairs:
                    dst.copy_(src)
            return None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad(), torch.cuda.stream(self.stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
                src.record_stream(self.stream)  # the allocator keeps src until the copy ran
            event = torch.cuda.Event()
            event.record(self.stream)
        # (The last copy to the device stays the guard of host writes: this copy's event may not
        # have been waited for when the host next writes.)
        return event

    def to_device(self, pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Queue ``dst.copy_(src)`` for each ``(device dst, host src)``; work queued afterwards on
        the current stream sees the new values, and the host does not wait."""
        if not self.cuda:
            with torch.no_grad():
                for dst, src in pairs:
                    dst.copy_(src)
            return
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)  # kernels queued before may still read the old values
        with torch.no_grad(), torch.cuda.stream(self.stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
                dst.record_stream(self.stream)
            event = torch.cuda.Event()
            event.record(self.stream)
        compute.wait_event(event)
        self._to_device_done = event

    @staticmethod
    def wait(event) -> None:
        """Wait on the host for one event from :meth:`to_host` (``None``: nothing to wait for)."""
        if event is not None:
            event.synchronize()

    @staticmethod
    def ready(event) -> bool:
        """Whether the copies behind ``event`` are done, without waiting."""
        return event is None or bool(event.query())

    def host_writable(self) -> None:
        """Wait on the host until the last host -> device copies have read their host memory, so
        the host may write it (no-op on cpu; an event wait that returns at once once they ran)."""
        if self._to_device_done is not None:
            self._to_device_done.synchronize()
            self._to_device_done = None


_COPIES: dict[torch.device, DeviceCopies] = {}


def copies_for(device: torch.device | str) -> DeviceCopies:
    """The :class:`DeviceCopies` of ``device`` (one side stream per device, shared by every buffer,
    so all copies of a device are ordered with each other)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _COPIES:
        _COPIES[device] = DeviceCopies(device)
    return _COPIES[device]


def _by_device(pairs, tensor_of) -> dict[torch.device, list]:
    groups: dict[torch.device, list] = {}
    for pair in pairs:
        groups.setdefault(tensor_of(pair).device, []).append(pair)
    return groups


def host_writable(tensors: Iterable[torch.Tensor]) -> None:
    """:meth:`DeviceCopies.host_writable` for every device among ``tensors``."""
    for device in {t.device for t in tensors if t.device.type != "cpu"}:
        copies_for(device).host_writable()


def to_host(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy each ``(host dst, src)`` and return when the host may read every ``dst``."""
    for device, group in _by_device(pairs, lambda pr: pr[1]).items():
        DeviceCopies.wait(copies_for(device).to_host(group))


def to_device(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy each ``(dst, host src)``; later work on the current stream sees the new values."""
    for device, group in _by_device(pairs, lambda pr: pr[0]).items():
        copies_for(device).to_device(group)


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

    def _slices(self):
        return zip(self.tensors, self.offsets[:-1], self.offsets[1:])

    def gather(self, *, wait: bool = True):
        """Copy the tensors into the buffer (no-op in view mode); on return the host may read and
        write it (GPU tensors: after their copies, not the whole device, are done).

        ``wait=False`` only queues the copies and returns their events (one per device; ``None``
        where done already): pass each to :meth:`DeviceCopies.wait` before the host reads."""
        pairs = [] if self.mode == "view" else [(self.flat[a:b], t.detach().reshape(-1))
                                                for t, a, b in self._slices()]
        if wait:
            to_host(pairs)
            return None
        return [copies_for(device).to_host(group)
                for device, group in _by_device(pairs, lambda pr: pr[1]).items()]

    def scatter(self, *, count: int | None = None) -> None:
        """Copy the buffer back into the tensors (no-op in view mode); ``count``: into the first
        ``count`` tensors only. GPU tensors: queued on the side stream; the current stream's next
        kernels see the new values, the host goes on."""
        if self.mode == "view":
            return
        to_device([(t, self.flat[a:b].view(t.shape)) for t, a, b in list(self._slices())[:count]])

    def host_writable(self) -> None:
        """Wait until the last :meth:`scatter` has read the buffer, so the host may write it
        without a :meth:`gather` first (no-op on cpu)."""
        if self._on_gpu:
            host_writable(self.tensors)

    def intact(self) -> bool:
        """False when a mirrored tensor no longer views the buffer (its ``.data`` was replaced)."""
        if self.mode != "view":
            return True
        return all(t.data_ptr() == p for t, p in zip(self.tensors, self._ptrs))


def pack_grads(params: Sequence[torch.Tensor], out: torch.Tensor) -> list[bool]:
    """Write the gradients of ``params`` into the flat float32 tensor ``out`` (on the host, or on
    the gradients' device: AllreduceSGD's mapped buffer of ``exchange="node"``).

    A parameter without a gradient contributes zeros. Returns, per parameter, whether it had one.
    GPU gradients go through :func:`to_host` (pin a host ``out`` for speed); on return ``out``
    holds them.
    """
    has, copies = [], []
    offset = 0
    host_writable(params)  # ``out`` may still feed a copy to the device (zeros are host writes)
    with torch.no_grad():
        for p in params:
            n = p.numel()
            if p.grad is None:
                out[offset:offset + n].zero_()
                has.append(False)
            else:
                copies.append((out[offset:offset + n], p.grad.detach().reshape(-1)))
                has.append(True)
            offset += n
    to_host(copies)
    return has


def unpack_grads(src: torch.Tensor, params: Sequence[torch.Tensor],
                 keep: Iterable[bool] | None = None) -> None:
    """Set each parameter's gradient from the flat float32 host tensor ``src``.

    ``keep[i]`` False sets parameter ``i``'s gradient to ``None`` instead (nobody had one).
    GPU gradients are written through :func:`to_device`: the host goes on at once, and must not
    write ``src`` before :func:`host_writable` (or a :func:`pack_grads` into it).
    """
    keep = [True] * len(params) if keep is None else list(keep)
    offset, copies = 0, []
    with torch.no_grad():
        for p, k in zip(params, keep):
            n = p.numel()
            if not k:
                p.grad = None
            else:
                if p.grad is None or p.grad.shape != p.shape:
                    p.grad = torch.empty_like(p)
                copies.append((p.grad, src[offset:offset + n].view(p.shape)))
            offset += n
    to_device(copies)
