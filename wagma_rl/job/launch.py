"""Launcher mistakes caught before any work: a job whose processes cannot be the MPI job the user
meant (see docs/cluster.md for the launch commands that work)."""
from __future__ import annotations

import os
from typing import Mapping

__all__ = ["launch_problem"]


def launch_problem(world_size: int, environ: Mapping[str, str] = os.environ) -> str | None:
    """A one-line description of what is wrong with how this process was started, or None.

    ``srun`` without a PMI the MPI library speaks (``--mpi=none``, the default of many clusters)
    starts ``SLURM_STEP_NUM_TASKS`` processes that each see an MPI world of one: every one would
    train alone and all would write the same run folder.
    """
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    if world_size == 1 and tasks.isdigit() and int(tasks) > 1:
        return (f"srun started {tasks} tasks but MPI sees a world of 1 in each: srun gave them no "
                "PMI that this MPI reads; launch with 'srun --mpi=pmi2' (see docs/cluster.md)")
    return None
