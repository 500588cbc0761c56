"""A model average that runs on a thread while the next forward and backward pass compute.

The model-averaging optimizers (WAGMA, LocalSGD, DPSGD) with ``background=True``: the step
copies the new model out into the flat buffer (GPU: queued on :mod:`.flat`'s side stream; the
thread, not the training loop, waits for the copy), starts the exchange on a thread and returns.
The next ``step()`` joins it first and puts the average into the parameters before it writes
them. Between the two the parameters still hold the contributed model, so the next gradient is
computed there: the average arrives one forward and backward pass late, and nothing else
changes (see docs/optimizers.md, "Model averaging in the background").

Parameters must not be written while the average is in flight (the average would overwrite the
write): the join refuses, in one line, a parameter whose version counter moved. Buffers
(BatchNorm running statistics, which the forward pass updates) take the late rule ``apply``:
``buffer now + (average - buffer contributed)``, so a forward pass's update is kept on top.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import torch

from .flat import DeviceCopies, FlatBuffer, to_device

__all__ = ["BackgroundAverage", "check_background"]


def check_background(owner: str, background) -> None:
    """Raise a one-line ``ValueError`` unless ``background`` is a bool."""
    if not isinstance(background, bool):
        raise ValueError(f"{owner} background must be True or False, got {background!r}")


def _mark(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t._version


class BackgroundAverage:
    """One average of ``flat`` running on a thread: :meth:`join` waits for it, :meth:`scatter` puts
    it into the model.

    Args:
        flat: the optimizer's flat buffer, already queued to be filled (``gather(wait=False)``).
        events: the copy-out's events (GPU; None entries on cpu), waited for on the thread.
        n_params: how many of ``flat.tensors`` are parameters (the rest are buffers).
        exchange: the average of ``flat`` in place; returns ``(result, seconds)``. Runs on the
            thread and must touch only ``flat`` and the optimizer's communicators.
        rank: for the error message.
    """

    def __init__(self, flat: FlatBuffer, events, *, n_params: int,
                 exchange: Callable[[], tuple[object, float]], rank: int):
        self._flat, self._n_params, self._rank = flat, n_params, rank
        self._marks = [_mark(t) for t in flat.tensors[:n_params]]
        self._snapshot = None  # the buffers' contributed values (set on the thread)
        self._result = self._error = None
        self._seconds = 0.0
        self._thread = threading.Thread(target=self._run, args=(list(events), exchange),
                                        daemon=True, name="background model average")
        self._thread.start()

    def _run(self, events, exchange) -> None:
        try:
            for event in events:
                DeviceCopies.wait(event)
            a = self._flat.offsets[self._n_params]
            if a < self._flat.numel:
                self._snapshot = self._flat.flat[a:self._flat.numel].clone()
            self._result, self._seconds = exchange()
        except BaseException as exc:  # raised again by join(), on the training thread
            self._error = exc

    def join(self) -> tuple[object, float, float]:
        """Wait for the average and refuse a parameter written meanwhile. Returns ``(result,
        exchange seconds, seconds waited)``; then :meth:`scatter` puts the average in place."""
        t0 = time.perf_counter()
        self._thread.join()
        waited = time.perf_counter() - t0
        if self._error is not None:
            raise self._error
        for i, (t, mark) in enumerate(zip(self._flat.tensors[:self._n_params], self._marks)):
            if _mark(t) != mark:
                raise RuntimeError(
                    f"rank {self._rank}: parameter {i} was written while its background average "
                    "was in flight (after step(), before the next step()); call "
                    "opt.wait_average() before changing parameters between steps")
        return self._result, self._seconds, waited

    def scatter(self) -> None:
        """The average into the parameters, and the late rule apply into the buffers: each
        becomes ``now + (average - contributed)``, so the forward passes' updates made while the
        average was in flight stay on top (bitwise where the average left a value as it was).
        Buffers are always treated so: BatchNorm updates its running statistics without moving
        their version counters. No host wait on GPUs (the change is added on the device)."""
        flat, n = self._flat, self._n_params
        flat.scatter(count=n)
        s = flat.offsets[n]
        if s == flat.numel:
            return
        change = flat.flat[s:flat.numel] - self._snapshot
        copies = []
        for t, a, b in zip(flat.tensors[n:], flat.offsets[n:-1], flat.offsets[n + 1:]):
            part = change[a - s:b - s].view(t.shape)
            copies.append((torch.empty(t.shape, dtype=t.dtype, device=t.device), part))
        to_device(copies)
        with torch.no_grad():
            for t, (dev, _) in zip(flat.tensors[n:], copies):
                t.add_(dev)
