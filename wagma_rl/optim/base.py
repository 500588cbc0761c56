"""The common part of every distributed optimizer: wrapping, checks, flat buffer, sync, state.

A :class:`DistributedOptimizer` wraps the user's ``torch.optim.Optimizer`` (the wrapped one still
does the arithmetic) and adds *when* and *with whom* to average. It subclasses
``torch.optim.Optimizer`` so ``torch.optim.lr_scheduler`` accepts it, and forwards ``param_groups``,
``state`` and ``defaults`` to the wrapped optimizer.
"""
from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable

import torch
from mpi4py import MPI

from wagma_rl.bounded_comm import DEFAULT_TIMEOUT, BoundedComm, PeerTimeout

from .averaging import agree, broadcast, global_average, status_slots
from .background import BackgroundAverage
from .finite import check_nonfinite_option
from .flat import FlatBuffer

__all__ = ["DistributedOptimizer", "OptimStats"]


@dataclasses.dataclass
class OptimStats:
    """What a distributed optimizer did so far (``opt.stats``)."""

    steps: int = 0
    """Local optimizer steps taken."""
    averages: int = 0
    """Model (or gradient) averages taken."""
    comm_time_s: float = 0.0
    """Total seconds spent in communication."""
    last_comm_s: float = 0.0
    """Seconds spent in the last communication."""
    info: Any = None
    """The last ``native_coll.CollectiveInfo`` (WAGMA, NonBlockingSGD), else None."""
    staleness: int = 0
    """Staleness of the last average (0 for the synchronous baselines)."""
    extra: dict = dataclasses.field(default_factory=dict)
    """Optimizer-specific figures of the last step (e.g. NonBlockingSGD's micro-batch counts)."""


def _resolve_comm(comm: MPI.Comm | None, timeout: float) -> BoundedComm:
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"comm must be an mpi4py intracommunicator (e.g. MPI.COMM_WORLD), got {comm!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    # Private communicators keep our messages apart from the user's own MPI traffic, and every
    # wait on them is bounded by the timeout.
    return BoundedComm(comm, timeout=float(timeout))


def _unique_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    seen, out = set(), []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


