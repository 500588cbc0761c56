"""One training job's lifecycle, the same for the RL trainer and the supervised jobs.

A :class:`Job` owns what every job needs around its training loop: the run folder and its lock,
the bounded communicator every wait for other ranks goes through (:class:`BoundedComm`), the run's
log, checkpoints that every rank agrees were written, the stop signals, the device, and the exit
policy (what a failure writes to ``log.txt`` and, after lost ranks, what the survivors save: on
their own timeout, or at once on the elastic supervisor's dead verdict, which reaches a survivor
stuck in a collective through its heartbeat thread).
A loop reads::

    with Job(comm, run=cfg.run, timeout=cfg.averaging.timeout) as job:
        path, state = job.start(pick)       # rank 0 locks the folder and picks a checkpoint
        ...                                 # build everything; then, with every check passed:
        log = job.open_log()
        ...                                 # train; at agreed points:
        job.save(state, step=frames)        # rank 0 writes, every rank learns whether it worked
        ...
        job.end(stopped=..., finished=..., frames=..., update=...)

Nothing is written to the run folder before :meth:`Job.open_log`: a start refused before it (a
config error, a checkpoint that does not fit, the folder in use) leaves the folder as it was but for
the lock; a failure after it, or one that is not the user's to fix, adds ``stopped: <why>`` to
``log.txt``.
"""
from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
from mpi4py import MPI

from native_coll import faults

from .. import elastic
from ..config import ConfigError
from .checkpoint import CheckpointError, CheckpointManager
from ..bounded_comm import BoundedComm, Peer, PeerTimeout, describe_ranks
from .device import resolve_device
from .exits import EXIT_CODES, JobError, describe_failure, failure_writer, record_stop, release_shm_segments
from .run_config import RunConfig
from .runlock import RunLock, RunLocked, describe_holder
from .signals import StopSignals, requeue_slurm_job
from .tblog import RunLogger

__all__ = ["Job", "Picked"]

#: What a job's ``pick`` returns on rank 0: the checkpoint to continue from (or None), its contents,
#: and lines to log once the log is open (e.g. checkpoints skipped as unreadable).
Picked = tuple["Path | None", "dict[str, Any] | None", "list[str]"]


def _end_lost_holder(holder: dict, gone: tuple[Peer, ...]) -> Peer | None:
    """SIGKILL the lock's holder when it is one of the lost ranks ``gone`` and alive on this host;
    the Peer it was, else None."""
    if holder.get("host") != socket.gethostname():
        return None
    for peer in gone:
        if peer.pid == holder.get("pid") and Path(f"/proc/{peer.pid}").exists():
            try:
                os.kill(peer.pid, signal.SIGKILL)
            except OSError:
                return None
            return peer
    return None


