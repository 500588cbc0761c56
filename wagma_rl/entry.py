"""The start both command lines share (``run_ddppo.py`` and ``python -m wagma_rl.supervised``).

:func:`run_entry` does, in order, what an entry point does before its own work: it catches the stop
signals (acted on at the first synchronised point, so a SLURM signal that comes while torch and MPI
still load does not kill the rank), keeps torch to one thread per rank, refuses a launch that cannot
be the job the user meant (``wagma_rl.job.launch``), and runs the entry point's body under the
project's exit policy (``wagma_rl.job.exits.run_main``). Importing this module starts neither torch
nor MPI (:func:`first_process` serves ``--print-config`` on a login node).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

__all__ = ["first_process", "run_entry"]


def first_process() -> bool:
    """Whether this is the job's first process, known before MPI starts (the launcher's rank)."""
    return os.environ.get("SLURM_PROCID", os.environ.get("PMI_RANK", "0")) == "0"


def run_entry(body: Callable[[Any], Any], *, prog: str, signals: bool = True) -> int:
    """Run an entry point's ``body(signals)`` on every rank and return the exit status.

    ``signals``: install the stop signals' handlers first (SIGTERM, SIGINT, SIGUSR1: a
    :class:`~wagma_rl.job.signals.StopSignals` handed to ``body``, whose job acts on them; they are
    removed again at the end); without, ``body`` gets None. A launch that cannot be the job the
    user meant (``srun`` without a PMI) is one line and status 2; ``body``'s failures follow
    :func:`~wagma_rl.job.exits.run_main`."""
    # Before torch starts its thread pools: one thread per rank (ranks already fill the cores).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    stop = None
    if signals:
        from wagma_rl.job.signals import StopSignals

        # One rank of the job says it for all (the rank is not known before MPI starts).
        stop = StopSignals(announce=first_process()).install()
    try:
        from mpi4py import MPI  # (after wagma_rl's MPI settings: this module is in the package)

        from wagma_rl.job.exits import run_main
        from wagma_rl.job.launch import launch_problem

        if stop is not None:  # the rank is known now: rank 0 speaks for the job
            stop.announce = MPI.COMM_WORLD.Get_rank() == 0
        problem = launch_problem(MPI.COMM_WORLD.Get_size())
        if problem:  # every process is a world of one here: only SLURM's first task says it
            if os.environ.get("SLURM_PROCID", "0") == "0":
                print(f"{prog}: error: {problem}", file=sys.stderr, flush=True)
            return 2
        return run_main(lambda: body(stop), prog=prog)
    finally:
        if stop is not None:
            stop.uninstall()  # (nothing left to do where the job removed them already)
