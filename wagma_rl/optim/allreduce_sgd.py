"""Allreduce-SGD: average the gradients over all ranks before every local step (what DDP does).

The average overlaps the backward pass as torch DDP's reducer does: the gradients are laid out in
buckets of about ``bucket_bytes``, in the order backward produces them (the reverse of the
parameters' order), and a hook on each parameter (``register_post_accumulate_grad_hook``) starts
a bucket's non-blocking ``Iallreduce`` as soon as its last gradient is accumulated (buckets start
in index order on every rank, so the collectives match). GPU gradients go to the host through
:mod:`.flat`'s side stream; a bucket starts once its copy's event has completed. The step then
waits only for what is still in flight, and reduces one small tail: [buffers | had-a-gradient
flags | one non-finite flag per rank | one "gradients changed after their bucket left" flag per
rank]. When a flag is set anywhere (NaN or inf, a second backward or an in-place change such as a
clip before ``step()``, no ``no_sync()``), every rank discards the buckets and averages the
current gradients in one plain allreduce, exactly as ``bucket_bytes=0`` does: correctness first,
the rare case pays one more allreduce.

``exchange="node"`` sums the gradients after the backward pass through buffers the ranks of a node
map from each other (:mod:`.node_sum`: an MPI shared window on cpu, CUDA IPC on a GPU), so GPU
gradients never leave the device on one node (across nodes each rank sends its chunk of the node's
sum by MPI); the tail still goes through MPI.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterable

import torch
from mpi4py import MPI

from native_coll.polling import poll_until
from wagma_rl.bounded_comm import DEFAULT_TIMEOUT

from .base import DistributedOptimizer
from .buckets import DEFAULT_BUCKET_BYTES, GradBuckets, check_bucket_bytes, default_bucket_bytes
from .finite import NonFiniteError, is_finite
from .flat import DeviceCopies, FlatBuffer, pack_grads, unpack_grads
from .node_sum import NodeSum, wants_node

__all__ = ["AllreduceSGD", "DEFAULT_BUCKET_BYTES"]


class AllreduceSGD(DistributedOptimizer):
    """Synchronous data parallelism: every ``step()`` averages gradients, then steps locally.

    ``reduce_gradients()`` before ``step()`` averages earlier, so a gradient clip in between
    clips the averaged gradient (as DDP + ``clip_grad_norm_``); that step then does not average.

    With equal-sized local batches and a mean loss, the result equals one process training on the
    union of the ranks' batches. Floating-point ``buffers`` are averaged at every step as well.
    The bucketed average is the plain one: the same sums of the same values (bitwise at 2 ranks;
    at 3 or more MPI may add a bucket in another order than the whole, a float rounding apart).

    Args:
        optimizer: the wrapped ``torch.optim.Optimizer``.
        comm: communicator (default ``MPI.COMM_WORLD``).
        buffers: module buffers to average with the gradients (e.g. BatchNorm statistics).
        timeout: seconds a step may wait for the slowest rank (then ``PeerTimeout`` names it).
        nonfinite: ``"raise"`` (every rank raises ``NonFiniteError`` when a rank's gradients hold
            NaN/inf, before any step) or ``"drop"`` (average the finite ranks' gradients only).
        bucket_bytes: gradient bytes per bucket averaged during the backward pass; 0 averages
            everything in one allreduce at the step. Default (None): :data:`DEFAULT_BUCKET_BYTES`
            for GPU parameters, 0 for cpu ones, where the backward pass and MPI share the cores
            and MPI moves data only inside MPI calls, so an overlap gains nothing and the cpu
            path stays as it was. A parameter without a gradient holds its bucket and the later
            ones until the step.
        exchange: how the gradients move between ranks. ``"mpi"``: MPI's allreduce of a host
            copy (GPU gradients go to the host and back). ``"node"``: every rank maps the
            others' buffers and adds its share of them in place (:mod:`.node_sum`; GPU memory
            through CUDA IPC when the ranks share GPUs, an MPI shared window on cpu), after the
            backward pass in one pass (no buckets); across nodes, hierarchically (the node's sum,
            then its chunks between nodes). Needs the same number of ranks on every node and every
            parameter on one device. ``"auto"`` (default): ``"node"`` where it was measured to
            pay, i.e. the parameters on a GPU that every rank of the node shares, as many ranks
            on every node and ``bucket_bytes`` left at None (on one H200, 4 ranks: ResNet-50
            waited 4% of its step against 38% with ``"mpi"`` and buckets); otherwise, or when
            the ranks cannot map each other's GPU memory, ``"mpi"``, the same on every rank.
            :attr:`exchange` says which was taken and :attr:`exchange_note` why ``"mpi"`` was.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, comm: MPI.Comm | None = None,
                 buffers: Iterable[torch.Tensor] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 nonfinite: str = "raise", bucket_bytes: int | None = None, exchange: str = "auto"):
        check_bucket_bytes("AllreduceSGD", bucket_bytes)
        if exchange not in ("auto", "mpi", "node"):
            raise ValueError(f"AllreduceSGD exchange must be 'auto', 'mpi' or 'node', got {exchange!r}")
        params = [p for g in optimizer.param_groups for p in g["params"]]
        # "auto" tries "node" where it was measured to pay (one GPU per node's ranks); the choice
        # is confirmed or undone collectively when the buffers are mapped, below.
        auto_node = (exchange == "auto" and bucket_bytes is None and wants_node(params)
                     and (comm or MPI.COMM_WORLD).Get_size() > 1)
        node = exchange == "node" or auto_node
        if node:
            if bucket_bytes:
                raise ValueError("AllreduceSGD exchange='node' sums the gradients in one pass after "
                                 "the backward pass, without buckets: leave bucket_bytes empty or 0")
            devices = {p.device for p in params}
            if len(devices) > 1:
                raise ValueError(f"AllreduceSGD exchange='node' needs every parameter on one device, "
                                 f"found {sorted(map(str, devices))}: use exchange='mpi'")
            bucket_bytes = 0
        if bucket_bytes is None:
            bucket_bytes = default_bucket_bytes(params)
        super().__init__(optimizer, comm=comm, buffers=buffers, views=False, timeout=timeout,
                         nonfinite=nonfinite, options={"bucket_bytes": bucket_bytes,
                                                       "exchange": exchange})
        self.exchange = "node" if node else "mpi"
        """The exchange taken: ``"node"`` or ``"mpi"`` (``"auto"`` resolved)."""
        self.exchange_note = ""
        """Why ``exchange="auto"`` took ``"mpi"`` where it tried ``"node"`` (empty otherwise)."""
        self.bucket_bytes = bucket_bytes
        # Backward produces the last layers' gradients first: lay them out (and bucket them) so.
        self._order = self._params[::-1]
        n_grad = sum(p.numel() for p in self._order)
        # exchange="node": the gradients are summed in a buffer every rank maps (node_sum.py).
        self._node = None
        if self.exchange == "node" and self.world_size > 1:
            device = self._order[0].device if self._order else torch.device("cpu")
            try:
                self._node = NodeSum(self._deadline, self.comm, n_grad,
                                     device, one_device=auto_node)
            except ValueError as exc:  # refused on every rank alike, so all fall back alike
                if not auto_node:
                    raise
                self.exchange, self.exchange_note = "mpi", f"exchange='auto' took 'mpi': {exc}"
                self.bucket_bytes = self._options["bucket_bytes"] = default_bucket_bytes(params)
        # The buffers alone, so a step does not copy the parameters just to reach them.
        self._buf_flat = FlatBuffer(self._buffers, views=False) if self._buffers else None
        n_buf = self._buf_flat.numel if self._buf_flat else 0
        self._n_grad, self._n_buf, self._npar = n_grad, n_buf, len(self._order)
        on_gpu = any(p.device.type == "cuda" for p in self._order) and torch.cuda.is_available()
        # [gradients | buffers | one "had a gradient" flag per parameter | one "non-finite" flag
        # per rank | one "changed after its bucket left" flag per rank]: the plain path reduces
        # all but the last part in one allreduce; the bucketed path reduces the gradients in
        # buckets and the rest (the tail) at the step. exchange="node" sums the gradients in its
        # mapped buffers, so this buffer holds the tail only (it starts at _tail_at).
        self._tail_at = 0 if self._node is not None else n_grad
        self._grad = torch.zeros(self._tail_at + n_buf + self._npar + 2 * self.world_size,
                                 dtype=torch.float32, pin_memory=on_gpu)
        self._reduced = False  # reduce_gradients() averaged; the next step() must not again
        self._syncing = True
        self._buckets = (GradBuckets(self._order, self._grad, self.bucket_bytes,
                                     active=self._buckets_active,
                                     on_grad=self._bucket_grad)
                         if (self.bucket_bytes and self.world_size > 1) else None)
        # The buckets' own communicator: they start from hooks, at times that differ between
        # ranks, so no other collective may sit between them in one communicator's order.
        self._bucket_comm = None
        if self._buckets is not None:
            self._bucket_comm, req = self._deadline.comm.Idup()
            self._deadline.wait([req], peers=[r for r in range(self.world_size) if r != self.rank],
                                what="AllreduceSGD start-up (bucket communicator)")
        # GPU gradients: the hooks run when backward *queues* the kernels, long before the device
        # has computed them, so a bucket's copy is rarely done by the last hook. A launcher thread
        # waits for each bucket's copy event in order and starts its average then (DDP's comm
        # hook on a side stream, for a host-side MPI), and keeps MPI progressing until the step.
        self._threaded = on_gpu
        self._thread: threading.Thread | None = None
        self._new_round()

    # ------------------------------------------------------------------------- public API
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

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients without starting their average (as DDP's
        ``no_sync``); run the last micro-batch's backward outside it."""
        before, self._syncing = self._syncing, False
        try:
            yield
        finally:
            self._syncing = before

    # ------------------------------------------------------------------------- buckets
    def _buckets_active(self) -> bool:
        return self._syncing and not self._reduced

    def _bucket_grad(self, b: int) -> None:
        """After each gradient the buckets counted: start (or let the thread start) what is copied."""
        if self._threaded:
            if self._thread is None:
                self._thread = threading.Thread(target=self._launcher, daemon=True,
                                                name="AllreduceSGD buckets")
                self._thread.start()
            return
        self._start_ready()
        if self._requests:
            MPI.Request.Testall(self._requests)  # MPICH moves data only inside MPI calls

    def _new_round(self) -> None:
        if self._buckets is not None:
            self._buckets.new_round()
        self._requests: list[MPI.Request] = []  # in bucket order
        self._bad = False              # a bucket held NaN or inf
        self._closing = False          # the step takes over from the launcher thread
        self._thread_error: BaseException | None = None

    def _launcher(self) -> None:
        """Launcher thread: start the buckets in order as their copies complete, then keep MPI
        progressing, until the step takes over (``_closing``). Only sleeps or yields between
        polls, so it never holds the GIL while the device works."""
        try:
            buckets = self._buckets
            while len(self._requests) < len(buckets) and not self._closing:
                b = len(self._requests)
                if not buckets.ready(b):
                    if self._requests:
                        MPI.Request.Testall(self._requests)
                    with buckets.cond:
                        if buckets.copied[b] is False and not self._closing:
                            buckets.cond.wait(timeout=5e-5)
                    continue
                self._start_bucket(b)
            while self._requests and not self._closing and not MPI.Request.Testall(self._requests):
                time.sleep(0)
        except BaseException as exc:  # raised again by the step, on the training thread
            self._thread_error = exc

    def _join_launcher(self) -> None:
        """The step takes the buckets over from the launcher thread."""
        if self._thread is None:
            return
        with self._buckets.cond:
            self._closing = True
            self._buckets.cond.notify_all()
        self._thread.join()  # it stops at its next poll, at most one bucket's start away
        self._thread = None
        if self._thread_error is not None:
            raise self._thread_error

    def _start_ready(self, *, wait: bool = False) -> None:
        """Start, in bucket order, every bucket whose copy is done (``wait``: wait for copies)."""
        buckets = self._buckets
        while len(self._requests) < len(buckets):
            b = len(self._requests)
            if buckets.copied[b] is False or not (wait or buckets.ready(b)):
                return
            DeviceCopies.wait(buckets.copied[b])
            self._start_bucket(b)

    def _start_bucket(self, b: int) -> None:
        """Start bucket ``b``'s sum (its copy is done); note whether it holds NaN or inf."""
        _, _, a, z = self._buckets.buckets[b]
        part = self._grad[a:z]
        if not self._bad and not is_finite(part):
            self._bad = True
        self._requests.append(self._bucket_comm.Iallreduce(MPI.IN_PLACE, part.numpy(), op=MPI.SUM))

    def _wait_buckets(self) -> None:
        """Wait for the buckets in flight. Every rank has arrived (the tail's reduction came
        first), so this is a data phase: poll without sleeping, as MPI moves a large message only
        inside MPI calls (a back-off sleep between tests made a ResNet-50 step take seconds), for
        up to a second; then the bounded wait that names the ranks if a transfer stalls."""
        if poll_until(lambda: MPI.Request.Testall(self._requests), deadline=time.monotonic() + 1.0,
                      spin_s=1.0) is None:
            self._deadline.wait(self._requests, peers=[r for r in range(self.world_size) if r != self.rank],
                                what="gradient allreduce (buckets)")

    def _finish_buckets(self) -> None:
        """At the step: copy and start the buckets the hooks left, and note whether any bucket
        no longer matches the gradients (a changed or replaced gradient)."""
        self._join_launcher()
        self._stats.extra["buckets_in_backward"] = len(self._requests)
        self._changed = self._buckets.finish()
        self._start_ready(wait=True)

    # ------------------------------------------------------------------------- averaging
    def _average_gradients(self) -> None:
        if self._node is not None:
            self._average_on_node()
            return
        if self._buckets is not None and self._average_in_buckets():
            return
        self._average_plain()

    def _average_in_buckets(self) -> bool:
        """The bucketed average; False when a rank flagged trouble and the plain one must run."""
        n, nb, npar, w = self._n_grad, self._n_buf, self._npar, self.world_size
        # How many buckets left during the backward pass, for stats.extra (the overlap achieved).
        self._stats.extra["buckets"] = len(self._buckets)
        try:
            self._finish_buckets()
            # From here on the step waits for communication only (before: for the copies, i.e.
            # for the device to finish the backward pass, as the plain path's packing does).
            t0 = time.perf_counter()
            tail = self._grad[n:]
            self._fill_tail(self._bad)
            tail[nb + npar + w:].zero_()
            tail[nb + npar + w + self.rank] = float(self._changed)
            self._deadline.allreduce(tail.numpy(), what="gradient allreduce")
            self._wait_buckets()
        finally:
            self._new_round()
        if bool((tail[nb + npar:] > 0.5).any()):
            self._record_comm(time.perf_counter() - t0)
            self._stats.extra["bucket_fallbacks"] = self._stats.extra.get("bucket_fallbacks", 0) + 1
            return False
        self._finish_average(bad=(), t0=t0)
        return True

    def _average_plain(self) -> None:
        n, nb = self._n_grad, self._n_buf
        has = pack_grads(self._order, self._grad[:n])
        self._fill_tail(not is_finite(self._grad[:n]), has=has)
        if self._grad[n + nb + self._npar + self.rank] > 0.5:
            # Contribute nothing but the flag, so the sum stays finite on every rank.
            self._grad[: n + nb].zero_()
        t0 = time.perf_counter()
        if self.world_size > 1:
            self._deadline.allreduce(self._grad[: -self.world_size].numpy(), what="gradient allreduce")
        self._finish_average(bad=self._bad_ranks(t0), t0=t0)

    def _average_on_node(self) -> None:
        """exchange="node": the gradients are summed in the mapped buffers (on their device), the
        tail [buffers | flags] through MPI as in the plain path."""
        n, nb = self._tail_at, self._n_buf
        mine = self._node.mine
        has = pack_grads(self._order, mine)
        self._fill_tail(not is_finite(mine), has=has)
        if self._grad[n + nb + self._npar + self.rank] > 0.5:
            mine.zero_()  # contribute nothing but the flag, as in the plain path
            self._grad[n:n + nb].zero_()
        t0 = time.perf_counter()
        # The tail's allreduce is the sum's first meeting; each rank divides the sums it added
        # (the same division as the mpi path's, so the same bits).
        bad: list[tuple[int, ...]] = []

        def divisor() -> int:
            bad.append(self._bad_ranks(t0))  # (raises NonFiniteError on every rank alike)
            return self.world_size - len(bad[0])

        averaged = self._node.sum_(self._grad[n: -self.world_size].numpy(), divide_by=divisor)
        self._finish_average(bad=bad[0], t0=t0, averaged=averaged)

    def _bad_ranks(self, t0: float) -> tuple[int, ...]:
        """The ranks whose gradients held NaN or inf (the reduced flags); raises NonFiniteError
        when they are not to be dropped."""
        n, nb = self._tail_at, self._n_buf
        status = self._grad[n + nb + self._npar: -self.world_size]
        bad = tuple(int(r) for r in torch.nonzero(status > 0.5).flatten().tolist())
        if bad and (self.nonfinite == "raise" or len(bad) == self.world_size):
            self._record_comm(time.perf_counter() - t0)
            raise NonFiniteError(bad, self._stats.steps, "gradients")
        self._note_dropped(bad)
        return bad

    def _fill_tail(self, grads_bad: bool, *, has: list[bool] | None = None) -> None:
        """Write [buffers | had-a-gradient flags | non-finite flags] (this rank's contribution)."""
        n, nb, npar = self._tail_at, self._n_buf, self._npar
        if nb:
            self._buf_flat.gather()
            self._grad[n:n + nb].copy_(self._buf_flat.flat)
        if has is None:
            has = [p.grad is not None for p in self._order]
        self._grad[n + nb:n + nb + npar] = torch.tensor(has, dtype=torch.float32)
        status = self._grad[n + nb + npar:n + nb + npar + self.world_size]
        status.zero_()
        bad = grads_bad or (nb and not is_finite(self._grad[n:n + nb]))
        if bad:
            status[self.rank] = 1.0

    def _finish_average(self, *, bad: tuple[int, ...], t0: float,
                        averaged: torch.Tensor | None = None) -> None:
        """Divide the sums (the gradients' in the host buffer, unless ``averaged`` holds them
        divided already), and hand the average to the gradients and buffers."""
        n, nb, npar = self._tail_at, self._n_buf, self._npar
        self._record_comm(time.perf_counter() - t0)
        grads = averaged
        if grads is None:
            grads = self._grad[:n]
            grads /= self.world_size - len(bad)
        if nb:
            self._grad[n:n + nb] /= self.world_size - len(bad)
        # A parameter nobody computed a gradient for keeps grad None, as in single-process training.
        unpack_grads(grads, self._order, keep=(self._grad[n + nb:n + nb + npar] > 0).tolist())
        if nb:
            self._buf_flat.flat.copy_(self._grad[n:n + nb])
            self._buf_flat.scatter()
        self._stats.averages += 1

    def _close(self) -> None:
        if self._thread is not None:
            self._join_launcher()
        if self._buckets is not None:
            self._buckets.close()
        if self._bucket_comm is not None:
            self._bucket_comm.Free()
            self._bucket_comm = None
        if self._node is not None:
            self._node.close()
            self._node = None