class DistributedOptimizer(torch.optim.Optimizer):
    """Base class: wraps ``optimizer`` and keeps rank-0-identical replicas on ``comm``.

    Construction is collective: it checks that every rank passed parameters of the same shapes
    and the same options, then broadcasts rank 0's parameters (and ``buffers``) to all ranks.

    Args:
        optimizer: the user's optimizer, already built over the model's parameters.
        comm: communicator (default ``MPI.COMM_WORLD``); it is duplicated, not used directly.
        timeout: seconds any wait for other ranks may last; then ``wagma_rl.bounded_comm.PeerTimeout``
            (a ``native_coll.CollectiveTimeout``) names the ranks that did not answer.
        nonfinite: what to do when a rank's contribution to an average holds NaN or inf:
            ``"raise"`` (default) :class:`~wagma_rl.optim.finite.NonFiniteError` on every rank,
            ``"drop"`` leave that contribution out and go on.
        buffers: module buffers to average along with the parameters (e.g. ``model.buffers()``);
            only floating-point ones are averaged (BatchNorm's integer counters are left alone).
        views: let parameters become views into the flat averaging buffer (CPU float32 only).
        options: the subclass's options, checked to be the same on every rank.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, comm: MPI.Comm | None = None,
                 buffers: Iterable[torch.Tensor] | None = None, views: bool = True,
                 options: dict | None = None, timeout: float = DEFAULT_TIMEOUT,
                 nonfinite: str = "raise"):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{type(self).__name__} wraps a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}; build e.g. torch.optim.SGD(model.parameters()) first")
        if isinstance(optimizer, DistributedOptimizer):
            raise TypeError("the optimizer is already distributed; wrap the plain torch optimizer once")
        self.optimizer = optimizer
        self.nonfinite = check_nonfinite_option(type(self).__name__, nonfinite)
        self._deadline = _resolve_comm(comm, timeout)
        self.timeout = self._deadline.timeout
        self.comm = self._deadline.comm
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        self._params = _unique_params(optimizer)
        self._buffers = [b for b in (buffers or []) if torch.is_floating_point(b)]
        self._options = dict(options or {})
        # The hook tables torch.optim.Optimizer.__init__ would create (it is not called: the
        # wrapped optimizer owns the parameters). OrderedDicts, as RemovableHandle keeps weak
        # references to them; torch's own step wrapper runs the step hooks (as for any optimizer:
        # global hooks therefore see the wrapper's step and the wrapped optimizer's).
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()
        self._patch_step_function()
        self._check_construction()
        # [parameters and buffers | one finiteness status slot per rank] (see averaging.py)
        self._flat = FlatBuffer(self._params + self._buffers, views=views,
                                extra=status_slots(self.world_size))
        broadcast(self._deadline, self._flat.array)
        self._flat.scatter()
        self._stats = OptimStats()
        self._outer = None  # an outer optimizer on the global average (outer.py), where offered
        self._checked_step = False
        self._closed = False
        self._inflight: BackgroundAverage | None = None  # a background average (background=True)
        self._joined: BackgroundAverage | None = None  # the one joined, until its result is put back

    # ----------------------------------------------------------------- torch.optim.Optimizer face
    @property
    def param_groups(self) -> list[dict]:  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def state(self):  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self) -> dict:  # type: ignore[override]
        return self.optimizer.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients (as the wrapped optimizer's ``zero_grad``)."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        raise RuntimeError(f"{type(self).__name__}: parameters cannot be added after construction "
                           "(every rank averages one fixed flat buffer); add the group to the "
                           "torch optimizer before wrapping it")

    def __repr__(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self._options.items())
        return f"{type(self).__name__}({self.optimizer!r}{opts}, world_size={self.world_size})"

    # ------------------------------------------------------------------------- public API
    def step(self, closure: Callable[[], float] | None = None):  # pragma: no cover - abstract
        raise NotImplementedError

    def reduce_gradients(self) -> None:
        """Average the gradients over the ranks now, so that what runs between this and
        :meth:`step` (a gradient-norm clip) sees the gradient the step applies. Collective where
        it averages (:class:`~wagma_rl.optim.AllreduceSGD`); the optimizers that average models
        after their step have nothing to reduce, and this does nothing."""

    def synchronize(self) -> None:
        """Blocking global model average now; afterwards every rank's parameters are bitwise equal.

        Collective: every rank must call it. Use before evaluation and checkpoints.
        """
        self.wait_average()
        self._flat.gather()
        t0 = time.perf_counter()
        self._note_dropped(global_average(self._deadline, self._flat.array, numel=self._flat.numel,
                                          step=self._stats.steps, nonfinite=self.nonfinite,
                                          identical=True))
        self._record_comm(time.perf_counter() - t0)
        self._flat.scatter()
        self._after_synchronize()

    def wait_average(self):
        """Wait for the model average running in the background (``background=True``) and put
        it into the parameters; returns what :meth:`average` would have (None when no average
        was in flight). ``step()``, :meth:`synchronize`, ``state_dict()`` and ``close()`` call it
        first; call it yourself before reading the parameters between steps (evaluation, a
        checkpoint of the model). The seconds it waited count in ``stats.comm_time_s``."""
        job, self._inflight = self._inflight, None
        if job is None:
            return None
        result, seconds, waited = job.join()
        self._record_comm(waited)
        self._stats.extra["background_exchange_s"] = seconds
        self._joined = job
        return self._finish_average(result)

    def _scatter_average(self) -> None:
        """Put the averaged flat buffer into the model (a background average: its rules)."""
        job, self._joined = self._joined, None
        if job is None:
            self._flat.scatter()
        else:
            job.scatter()

    def _start_average(self, *, background: bool = False):
        """Copy the model out and average it: now (returns :meth:`_finish_average`'s result),
        or on a thread that the next :meth:`wait_average` joins (returns None)."""
        self.wait_average()
        if not background:
            self._flat.gather()
            result, seconds = self._exchange_flat()
            self._record_comm(seconds)
            return self._finish_average(result)
        events = self._flat.gather(wait=False)
        self._inflight = BackgroundAverage(self._flat, events, n_params=len(self._params),
                                           exchange=self._exchange_flat, rank=self.rank)
        return None

    def _exchange_flat(self) -> tuple[Any, float]:  # pragma: no cover - abstract
        """Average the gathered flat buffer in place (may run on the background thread: touch
        only the flat buffer and the communicators); returns (result, seconds communicating)."""
        raise NotImplementedError

    def _finish_average(self, result):  # pragma: no cover - abstract
        """Put the averaged flat buffer into the model (training thread, through
        :meth:`_scatter_average`) and count it."""
        raise NotImplementedError

    @property
    def stats(self) -> OptimStats:
        """Counters and communication time so far, and the last collective's information."""
        return self._stats

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state plus this wrapper's schedule counters (the hooks of
        ``register_state_dict_pre_hook``/``_post_hook`` run as for a torch optimizer)."""
        self.wait_average()
        for hook in self._optimizer_state_dict_pre_hooks.values():
            hook(self)
        state = {"optimizer": self.optimizer.state_dict(), "wrapper": self._wrapper_state()}
        for hook in self._optimizer_state_dict_post_hooks.values():
            state = hook(self, state) or state
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; the averaging schedule continues where it stopped
        (the hooks of ``register_load_state_dict_pre_hook``/``_post_hook`` run around it)."""
        self.wait_average()
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            state_dict = hook(self, state_dict) or state_dict
        if not isinstance(state_dict, dict) or "optimizer" not in state_dict or "wrapper" not in state_dict:
            raise ValueError(f"{type(self).__name__}.load_state_dict expects the dict returned by "
                             "state_dict() (keys 'optimizer' and 'wrapper'); for a plain torch "
                             "optimizer's state use opt.optimizer.load_state_dict")
        wrapper = state_dict["wrapper"]
        if wrapper.get("kind") != type(self).__name__:
            raise ValueError(f"state_dict was saved by {wrapper.get('kind')}, not {type(self).__name__}")
        if self._outer is None and "outer" in wrapper:
            saved = wrapper.get("options", {}).get("outer", "an outer optimizer")
            raise ValueError(f"the state was saved with outer={saved!r} and this "
                             f"{type(self).__name__} has no outer optimizer: pass outer={saved!r} "
                             "to continue its momentum, or delete state_dict['wrapper']['outer'] "
                             "to drop it")
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self._load_wrapper_state(wrapper)
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)

    def close(self) -> None:
        """Release the communicators (collective, bounded). Also called on leaving a ``with`` block."""
        if not self._closed:
            self.wait_average()
            self._closed = True
            self._deadline.barrier("close")
            self._close()
            self._deadline.free()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------- for subclasses
    def _wrapper_state(self) -> dict[str, Any]:
        state = {"kind": type(self).__name__, "steps": self._stats.steps,
                 "averages": self._stats.averages, "options": dict(self._options)}
        if self._outer is not None:
            state["outer"] = self._outer.state_dict()
        return state

    def _load_wrapper_state(self, wrapper: dict[str, Any]) -> None:
        self._stats.steps = int(wrapper["steps"])
        self._stats.averages = int(wrapper["averages"])
        if self._outer is not None:
            if "outer" in wrapper:
                self._outer.load_state_dict(wrapper["outer"])
            else:  # saved without an outer optimizer: it starts from the model loaded now
                self._flat.gather()
                self._outer.restart(self._flat.body)

    def _after_synchronize(self) -> None:
        """Hook: called after :meth:`synchronize` (WAGMA republishes its contribution)."""

    def _close(self) -> None:
        """Hook: release subclass resources (collective)."""

    def _note_dropped(self, ranks: tuple[int, ...]) -> None:
        """Count contributions left out as non-finite (``nonfinite="drop"``) in ``stats.extra``."""
        if ranks:
            self._stats.extra["nonfinite_dropped"] = self._stats.extra.get("nonfinite_dropped", 0) + 1
            self._stats.extra["nonfinite_ranks"] = ranks

    def _native(self, call, *args, **kwargs):
        """Run a native collective call; its timeout becomes a :class:`PeerTimeout` (the message,
        which already names the lost ranks' host and pid, is kept as it is)."""
        try:
            return call(*args, **kwargs)
        except TimeoutError as exc:
            ranks = tuple(getattr(exc, "ranks", ()) or ())
            if isinstance(exc, PeerTimeout) or not ranks:
                raise
            peers = [self._deadline.peers[r] for r in ranks if 0 <= r < self.world_size]
            raise PeerTimeout(str(exc), peers, "native collective") from exc

    def _record_comm(self, seconds: float) -> None:
        self._stats.last_comm_s = seconds
        self._stats.comm_time_s += seconds

    def _run_closure(self, closure):
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def _check_construction(self) -> None:
        problem = None
        sig = [(tuple(t.shape), str(t.dtype)) for t in self._params + self._buffers]
        sparse = [i for i, p in enumerate(self._params) if p.is_sparse]
        if not self._params:
            problem = "the optimizer has no parameters"
        elif sparse:
            problem = f"parameter {sparse[0]} is a sparse tensor; only dense parameters can be averaged"
        agree(self._deadline, problem)
        ref_sig, ref_opts = self._deadline.bcast_obj((sig, self._options), root=0,
                                                     what="a start-up check")
        problem = None
        if len(sig) != len(ref_sig):
            problem = (f"has {len(self._params)} parameters and {len(self._buffers)} buffers, "
                       f"rank 0 has {len(ref_sig)} tensors in all; build the same model on every rank")
        else:
            for i, (mine, ref) in enumerate(zip(sig, ref_sig)):
                if mine != ref:
                    problem = (f"tensor {i} has shape/dtype {mine}, rank 0 has {ref}; parameters must "
                               "have the same shapes on every rank (same model, same order)")
                    break
        if problem is None and self._options != ref_opts:
            problem = f"options {self._options} differ from rank 0's {ref_opts}; pass the same on every rank"
        agree(self._deadline, problem)

    def _step_problem(self) -> str | None:
        """Why the next step cannot run (None when it can): checked before every step."""
        current = _unique_params(self.optimizer)
        if len(current) != len(self._params) or any(a is not b for a, b in zip(current, self._params)):
            return ("the wrapped optimizer's parameters changed after construction; build the "
                    "distributed optimizer after every parameter group has been added")
        for i, p in enumerate(self._params):
            if p.grad is not None and p.grad.is_sparse:
                return (f"parameter {i} has a sparse gradient; the distributed optimizers average "
                        "dense tensors (use nn.Embedding(sparse=False))")
        if not self._flat.intact():
            return ("a parameter's .data was replaced after construction (e.g. model.to(...)); move "
                    "the model before building the optimizer")
        return None

    #: Whether the first step checks collectively. The wait-avoiding optimizers must not wait for
    #: a peer there; a rank that raises alone makes its peers' next blocking collective time out
    #: with an error that names it instead.
    _collective_first_check = True

    def _check_step(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} was closed; build a new one to keep training")
        problem = self._step_problem()
        if not self._checked_step and self._collective_first_check:
            # The first step checks collectively so a mistake on one rank stops all of them; later
            # steps check locally (a mistake there is made by the same code on every rank).
            agree(self._deadline, problem, error=RuntimeError)
            self._checked_step = True
        elif problem is not None:
            raise RuntimeError(f"rank {self.rank}: {problem}")
