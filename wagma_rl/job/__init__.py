"""What every training job has around its loop, in one place: the run folder and its lock, the
bounded communicator (:class:`BoundedComm`), the log, agreed checkpoints, stop signals, the device and
the exit policy. :class:`Job` ties them together for the RL trainer and the supervised jobs.

``Job`` is imported on first use: the entry points import ``wagma_rl.job.signals`` to catch the
stop signals before torch loads (a SLURM warning that comes during a slow start must not kill
the rank), and a refused command line exits without loading torch at all."""
from __future__ import annotations

__all__ = ["Job"]


def __getattr__(name: str):
    if name == "Job":
        from .lifecycle import Job

        return Job
    raise AttributeError(f"module 'wagma_rl.job' has no attribute {name!r}")
