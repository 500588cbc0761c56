"""The public Python API of the wait-avoiding group allreduce."""
from __future__ import annotations

import atexit
import os
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI  # initialises MPI with MPI_THREAD_MULTIPLE before the engine loads

from native_coll import faults
from native_coll.errors import CollectiveTimeout, NonFiniteResult
from native_coll.handshake import DEFAULT_TIMEOUT, bounded_allgather
from native_coll.mpienv import NETMOD_VAR

__all__ = ["WaitAvoidingAllreduce", "CollectiveInfo", "CollectiveTimeout", "NonFiniteResult", "group_of",
           "GLOBAL_MODES", "GLOBAL_PRECISIONS", "wire_round"]

_NEVER_GLOBAL = 2 ** 62  # the period behind sync_period=None


def _load_native():
    try:
        from native_coll import _native
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "native_coll's compiled engine is missing: run `make install` (or "
            "`pip install --no-build-isolation -e .` with mpicc on PATH or MPICC set)") from exc
    ours, theirs = _native.library_version(), MPI.Get_library_version()
    if ours.split("\n")[0].strip() != theirs.split("\n")[0].strip():
        raise ImportError(
            "native_coll was built against a different MPI than mpi4py uses:\n"
            f"  native_coll: {ours.splitlines()[0]}\n  mpi4py:      {theirs.splitlines()[0]}\n"
            "Rebuild both with the same MPI (set MPICC to your MPI's compiler wrapper).")
    _native.set_error_classes(CollectiveTimeout, NonFiniteResult)
    return _native


_native = _load_native()


@dataclass(frozen=True)
class CollectiveInfo:
    """What one collective did, as seen by the calling rank."""

    iteration: int
    """Iteration index (from 0)."""
    kind: str
    """``"group"`` or ``"global"``."""
    group: tuple[int, ...]
    """Ranks that averaged together (all ranks for a global iteration)."""
    stale: tuple[int, ...]
    """Ranks whose contribution was not fresh for this iteration."""
    staleness: int
    """Largest number of iterations by which a contribution was behind (0 when all fresh)."""
    wait_s: float
    """Seconds the call spent."""
    applied_global: int | None = None
    """``global_mode="overlap"``: the global iteration whose average this call applied to the
    buffer (``A + (W_now - W_snapshot)``) before its own work, else None."""
    global_lag: int = 0
    """Iterations this rank ran between that global's snapshot and applying its average (the
    staleness of the overlapped global; at most ``sync_period``), else 0."""
    nodes: int = 0
    """The node-aware schedule ran across this many nodes (the members share nodes, the same
    number on each; docs/collective.md#node-aware-schedule), else 0 (the direct schedule)."""
    bytes_sent: int = 0
    """Bytes of data and result messages this rank handed to MPI for the collective (half as
    many on the 16-bit wire of ``global_precision``; the small control messages not counted)."""


def group_of(nranks: int, group_size: int, iteration: int, rank: int) -> tuple[int, ...]:
    """Return the sorted ranks in ``rank``'s group at ``iteration``.

    For ``nranks`` and ``group_size`` powers of two the groups form a butterfly: at iteration t the
    group is the ranks that differ from ``rank`` only in the ``log2(group_size)``-bit field number
    ``t mod ceil(log2 P / log2 S)`` (the last field shifted down to stay full width), so every rank
    has mixed with every other after that many iterations. Otherwise the ranks are put in a
    pseudo-random order that depends only on t and cut into ``nranks // group_size`` consecutive
    blocks whose sizes differ by at most one (each group then has S to 2S-1 members).
    ``group_size`` 1 gives ``(rank,)``; ``group_size >= nranks`` gives all ranks.
    """
    return _native.group_of(int(nranks), int(group_size), int(iteration), int(rank))


