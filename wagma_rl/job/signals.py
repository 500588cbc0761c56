"""Graceful stop on cluster signals, as DD-PPO does: SIGUSR1 = save and requeue, SIGTERM and
SIGINT (Ctrl-C) = save and exit. The handlers only set flags; the loop acts on them at the next
point where all workers are in step (so every worker stops at the same update and the checkpoint
is consistent). A second SIGINT means "now": it raises KeyboardInterrupt, which the entry point
turns into an immediate exit without a checkpoint."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading

__all__ = ["StopSignals", "requeue_slurm_job"]


class StopSignals:
    """Flags set by SIGTERM and SIGINT (``stop``) and SIGUSR1 (``stop`` and ``requeue``)."""

    def __init__(self, *, announce: bool = True):
        self.announce = announce  # one rank of a job says it for all
        self.stop = False
        self.requeue = False
        self.rejoin = False  # set by the trainer: the elastic supervisor asked for a relaunch
        self._old: dict[int, object] = {}
        self._interrupted = False

    def install(self) -> "StopSignals":
        """Install the handlers (main thread only; elsewhere this is a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        from wagma_rl.elastic import hydra_notifies

        # Under the elastic supervisor's mpiexec (-disable-auto-cleanup) Hydra sends SIGUSR1 to
        # every rank when one ends, itself included: it means nothing to the job there.
        usr1 = signal.SIG_IGN if hydra_notifies() else self._on_usr1
        for sig, handler in ((signal.SIGTERM, self._on_term), (signal.SIGUSR1, usr1),
                             (signal.SIGINT, self._on_int)):
            self._old[sig] = signal.signal(sig, handler)
        return self

    def uninstall(self, *, ignore_term: bool = False) -> None:
        """Put the previous handlers back; with ``ignore_term``, ignore SIGTERM from now on instead
        (a run that asked SLURM to requeue its job finishes tearing down when SLURM ends it)."""
        from wagma_rl.elastic import hydra_notifies

        for sig, old in self._old.items():
            ignore = (ignore_term and sig == signal.SIGTERM) or (sig == signal.SIGUSR1 and hydra_notifies())
            signal.signal(sig, signal.SIG_IGN if ignore else old)
        self._old.clear()

    def _on_term(self, signum, frame) -> None:
        self.stop = True

    def _on_int(self, signum, frame) -> None:
        if self._interrupted:
            raise KeyboardInterrupt  # the second Ctrl-C: stop at once
        self._interrupted = True
        self.stop = True
        if self.announce:
            print("Ctrl-C: saving a checkpoint at the next synchronised update and stopping "
                  "(press Ctrl-C again to stop at once, without saving)", flush=True)

    def _on_usr1(self, signum, frame) -> None:
        self.stop = True
        self.requeue = True


def requeue_slurm_job() -> str:
    """Ask SLURM to requeue this job (``scontrol requeue $SLURM_JOB_ID``); return what happened."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return "SIGUSR1: not under SLURM (no SLURM_JOB_ID), so nothing to requeue"
    if shutil.which("scontrol") is None:
        return f"SIGUSR1: scontrol not found, cannot requeue job {job}"
    proc = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"SIGUSR1: scontrol requeue {job} failed: {proc.stderr.strip()}"
    return f"SIGUSR1: requeued SLURM job {job}"