class Job:
    """The lifecycle of one training job on every rank of ``comm`` (a context manager).

    Args:
        comm: the job's communicator.
        run: the run section of the config (folder, checkpoints kept, device, threads, TensorBoard).
        timeout: seconds any wait for other ranks may take (``averaging.timeout``).
        signals: stop flags the caller installed already (default: SIGTERM, SIGINT and SIGUSR1
            handlers installed here and removed at the end).
    """

    def __init__(self, comm: MPI.Comm, *, run: RunConfig, timeout: float,
                 signals: StopSignals | None = None):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.run = run
        self.timeout = float(timeout)
        self.run_dir = Path(run.run_dir())
        self.lock = RunLock(self.run_dir)
        self._own_signals = signals is None
        self.signals = signals if signals is not None else StopSignals(announce=self.rank == 0)
        self.deadline: BoundedComm | None = None
        """The bounded communicator over ``comm`` (built on entering the job)."""
        self.ckpts = CheckpointManager(self.run_dir, keep_last=run.keep_checkpoints)
        self.device: torch.device | None = None
        self.log: RunLogger | None = None
        """The run's log (rank 0 writes; the others' calls do nothing), from :meth:`open_log`."""
        self.rescue: Callable[[BaseException], str | None] | None = None
        """Set by a loop that keeps its last synchronised state: called on the lowest surviving
        rank when ranks were lost, it saves that state and returns the line to report."""
        self._rescuing = threading.Lock()  # the heartbeat thread and the main thread: one rescue
        self._rescued: BaseException | None = None  # the loss that was rescued (recorded)
        self._writing = threading.Lock()  # one checkpoint write at a time (main or heartbeat)
        self._loss: dict[str, Any] | None = None  # the loss record a rescue prepared
        self._untell: Callable[[], None] | None = None
        self._launch_peers: tuple[Peer, ...] = ()  # the launch's ranks (the supervisor's numbers)
        self._notes: list[str] = []
        self._ended = False
        self._tensorboard = run.tensorboard

    # ------------------------------------------------------------------ entering and leaving
    def __enter__(self) -> "Job":
        if self._own_signals:
            self.signals.install()
        try:
            # Bounded from here on: a rank that never arrives is named (rank, host, pid) after the
            # timeout.
            self.deadline = BoundedComm(self.comm, timeout=self.timeout)
            self._launch_peers = self.deadline.peers  # (the supervisor's numbering: see _on_dead)
            release_shm_segments(self.comm)  # every rank is past MPI_Init now (see exits)
            if faults.fault_tolerant():  # (ULFM's MPI_Finalize may never return: see guard_exit)
                faults.guard_exit()
            torch.set_num_threads(self.run.torch_threads)
            self.device, warning = resolve_device(self.run.device, self.comm)
            # The supervisor's dead verdict reaches a survivor that waits in a collective for
            # the dead ranks (from the heartbeat thread): it saves and records as for a timeout.
            self._untell = elastic.heartbeat.on_dead(self._on_dead)
        except BaseException as exc:  # the exit policy and the clean-up hold for the start too
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        if warning:
            self._notes.append(warning)
        return self

    def __exit__(self, exc_type, exc: BaseException | None, tb) -> bool:
        # (The status to end with should the exit, after a shrink, hang in MPI_Finalize.)
        faults.exit_status(0 if exc is None else EXIT_CODES.get(describe_failure(exc)[0], 1))
        if self._untell is not None:
            self._untell()
        try:
            if exc is not None:
                self._report(exc)
        finally:
            if not self._ended:
                self.signals.uninstall()
            if self.log is not None:
                self.log.close()
            with self._rescuing:  # (a rescue the verdict started ends before the lock is let go)
                if self.deadline is not None:
                    self.deadline.free()
                self.lock.release()
        return False

    # ------------------------------------------------------------------------- the start
    def start(self, pick: Callable[[], Picked]) -> tuple[Path | None, dict[str, Any] | None]:
        """Rank 0 takes the run folder's lock and calls ``pick()`` (which checks the folder and
        chooses the checkpoint to continue from); every rank gets its outcome: the checkpoint's
        path and contents (sent by rank 0: no rank but rank 0 reads the run folder, so a rank on a
        node without the shared file system can join), or the problem, raised on every rank
        together so none is left waiting. Collective."""
        found: tuple[Path | None, list[str], tuple[str, str, bool] | None] = (None, [], None)
        contents = None
        if self.rank == 0:
            try:
                self.lock.acquire()
                path, contents, notes = pick()
                found = (path, list(notes), None)
            except Exception as exc:
                kind, line = describe_failure(exc)
                found = (None, [], (kind, line, isinstance(exc, ConfigError)))
                if kind == "crash":  # a bug: the others stop with its line, rank 0 with its trace
                    self.deadline.bcast_obj(found, what="start-up (run folder and checkpoint)")
                    raise
        path, notes, problem = self.deadline.bcast_obj(found, what="start-up (run folder and checkpoint)")
        if problem:
            kind, line, config_error = problem
            if config_error:  # (the same exception on every rank as on one: a config key to fix)
                raise ConfigError(line)
            raise JobError(line if kind != "crash" else f"rank 0: {line}", kind=kind)
        self._notes += notes
        if self.lock.stale:
            self._notes.append(f"took over the lock of a run that ended without releasing it "
                               f"({describe_holder(self.lock.stale)})")
        if path is not None:
            contents = self.deadline.bcast_obj(contents, what="start-up (the checkpoint's state from rank 0)")
        return path, contents

    def open_log(self, *, tensorboard: bool | None = None) -> RunLogger:
        """Open the run's log (call it once every check passed: from here the run folder is
        written) and log what the start found (device, lock, skipped checkpoints)."""
        on = self.run.tensorboard if tensorboard is None else tensorboard
        self._tensorboard = on
        self.log = RunLogger(self.run_dir, enabled=self.rank == 0, tensorboard=on)
        for line in self._notes:
            self.log.info(line)
        return self.log

    def after_loss(self, ckpt: dict | None, *, step: int = 0) -> tuple[float | None, str]:
        """Log that this launch continues a job after ranks were lost (the elastic supervisor's
        note, or the survivors' record in the checkpoint); return when what this launch answers
        happened and what that was, for the recovery time (None, "" for an ordinary start)."""
        note = elastic.launch_note()
        lost = (ckpt or {}).get("lost")
        if note is None and not lost:
            return None, ""
        since = "the loss was detected"
        if note is not None:
            line, at = f"elastic: {note['reason']}", float(note["detected_at"])
            since = note.get("since", since)
        else:
            names = ", ".join(f"rank {p['rank']} (host {p['host']}, pid {p['pid']})" for p in lost["ranks"])
            at = float(lost["detected_at"])
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
            line = (f"continuing on {self.size} rank{'s' if self.size > 1 else ''} (the job had "
                    f"{lost['world_size']}): lost {names} at {when}")
        self.log.info(line)
        self.log.text("elastic", line)
        self.log.scalars({"elastic/world_size": float(self.size)}, step)
        return at, since

    # ------------------------------------------------------------------- along the way
    @property
    def stop_requested(self) -> bool:
        """Whether a stop signal reached this rank (fold it into the next reduction: every rank
        stops at the same point)."""
        return self.signals.stop

    def check_rejoin(self, where: str) -> None:
        """Rank 0: when the elastic supervisor has ranks that rejoin, stop at this agreed point
        (after saving) so it relaunches the job on every slot."""
        if self.rank == 0 and not self.signals.stop and elastic.rejoin_requested():
            self.signals.stop = self.signals.rejoin = True
            self.log.info(f"stopping at {where} for a relaunch: the supervisor has ranks that rejoin")

    def save(self, state: dict[str, Any] | Callable[[], dict[str, Any]], *, step: int) -> Path | None:
        """Rank 0 writes ``state`` (or what ``state()`` returns: only rank 0 calls it) as the
        checkpoint of ``step``; every rank learns whether it worked, so a failed write stops all
        of them with one line. Call it where the replicas are identical. Collective."""
        outcome: tuple[Path | None, tuple[str, str] | None] = (None, None)
        if self.rank == 0:
            try:
                contents = state() if callable(state) else state
                with self._writing:
                    path = self.ckpts.save(contents, step=step)
                outcome = (path, None)
                if self.log is not None:
                    self.log.info(f"checkpoint {path}")
            except (CheckpointError, OSError) as exc:
                outcome = (None, describe_failure(exc))
        path, problem = self.deadline.bcast_obj(outcome, what="checkpoint")
        if problem:
            raise JobError(problem[1], kind=problem[0])
        return path

    def shrink(self, cause: BaseException) -> tuple[Peer, ...]:
        """Go on without lost ranks, in the same processes (Open MPI with its fault tolerance on:
        docs/mpi.md). Revokes every communicator of the job (so no survivor keeps waiting on one),
        agrees with the other survivors on who is gone, shrinks :attr:`comm` and rebuilds
        :attr:`deadline` over the smaller communicator (``native_coll.faults.shrink_and_build``:
        a rank that dies meanwhile is shrunk away too), and when rank 0 was lost the lowest
        survivor takes over its duties: the run lock (taken over from the dead holder; retried
        within the timeout where the file system still holds it) and the log. Returns the lost
        ranks (host, pid). Collective over the survivors; the caller rebuilds what else runs
        over the old communicator. ``cause``, the error that reported the loss, is raised again
        when no rank turns out lost (then it was not a lost rank, and going on would hide it)."""
        faults.revoke_all()
        new, lost, deadline = faults.shrink_and_build(
            self.comm, lambda comm: BoundedComm(comm, timeout=self.timeout))
        if not lost:
            deadline.free()
            raise cause
        peers = self.deadline.peers
        gone = tuple(peers[r] if r < len(peers) else Peer(r, "?", 0) for r in lost)
        was_writer, old_size = self.rank == 0, self.size
        self.comm = new
        self.rank, self.size = new.Get_rank(), new.Get_size()
        if self.rank == 0:  # (the elastic supervisor's: take the slots out, do not relaunch)
            elastic.write_in_place(writer=self.rank, world_size=old_size,
                                   lost=elastic.named(lost, peers))
        self.deadline = deadline
        if self.rank == 0 and not was_writer:
            fenced = self._take_over_lock(gone)
            if self.log is not None:
                self.log.close()
                self.log = RunLogger(self.run_dir, enabled=True, tensorboard=self._tensorboard)
                if fenced:
                    self.log.info(f"ended {fenced} with SIGKILL: the MPI declared it failed, but "
                                  "it was alive (stopped or hung) and held the run lock")
        return gone

    def common_snapshot(self, snapshots: tuple[dict | None, ...], *, key: str) -> dict:
        """After :meth:`shrink`: the snapshot of the last synchronised point every survivor holds.
        ``snapshots``: this rank's newest and the one before (None where absent), ``key`` their
        position (``"update"``, ``"step"``). A synchronised point that completed on some survivors
        and failed on others (a rank died inside it) leaves them one apart: all take the older.
        Collective over the survivors."""
        mine = tuple(int(s[key]) for s in snapshots if s is not None)
        held = self.deadline.allgather_obj(mine, what="agreeing on the state to go on from")
        target = min((h[0] for h in held if h), default=None)
        chosen = next((s for s in snapshots if s is not None and int(s[key]) == target), None)
        if chosen is None or any(target not in h for h in held):
            raise JobError(f"the survivors hold no common synchronised state ({key}s held per rank: "
                           f"{held}); resume from the last checkpoint", kind="timeout")
        return chosen

    def _take_over_lock(self, gone: tuple[Peer, ...]) -> Peer | None:
        """The lost rank 0's run lock, for the new rank 0: free as soon as the kernel has
        dropped the dead holder's ``flock``; on a shared file system that counts the dead node
        alive a while longer, retried until the timeout. A holder that the MPI declared failed
        but that is alive on this host (stopped or hung: ULFM's heartbeat detector declares such
        a process failed) would hold it for ever, and would write to the run folder as a second
        rank 0 if it went on: it is ended (SIGKILL; returned), the fence a lost writer gets.
        Until then the other survivors wait for this rank in their next collective, so the
        retries must not outlast their timeout."""
        until = time.monotonic() + self.timeout
        fenced = None
        while True:
            try:
                self.lock.acquire()
                return fenced
            except RunLocked as locked:
                if fenced is None:
                    fenced = _end_lost_holder(locked.holder, gone)
                if time.monotonic() > until:
                    raise
                time.sleep(0.05 if fenced else 0.5)

    # ------------------------------------------------------------------------- the end
    def end(self, *, stopped: bool, finished: bool, at: str, frames: int, update: int,
            checkpoint: Path | str | None = None) -> None:
        """Say how the job ended, in log.txt and to the elastic supervisor: ``finished`` (its
        budget spent or its target reached), or ``stopped`` at ``at`` (e.g. ``"update 12"``) by a
        signal or for ranks that rejoin, after saving ``checkpoint``."""
        # After a requeue request SLURM ends the job with SIGTERM while it still tears down; a rank
        # killed before MPI_Finalize leaves MPICH's shared-memory segment behind and the requeued
        # job would hang on it: ignore SIGTERM from here (SIG_IGN: Python drops its own handlers
        # before mpi4py's MPI_Finalize runs).
        self.signals.uninstall(ignore_term=stopped and self.signals.requeue)
        self._ended = True
        if stopped and self.signals.requeue and self.rank == 0:
            self.log.info(requeue_slurm_job())
        elif stopped and self.signals.rejoin:
            self.log.info(f"stopped at {at} after saving the checkpoint: the elastic supervisor "
                          "relaunches the job with the ranks that rejoin")
        elif stopped:
            self.log.info(f"stopped by signal at {at} after saving the checkpoint")
        if self.rank == 0 and finished:
            elastic.write_finished(frames=frames, update=update)
        elif self.rank == 0 and stopped and self.signals.rejoin:
            elastic.write_stopped_for_rejoin(frames=frames, update=update, checkpoint=str(checkpoint))

    def _rescued_before(self, exc: BaseException) -> bool:
        """Whether the survivors' state was saved and the loss recorded already, on the supervisor's
        dead verdict (:meth:`_on_dead`); ``exc`` (this thread's timeout) then carries that rescue's
        line, and the run's exit records no second loss."""
        with self._rescuing:
            done = self._rescued
        if done is None or done is exc or not getattr(done, "recorded", False):
            return False
        exc.recorded = getattr(done, "recorded", False)
        if getattr(done, "rescued", None):
            exc.rescued = done.rescued
        return True

    def _on_dead(self, ranks: list[int]) -> None:
        """The elastic supervisor found ``ranks`` of this launch dead (no heartbeat, or their
        environment worker failed, which they recorded before exiting). Runs on the
        heartbeat thread, while the main thread may wait in a collective for them that nothing
        but its deadline ends: the lowest survivor saves the last synchronised state and records
        the loss now (as :meth:`_report` does for a timeout), and ``log.txt`` says so."""
        if self.deadline is None or self.rescue is None:
            return  # nothing to save yet: the supervisor's grace ends the launch
        gone = self._peers_now(ranks)
        if not gone:
            return  # (ranks this job went on without in place already)
        folder = elastic.elastic_dir()
        failed = elastic.env_failures(folder, launch=elastic.launch_generation()) \
            if folder is not None else set()
        why = ("its environment worker failed (the rank recorded it and exited; found by the "
               "elastic supervisor)") if set(ranks) <= failed else \
            "no heartbeat (found dead by the elastic supervisor)"
        exc = PeerTimeout(f"{describe_ranks(gone)}: {why}", gone, "heartbeat")
        if failure_writer(exc, self.rank, self.size):
            line = self._rescue_once(exc)
            if line:
                record_stop(self.run_dir, line)
            self._write_loss()

    def _peers_now(self, ranks: list[int]) -> tuple[Peer, ...]:
        """The peers of the current communicator that the supervisor's ``ranks`` name. It numbers
        the launch's ranks; after :meth:`shrink` this communicator numbers the survivors anew, so
        each is found by its host and pid, and one gone already is left out."""
        peers = self.deadline.peers
        if peers is self._launch_peers:
            by_rank = {p.rank: p for p in peers}
            return tuple(by_rank.get(r, Peer(r, "?", 0)) for r in ranks)
        now = {(p.host, p.pid): p for p in peers}
        launch = self._launch_peers
        return tuple(now[(launch[r].host, launch[r].pid)] for r in ranks
                     if r < len(launch) and (launch[r].host, launch[r].pid) in now)

    def save_for_survivors(self, exc: BaseException, snap: dict[str, Any] | None, *, step: int,
                           update: int, frames: int, point: str, what: str,
                           saved: str | None = None) -> str | None:
        """What :attr:`rescue` does in both stacks: on the lowest surviving rank after ranks were
        lost, write ``snap`` (the loop's last synchronised state; None: nothing to save) as the
        checkpoint of ``step`` with the loss in it (over one of the same step, if there is one:
        the same state, now with the loss recorded for the run that continues from it), prepare
        the loss record for the supervisor (``update`` and ``frames`` in it) and return the line
        to report (None: nothing saved). ``point`` names the synchronised point (``"update"``,
        ``"evaluation"``), ``what`` its position for the line (``"update 12, 768 frames"``),
        ``saved`` the same for the supervisor's line (``"step 40 (640 samples)"``; None: the
        update and frames)."""
        if snap is None:
            return None
        named = elastic.named(getattr(exc, "ranks", ()) or (), self.deadline.peers)
        try:
            snap = dict(snap, lost={"ranks": named, "detected_at": time.time(),
                                    "world_size": self.size})
            path = self.ckpts.save(snap, step=step)
        except (CheckpointError, OSError) as save_exc:
            why = describe_failure(save_exc)[1]
            self.record_loss(writer=self.rank, world_size=self.size, lost=named, checkpoint=None,
                             update=None, frames=None, why=str(exc), state_error=why)
            exc.recorded = True
            return f"{describe_failure(exc)[1]} (the survivors' state could not be saved: {why})"
        self.record_loss(writer=self.rank, world_size=self.size, lost=named, checkpoint=str(path),
                         update=update, frames=frames, why=str(exc), saved=saved)
        exc.recorded = True
        line = (f"{exc}. The survivors saved the state of the last synchronised {point} ({what}) "
                f"to {path}: resume from it, or run under python -m wagma_rl.elastic to go on "
                "without the lost ranks by itself")
        exc.rescued = line  # the line run_main prints on this rank
        return line

    def record_loss(self, **record: Any) -> None:
        """For :attr:`rescue`: the loss record for the elastic supervisor
        (:func:`wagma_rl.elastic.write_loss`'s arguments), written once ``log.txt`` has the
        stop's line: the supervisor ends the launch as soon as it reads the record, so it is
        this rank's last write."""
        self._loss = record

    def _write_loss(self) -> None:
        loss, self._loss = self._loss, None
        if loss is not None:
            elastic.write_loss(**loss)

    def _rescue_once(self, exc: BaseException) -> str | None:
        """:attr:`rescue` for ``exc``, once per job whichever thread asks first (the heartbeat's
        verdict or the main thread's timeout); None when it saved nothing or ran already."""
        with self._rescuing:
            if self._rescued is not None:
                return None
            self._rescued = exc
            with self._writing:
                return self.rescue(exc)

    def _report(self, exc: BaseException) -> None:
        """The exit policy: the line ``log.txt`` gets (``stopped: <why>``, written by one rank),
        and after lost ranks the survivors' state saved through :attr:`rescue`."""
        kind, line = describe_failure(exc)
        if kind == "config" and self.log is None:
            return  # a refused start: the user fixes the command, the run folder stays as it was
        if kind == "crash":
            line = f"rank {self.rank}: {line}"
        if kind == "timeout" and self._rescued_before(exc):
            return  # (its line is in log.txt already)
        if kind == "timeout" and self.rescue is not None:
            if failure_writer(exc, self.rank, self.size):
                line = self._rescue_once(exc) or line
            else:
                exc.rescued = (f"{exc}. The lowest surviving rank saves the state of the last "
                               "synchronised update as a checkpoint (see log.txt)")
        # (Not into the log of another live run that holds the folder.)
        if (kind == "crash" or failure_writer(exc, self.rank, self.size)) and \
                not (isinstance(exc, JobError) and RunLocked.marker in str(exc)):
            record_stop(self.run_dir, line)
        self._write_loss()