def _buffer_address(buf) -> tuple[int, int, str | None]:
    """Return (address, length, problem) for a float32 1-D contiguous numpy array or CPU tensor."""
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.float32:
            return 0, 0, f"buf must have dtype float32, got {buf.dtype}"
        if buf.ndim != 1:
            return 0, 0, f"buf must be 1-D, got shape {buf.shape}; pass buf.reshape(-1)"
        if not buf.flags.c_contiguous:
            return 0, 0, "buf must be C-contiguous; pass np.ascontiguousarray(buf)"
        if not buf.flags.writeable:
            return 0, 0, "buf must be writeable: results are written into it"
        return buf.ctypes.data, buf.size, None
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(buf, torch.Tensor):
        if buf.dtype != torch.float32:
            return 0, 0, f"buf must have dtype float32, got {buf.dtype}"
        if buf.device.type != "cpu":
            return 0, 0, (f"buf must be a CPU tensor, got device {buf.device}; stage it through "
                          "a (pinned) CPU buffer")
        if buf.dim() != 1:
            return 0, 0, f"buf must be 1-D, got shape {tuple(buf.shape)}; pass buf.view(-1)"
        if not buf.is_contiguous():
            return 0, 0, "buf must be contiguous; pass buf.contiguous()"
        if buf.requires_grad:
            return 0, 0, "buf must not require grad; pass a detached tensor"
        return buf.data_ptr(), buf.numel(), None
    return 0, 0, f"buf must be a numpy array or a torch tensor, got {type(buf).__name__}"


def _check_netmod(hosts: int) -> None:
    """Refuse MPICH's UCX network module between hosts unless the user chose it explicitly: its
    polled point-to-point messages stall there and the collective would hang (mpienv.py)."""
    if hosts < 2 or os.environ.get(NETMOD_VAR):
        return
    if "ch4:ucx" in MPI.Get_library_version():
        raise RuntimeError(
            "MPICH would use its UCX network module between hosts, where the collective's polled "
            f"messages stall: export {NETMOD_VAR}=ofi before starting the ranks (mpiexec -genv "
            f"{NETMOD_VAR} ofi), or import native_coll/wagma_rl before mpi4py; set "
            f"{NETMOD_VAR}=ucx to insist on UCX (docs/cluster.md)")


def _finite(buf) -> bool:
    """True when every element of the float32 buffer is finite (a sum first: one fast pass)."""
    arr = buf if isinstance(buf, np.ndarray) else buf.numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(arr.sum(dtype=np.float32)):
            return True
    return bool(np.isfinite(arr).all())


# What a late member gets (wa.h: WA_LATE_*); see WaitAvoidingAllreduce.allreduce.
_LATE_RULES = {"merge": _native.LATE_MERGE, "discard": _native.LATE_DISCARD,
               "apply": _native.LATE_APPLY}

# How global iterations run (wa.h: WA_GLOBAL_*); see WaitAvoidingAllreduce.
GLOBAL_MODES = {"blocking": _native.GLOBAL_BLOCKING, "overlap": _native.GLOBAL_OVERLAP}

# What global iterations send (wa.h: WA_PRECISION_*, wa_set_global_precision).
GLOBAL_PRECISIONS = {"fp32": _native.PRECISION_FP32, "bf16": _native.PRECISION_BF16,
                     "fp16": _native.PRECISION_FP16}


def wire_round(values: np.ndarray, precision: str) -> np.ndarray:
    """A float32 copy of ``values`` rounded to the 16-bit wire of ``precision`` (``"bf16"`` or
    ``"fp16"``) and back, by the engine's own conversion (round to nearest even, NaN kept,
    overflow to inf). For tests and for checking what a global average on that wire keeps."""
    if precision not in ("bf16", "fp16"):
        raise ValueError(f"precision must be 'bf16' or 'fp16', got {precision!r}")
    out = np.array(values, dtype=np.float32, copy=True).reshape(-1)
    _native.wire_round(GLOBAL_PRECISIONS[precision], out)
    return out.reshape(np.shape(values))

