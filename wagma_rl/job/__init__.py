"""What every training job has around its loop, in one place: the run folder and its lock, the
bounded communicator (:class:`Deadline`), the log, agreed checkpoints, stop signals, the device and
the exit policy. :class:`Job` ties them together for the RL trainer and the supervised jobs."""
from .lifecycle import Job

__all__ = ["Job"]
