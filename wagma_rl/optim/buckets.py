"""Gradients in backward-order buckets, copied to a host buffer while the backward pass runs.

torch DDP's reducer is the model. The parameters are laid out in the order backward produces
their gradients (the reverse of the parameters' order) and cut into buckets of about
``bucket_bytes``. A ``register_post_accumulate_grad_hook`` on each parameter counts it in its
bucket; once a bucket is complete its gradients are copied into the host buffer (GPU: on
:mod:`.flat`'s side stream, ordered by an event) and the owner is told, so it can start that
bucket's communication while the rest of the backward pass runs. At the step :meth:`GradBuckets.finish`
copies what the hooks left and says whether any gradient changed after its bucket was copied (a
second backward, an in-place clip): the owner then falls back to its plain path.

Used by :class:`~wagma_rl.optim.AllreduceSGD` (each bucket's ``Iallreduce`` starts when it is
copied) and :class:`~wagma_rl.optim.NonBlockingSGD` (each micro-batch's gradients reach the host
bucket by bucket during its backward pass).
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, Sequence

import torch

from .flat import DeviceCopies, copies_for, pack_grads, to_host

__all__ = ["GradBuckets", "DEFAULT_BUCKET_BYTES", "check_bucket_bytes", "default_bucket_bytes",
           "plan_buckets"]

#: torch DDP's default (``bucket_cap_mb=25``): large enough that MPI moves each bucket near its
#: full bandwidth (shared memory and InfiniBand reach it from a few MiB), small enough that
#: ResNet-50's 94 MiB of gradients make four buckets, three of which leave during backward.
#: ``benchmarks/optim_gpu.py --bucket-mb`` measures other sizes.
DEFAULT_BUCKET_BYTES = 25 * 2**20


def check_bucket_bytes(owner: str, bucket_bytes) -> None:
    """Raise a one-line ``ValueError`` unless ``bucket_bytes`` is None or an integer >= 0."""
    if bucket_bytes is not None and (isinstance(bucket_bytes, bool) or
                                     not isinstance(bucket_bytes, int) or bucket_bytes < 0):
        raise ValueError(f"{owner} bucket_bytes must be a non-negative integer (bytes; 0 "
                         f"for no buckets) or None, got {bucket_bytes!r}")


def default_bucket_bytes(params: Sequence[torch.Tensor]) -> int:
    """:data:`DEFAULT_BUCKET_BYTES` for GPU parameters; 0 (no buckets) for cpu ones, where the
    backward pass and MPI share the cores and MPI moves data only inside MPI calls, so an overlap
    gains nothing and the cpu path stays as it was."""
    return DEFAULT_BUCKET_BYTES if any(p.device.type == "cuda" for p in params) else 0


def plan_buckets(order: Sequence[torch.Tensor], bucket_bytes: int) -> list[tuple[int, int, int, int]]:
    """``(first, end)`` indices into ``order`` and ``(a, b)`` element offsets into the flat
    gradient layout, per bucket: consecutive parameters until a bucket reaches ``bucket_bytes``
    (float32 bytes; the last bucket takes what is left)."""
    buckets, first, a, size, offset = [], 0, 0, 0, 0
    for i, p in enumerate(order):
        size += p.numel() * 4
        offset += p.numel()
        if size >= bucket_bytes or i == len(order) - 1:
            buckets.append((first, i + 1, a, offset))
            first, a, size = i + 1, offset, 0
    return buckets


def _weak(fn):
    """A callable returning ``fn`` (None for no ``fn``, or a bound method whose object is gone)."""
    if fn is None:
        return lambda: None
    if hasattr(fn, "__self__"):
        return weakref.WeakMethod(fn)
    return lambda: fn


class GradBuckets:
    """Backward-order buckets of ``order``'s gradients, copied into ``host`` as they complete.

    Args:
        order: the parameters in backward order; ``host[:sum(numel)]`` holds their gradients in
            that order.
        host: flat float32 host tensor (pinned for GPU gradients).
        bucket_bytes: bytes per bucket (> 0).
        active: called by each hook; False ignores the gradient (``no_sync()``, a gradient that
            was already averaged).
        on_grad: called after each gradient the hook counted, with its bucket's index (that
            bucket's entry in :attr:`copied` is set once its copy was queued), on the thread
            that runs backward.

    Round state (reset by :meth:`new_round`): :attr:`copied` per bucket is False (not copied),
    a copy's event (GPU, pending) or None (done).
    """

    def __init__(self, order: Sequence[torch.Tensor], host: torch.Tensor, bucket_bytes: int, *,
                 active: Callable[[], bool] = lambda: True,
                 on_grad: Callable[[int], None] | None = None):
        self.order = list(order)
        self.host = host
        self.buckets = plan_buckets(self.order, bucket_bytes)
        self.offsets = [0]
        for p in self.order:
            self.offsets.append(self.offsets[-1] + p.numel())
        self._bucket_of = {id(p): b for b, (i, j, _, _) in enumerate(self.buckets)
                           for p in self.order[i:j]}
        # Bound methods are held weakly, so the buckets never keep their owner alive.
        self._active, self._on_grad = _weak(active), _weak(on_grad)
        self.cond = threading.Condition()  # guards ``copied`` for a thread that consumes it
        # Through a weak reference: buckets dropped without close() are collected, and their
        # hooks then do nothing (they never keep the owner, or its communicators, alive).
        ref = weakref.ref(self)

        def grad_ready(p: torch.Tensor) -> None:
            me = ref()
            if me is not None:
                me._grad_ready(p)

        self._hooks = [p.register_post_accumulate_grad_hook(grad_ready) for p in self.order]
        self.new_round()

    def __len__(self) -> int:
        return len(self.buckets)

    def new_round(self) -> None:
        """Forget the last round: no bucket is filled or copied."""
        nb = len(self.buckets)
        self._filled = [0] * nb         # parameters of the bucket whose gradient is final
        self.copied: list = [False] * nb
        self._seen: dict[int, tuple[int, int]] = {}  # id(param) -> (id(grad), grad._version)
        self.changed = False            # a gradient changed after its bucket was copied

    def _grad_ready(self, p: torch.Tensor) -> None:
        """Post-accumulate-grad hook: count ``p`` in its bucket; copy the bucket once complete."""
        active = self._active()
        if active is None or not active():
            return
        if id(p) in self._seen or p.grad is None or p.grad.is_sparse:
            self.changed = True  # a second backward before the step: the copies are stale
            return
        self._seen[id(p)] = (id(p.grad), p.grad._version)
        b = self._bucket_of[id(p)]
        self._filled[b] += 1
        first, end, _, _ = self.buckets[b]
        if self._filled[b] == end - first:
            event = self._copy(b)
            with self.cond:
                self.copied[b] = event
                self.cond.notify_all()
        on_grad = self._on_grad()
        if on_grad is not None:
            on_grad(b)

    def _copy(self, b: int):
        """Queue the copy of bucket ``b``'s gradients into the host buffer; returns its event."""
        first, end, _, _ = self.buckets[b]
        params = self.order[first:end]
        # No host wait: the copy queues behind the last copy out of this memory on the same stream.
        devices = {p.grad.device for p in params}
        pairs = [(self.host[self.offsets[i]:self.offsets[i + 1]], p.grad.detach().reshape(-1))
                 for i, p in zip(range(first, end), params)]
        if len(devices) == 1:
            return copies_for(devices.pop()).to_host(pairs)
        to_host(pairs)  # a bucket over several devices: copied and waited for here
        return None

    def ready(self, b: int) -> bool:
        """Whether bucket ``b`` is copied and its copy done (the host may read it)."""
        event = self.copied[b]
        return event is not False and DeviceCopies.ready(event)

    def finish(self) -> bool:
        """At the step: copy the buckets the hooks left (and wait for nothing yet); return
        whether any gradient no longer matches what its bucket copied (changed or replaced)."""
        for b, (first, end, a, z) in enumerate(self.buckets):
            if self.copied[b] is False:
                params = self.order[first:end]
                for p in params:  # these gradients are read now: the step applies them
                    if p.grad is not None:
                        self._seen[id(p)] = (id(p.grad), p.grad._version)
                pack_grads(params, self.host[a:z])
                self.copied[b] = None
        for p in self.order:
            now = None if p.grad is None else (id(p.grad), p.grad._version)
            if self._seen.get(id(p)) != now:
                self.changed = True
        return self.changed

    def wait(self) -> None:
        """Wait on the host for every bucket's copy (after :meth:`finish`)."""
        for event in self.copied:
            if event is not False:
                DeviceCopies.wait(event)

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