_live: "weakref.WeakSet[WaitAvoidingAllreduce]" = weakref.WeakSet()


@atexit.register
def _stop_engines_before_finalize() -> None:
    # mpi4py finalises MPI at exit; progress threads still inside MPI then would crash. This
    # handler was registered after mpi4py's, so it runs first.
    for wa in list(_live):
        wa._abandon()


def _info(raw) -> CollectiveInfo:
    it, is_global, group, stale, staleness, wait_s, applied, lag, nodes, sent = raw
    return CollectiveInfo(iteration=it, kind="global" if is_global else "group", group=group,
                          stale=stale, staleness=staleness, wait_s=wait_s,
                          applied_global=None if applied < 0 else applied, global_lag=lag,
                          nodes=nodes, bytes_sent=sent)


class WaitAvoidingAllreduce:
    """Wait-avoiding group allreduce of one float32 buffer (WAGMA's collective).

    ``comm`` is an mpi4py communicator (duplicated for the engine's own traffic); ``buf`` a 1-D
    C-contiguous float32 numpy array or CPU torch tensor of the same length on every rank, used in
    place (zero copy) for the object's lifetime. Construction is collective and publishes ``buf``.

    ``start_iteration`` is the index of the first iteration (a resumed run passes the count it
    reached, so the group rotation and the global schedule continue where they stopped).

    Iteration t (counted from ``start_iteration``, default 0) is *global* when ``(t + 1) % sync_period == 0``
    (``sync_period=None``: never; every iteration is a group iteration): a blocking
    average over all ranks, bitwise identical everywhere. Otherwise it is a *group* iteration over
    :meth:`group` (t): the first member to call activates it, members that have not called take
    part through their progress thread with their last published contribution, on-time members
    get the bitwise-identical group average, and a member arriving after its group finished gets
    ``R + (W_fresh - W_published) / |G|``. Fast ranks therefore never wait for a slow one before
    the next global iteration.

    ``global_mode="overlap"`` removes that wait too: a global call snapshots ``buf`` (U) and
    returns at once; the average A of every rank's snapshot completes in the background and the
    first later call that finds it complete applies ``buf = A + (buf - U)`` (the rank keeps its
    own progress since the snapshot, the sum over ranks is conserved). The next global call
    (and :meth:`settle`, :meth:`synchronize`) waits for A, i.e. for every rank to have reached
    the previous global: no rank gets more than ``2 * sync_period`` iterations ahead of the
    slowest. :meth:`synchronize` makes the replicas bitwise identical on demand.

    ``global_precision="bf16"`` or ``"fp16"`` sends 16-bit values in global iterations instead of
    float32, half the bytes: not the model but each rank's pseudo-gradient
    ``round16(buf - global_base)``; the mean of those is rounded to 16 bits once and every rank
    takes ``global_base + mean``, bitwise identical everywhere. ``global_base`` is a float32
    buffer of ``buf``'s length holding the last global model, identical on every rank, which this
    object keeps. It must become each global's model: with ``"blocking"`` the caller updates it
    after each global call (the engine reads it only inside one); with ``"overlap"`` the engine
    does, where it applies the average (the outer step's ``prev`` may be passed as the base)
    (wa.h, ``wa_set_global_precision``; docs/optimizers.md#low-precision-global-exchange).
    Group iterations and :meth:`synchronize` stay float32.
    """

    def __init__(self, comm: MPI.Comm, buf, *, group_size: int, sync_period: int | None,
                 start_iteration: int = 0, global_mode: str = "blocking",
                 timeout: float = DEFAULT_TIMEOUT, global_precision: str = "fp32",
                 global_base=None):
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"comm must be an mpi4py communicator, got {type(comm).__name__}")
        size = comm.Get_size()
        addr, n, problem = _buffer_address(buf)
        if problem is None:
            problem = self._check_options(size, group_size, sync_period, start_iteration, timeout)
        if problem is None and global_mode not in GLOBAL_MODES:
            problem = f"global_mode must be one of {list(GLOBAL_MODES)}, got {global_mode!r}"
        base_addr = 0
        if problem is None:
            problem, base_addr = self._check_precision(global_precision, global_base, n)
        # Agree on validity first: a rank raising alone would leave its peers hanging.
        everyone = bounded_allgather(
            comm, (problem, int(n), group_size, sync_period, start_iteration, global_mode,
                   global_precision, MPI.Get_processor_name(), os.getpid()),
            timeout=timeout if isinstance(timeout, (int, float)) and timeout > 0 else DEFAULT_TIMEOUT,
            what="constructing the collective")
        for r, (p, *_rest) in enumerate(everyone):
            if p is not None:
                raise ValueError(f"rank {r}: {p}")
        _check_netmod(len({e[7] for e in everyone}))
        lengths = sorted({e[1] for e in everyone})
        if len(lengths) > 1:
            per_rank = ", ".join(f"rank {r}: {e[1]}" for r, e in enumerate(everyone))
            raise ValueError(f"buf must have the same length on every rank ({per_rank})")
        if len({tuple(e[2:7]) for e in everyone}) > 1:
            per_rank = ", ".join(f"rank {r}: group_size={e[2]} sync_period={e[3]} "
                                 f"start_iteration={e[4]} global_mode={e[5]} "
                                 f"global_precision={e[6]}"
                                 for r, e in enumerate(everyone))
            raise ValueError("group_size, sync_period, global_precision, global_mode and "
                             f"start_iteration must be equal on every rank ({per_rank})")
        self._where = [(e[7], e[8]) for e in everyone]  # (host, pid) of every rank
        self._comm = comm
        faults.track(comm)  # revoked with the job's others when a rank is lost (native_coll.faults)
        # What shrink() rebuilds the engine with on the smaller communicator.
        self._options = dict(group_size=int(group_size), sync_period=sync_period,
                             global_mode=global_mode, timeout=float(timeout),
                             global_precision=global_precision, global_base=global_base)
        self._global_mode = global_mode
        self._global_precision = global_precision
        self._global_base = global_base  # keeps the memory alive while the engine reads it
        self._buf = buf  # keeps the memory alive while the engine uses it
        self._outer = None
        self._outer_lr_mu = (1.0, 0.0)
        self._next = int(start_iteration)
        self._size = size
        self._rank = comm.Get_rank()
        self._group_size = int(group_size)
        # None (never global) is a period no run reaches: the engine's iteration counter is int64.
        self._sync_period = _NEVER_GLOBAL if sync_period is None else int(sync_period)
        self._engine = _native.Engine(MPI._addressof(comm), addr, n, int(group_size),
                                      self._sync_period, int(start_iteration),
                                      GLOBAL_MODES[global_mode], float(timeout))
        self._engine.describe_ranks([self.where(r) for r in range(size)])
        _live.add(self)
        if global_precision != "fp32":
            self._engine.set_global_precision(GLOBAL_PRECISIONS[global_precision], base_addr)
            # No rank may activate a global before every rank has its 16-bit wire (wa.h).
            bounded_allgather(comm, None, timeout=float(timeout),
                              what="setting the global precision")

    @staticmethod
    def _check_precision(precision, base, n) -> tuple[str | None, int]:
        """(problem or None, the base's address) for ``global_precision``/``global_base``."""
        if precision not in GLOBAL_PRECISIONS:
            return (f"global_precision must be one of {list(GLOBAL_PRECISIONS)}, got "
                    f"{precision!r}"), 0
        if precision == "fp32":
            return None, 0
        if base is None:
            return (f"global_precision={precision!r} needs global_base, the last global model "
                    "(float32, buf's length, identical on every rank)"), 0
        addr, m, problem = _buffer_address(base)
        if problem is None and m != n:
            problem = f"must have buf's length {n}, got {m}"
        if problem is not None:
            return f"global_base: {problem.removeprefix('buf ')}", 0
        return None, addr

    @staticmethod
    def _check_options(size, group_size, sync_period, start_iteration, timeout) -> str | None:
        if not isinstance(group_size, (int, np.integer)) or isinstance(group_size, bool):
            return f"group_size must be an int, got {type(group_size).__name__}"
        if not 1 <= group_size <= size:
            return f"group_size must be between 1 and the number of ranks ({size}), got {group_size}"
        if sync_period is None:
            pass
        elif not isinstance(sync_period, (int, np.integer)) or isinstance(sync_period, bool):
            return f"sync_period must be an int or None (never global), got {type(sync_period).__name__}"
        elif sync_period < 1:
            return f"sync_period must be >= 1, got {sync_period}"
        if not isinstance(start_iteration, (int, np.integer)) or start_iteration < 0:
            return f"start_iteration must be an int >= 0, got {start_iteration!r}"
        if not timeout > 0:
            return f"timeout must be > 0 seconds, got {timeout}"
        return None

    # -- the collective ---------------------------------------------------------------------
    def allreduce(self, *, late: str = "apply", reset: bool = False,
                  check_finite: bool = False) -> CollectiveInfo:
        """Run the next iteration: average ``buf`` in place and return what happened.

        ``late="apply"`` (default, as ``averaging.late`` and ``WAGMA(late=)``) gives a late member
        ``R + (W_fresh - W_published)``: all its progress since the contribution the group used,
        so the sum of the models over the ranks is conserved (the other members receive that
        progress at their next average with this rank instead of losing it); ``late="merge"``
        gives it ``R + (W_fresh - W_published)/|G|``, what it would have got on time;
        ``late="discard"`` gives it ``R`` (its fresh contents are dropped, so every member of the
        group holds the same values). ``reset=True``
        publishes zeros after the call instead of the result (for accumulators that restart each
        round). Raises :class:`CollectiveTimeout` naming the ranks that did not answer when the
        iteration cannot complete in time.

        A result holding NaN or inf is never applied: every member of the iteration raises
        :class:`NonFiniteResult` (``own``: whether this rank's data held it), ``buf`` stays this
        rank's contribution (as it was, but for an overlapped global average the call applied
        first), the published contribution stays the one before the call, and the next call runs
        the next iteration. The
        owner of each chunk of the result tests it while it reduces it, so this costs no extra
        pass. With ``global_mode="overlap"`` the global call whose snapshot is not finite raises at
        once, and every other rank raises at the call that would have applied that average; that
        call did not run its own iteration (:attr:`iteration` is unchanged: call again).

        ``check_finite=True`` additionally checks ``buf`` first (one pass) and raises
        ``FloatingPointError`` without taking part when it holds NaN or inf: nothing is
        contributed or published, so the peers' iteration goes on with this rank's last published
        contribution instead of being refused on every member.
        """
        if late not in _LATE_RULES:
            raise ValueError(f"late must be one of {list(_LATE_RULES)}, got {late!r}")
        if check_finite and not _finite(self._buf):
            raise FloatingPointError(f"rank {self._rank}: buf holds NaN or inf; it was not "
                                     f"contributed to iteration {self.iteration}")
        with self._naming_hosts():
            return _info(self._live_engine().allreduce(_LATE_RULES[late], bool(reset)))

    def settle(self) -> CollectiveInfo | None:
        """``global_mode="overlap"``: wait for the outstanding global average, if any, and apply
        it to ``buf`` now (``A + (buf - U)``). Returns what that global did (``applied_global``,
        ``global_lag``), or None when nothing was outstanding. No other communication. Raises
        :class:`NonFiniteResult` when that average held NaN or inf (it is dropped, not applied)."""
        with self._naming_hosts():
            info = _info(self._live_engine().settle())
        return info if info.applied_global is not None else None

    def synchronize(self) -> CollectiveInfo | None:
        """Collective: :meth:`settle`, then replace ``buf`` by the average over all ranks,
        bitwise identical everywhere, and publish it. Outside the iteration schedule (it does not
        count as an iteration); every rank calls it at the same point of its calls. Returns
        what :meth:`settle` returned. Raises :class:`NonFiniteResult` on every rank when the
        average held NaN or inf (``buf`` is left as it was); an outstanding overlapped average
        that did is dropped without a report, since this average takes its place."""
        with self._naming_hosts():
            info = _info(self._live_engine().synchronize())
        return info if info.applied_global is not None else None

    @property
    def global_mode(self) -> str:
        """``"blocking"`` or ``"overlap"`` (how global iterations run)."""
        return self._global_mode

    @property
    def global_precision(self) -> str:
        """``"fp32"``, ``"bf16"`` or ``"fp16"`` (what global iterations send)."""
        return self._global_precision

    def publish(self) -> None:
        """Make ``buf``'s current contents this rank's contribution (no communication)."""
        self._live_engine().publish()

    def set_outer(self, prev, momentum, *, lr: float, mu: float) -> None:
        """``global_mode="overlap"``: take an outer optimizer step on every global average where
        it is applied (DiLoCo's outer Nesterov momentum; wa.h, ``wa_set_outer``): with
        ``d = prev - A`` and ``momentum = mu * momentum + d``, the applied average becomes
        ``T = A + ((1 - lr) * d - (lr * mu) * momentum)`` and ``prev = T``, so the rank gets
        ``T + (buf - U)``. ``prev`` and ``momentum`` are float32 buffers of ``buf``'s length that
        this object keeps and the engine updates in place; ``None, None`` turns the step off.
        Local, not collective: every rank sets the same values."""
        if prev is None and momentum is None:
            self._outer = None
            self._live_engine().set_outer(0, 0, 1.0, 0.0)
            return
        addrs = []
        for name, arr in (("prev", prev), ("momentum", momentum)):
            addr, n, problem = _buffer_address(arr)
            if problem is None and n != _buffer_address(self._buf)[1]:
                problem = f"must have buf's length {_buffer_address(self._buf)[1]}, got {n}"
            if problem is not None:
                raise ValueError(f"set_outer {name}: {problem.removeprefix('buf ')}")
            addrs.append(addr)
        self._live_engine().set_outer(addrs[0], addrs[1], float(lr), float(mu))
        self._outer = (prev, momentum)  # keeps the memory alive while the engine uses it
        self._outer_lr_mu = (float(lr), float(mu))  # for shrink()

    def ready(self) -> bool:
        """True when peers already activated the next iteration with this rank's published
        contribution: it is running or done on this rank's behalf, so fresh data can no longer
        join it, and a call only collects the result (merged per ``late``)."""
        return self._live_engine().ready()

    def global_pending(self) -> bool:
        """``global_mode="overlap"``: True while the outstanding global average is incomplete
        (a rank has not made its global call yet), so the next global call, :meth:`settle` and
        :meth:`synchronize` would wait for it. Never waits."""
        return self._live_engine().global_pending()

    def wait_began(self, t: float) -> None:
        """The caller has been waiting for its next call's collective since ``t``
        (``time.monotonic()``), e.g. polling :meth:`global_pending` while it listened for other
        events: the next :meth:`allreduce` or :meth:`settle` counts its timeout (and
        ``wait_s``) from ``t``, so a wait in two steps stays within one timeout."""
        self._live_engine().wait_began(float(t))

    @property
    def iteration(self) -> int:
        """Index of the next iteration this rank will run."""
        return self._live_engine().next_iteration()

    def is_global(self, t: int) -> bool:
        """True when iteration ``t`` is a global (all-rank) iteration."""
        return (int(t) + 1) % self._sync_period == 0

    def group(self, t: int) -> tuple[int, ...]:
        """Sorted ranks of this rank's group at iteration ``t`` (all ranks when it is global)."""
        if t < 0:
            raise ValueError(f"iteration must be >= 0, got {t}")
        if self.is_global(t):
            return tuple(range(self._size))
        return group_of(self._size, self._group_size, t, self._rank)

    @property
    def comm(self) -> MPI.Comm:
        """The communicator the collective runs over (the smaller one after :meth:`shrink`)."""
        return self._comm

    def shrink(self, *, start_iteration: int | None = None) -> tuple[int, ...]:
        """Go on without the members that died (Open MPI with fault tolerance on; docs/mpi.md).

        Under ULFM a member's death makes every rank's pending or next call raise
        :class:`CollectiveTimeout` naming it, within moments (the engine revokes its
        communicator). Every survivor then calls ``shrink()``: it revokes :attr:`comm` too (so no
        survivor stays blocked in another call on it), acknowledges the failures, agrees with the
        other survivors (``MPIX_Comm_agree``), shrinks the communicator (``MPIX_Comm_shrink``) and
        builds a new engine over it with the same options (``group_size`` capped at the new
        size; the groups are those of the smaller communicator), shrinking again if a member dies
        meanwhile (``faults.shrink_and_build``). The new engine publishes ``buf``, so put the
        state to continue from in it first (e.g. the last global average). The next
        iteration is ``start_iteration``, or by default the largest next iteration among the
        survivors. Returns the ranks lost, numbered as in the old communicator; the survivors
        are renumbered in their old order (:attr:`comm`). Collective over the survivors.
        """
        nxt = self._engine.next_iteration() if self._engine is not None else self._next
        self._abandon()
        opts, outer, lr_mu = dict(self._options), self._outer, self._outer_lr_mu

        def build(new: MPI.Comm) -> None:
            self._abandon()  # the engine of an earlier round, where a member died after it
            start = start_iteration if start_iteration is not None else \
                new.allreduce(nxt, op=MPI.MAX)
            self.__init__(new, self._buf, start_iteration=int(start),
                          **dict(opts, group_size=min(opts["group_size"], new.Get_size())))
            if outer is not None:
                self.set_outer(outer[0], outer[1], lr=lr_mu[0], mu=lr_mu[1])

        # (shrunk again where a member dies while the new engine is built: faults.shrink_and_build)
        _, lost, _ = faults.shrink_and_build(self._comm, build)
        return lost

    @property
    def buffer(self):
        """The buffer this collective averages in place."""
        return self._buf

    def where(self, rank: int) -> str:
        """``"host <name>, pid <pid>"`` of ``rank``, as it reported itself at construction."""
        host, pid = self._where[rank]
        return f"host {host}, pid {pid}"

    @contextmanager
    def _naming_hosts(self):
        # The engine names ranks; a user on a cluster needs the host and process too.
        try:
            yield
        except CollectiveTimeout as exc:
            who = ", ".join(f"rank {r} ({self.where(r)})" for r in exc.ranks)
            raise CollectiveTimeout(f"{exc}; missing: {who}" if who else str(exc),
                                    exc.ranks) from None

    # -- lifetime ------------------------------------------------------------------------------
    def _live_engine(self):
        if self._engine is None:
            raise RuntimeError("the collective is closed; create a new WaitAvoidingAllreduce")
        return self._engine

    def close(self) -> None:
        """Collective shutdown: returns once every rank has closed and no collective involving
        this rank is left running. Safe to call twice."""
        if self._engine is None:
            return
        engine, self._engine = self._engine, None
        _live.discard(self)
        try:
            with self._naming_hosts():
                engine.close()
        finally:
            del engine

    free = close

    def _abandon(self) -> None:
        """Local stop without communication (interpreter exit, a failure)."""
        engine, self._engine = self._engine, None
        if engine is not None:
            self._next = engine.next_iteration()
            _live.discard(self)
            del engine  # Engine's destructor stops the progress thread

    def __enter__(self) -> "WaitAvoidingAllreduce":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:
            # An exception is propagating: peers may not reach close(); do not wait for them.
            self._abandon()
