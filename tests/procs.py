"""Facts about this machine's processes for the tests' clean-ups, with no side effects at import
(tests/mpi_launch.py sets MPI variables in its importer's environment; this module does not)."""
from __future__ import annotations

from pathlib import Path

__all__ = ["start_time"]


def start_time(pid) -> int | None:
    """When process ``pid`` started (clock ticks since boot), None when there is none: with it a
    clean-up tells the process it saw from a later one that was given the same pid (pids wrap at
    32768 here, and the suite starts thousands of processes)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None
