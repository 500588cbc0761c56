"""What every raw result file records about the run that made it: when, from which commit (and
whether the tree had uncommitted changes), on which host (CPU model, cores, load at start and end),
with which Python, torch and MPI library, and the full command.

A benchmark calls :func:`facts` when it starts and :func:`write_raw` (or :func:`finish`) when it
ends; the file it writes is ``{"facts": {...}, <its own keys>}``. ``tests/test_results_provenance.py``
checks that every raw JSON file under ``benchmarks/results/`` written since has these keys, and
that the results pages link a raw file beside their tables.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# The keys a raw file's "facts" holds (test_results_provenance.py reads this tuple).
REQUIRED = ("date", "commit", "dirty", "host", "cpu", "cores", "load", "load_end", "python",
            "torch", "mpi", "command")


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def checkout(folder: str | os.PathLike = ROOT) -> tuple[str, bool]:
    """The short commit of the git checkout ``folder`` ("" when it is none) and whether its
    tracked files differ from it."""
    head = _git("-C", str(folder), "rev-parse", "--short", "HEAD")
    return head, bool(_git("-C", str(folder), "status", "--porcelain", "--untracked-files=no"))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def _mpi_library() -> str:
    try:
        from mpi4py import MPI
        return MPI.Get_library_version().splitlines()[0].strip()
    except Exception:  # noqa: BLE001 - a fact for the record, not a requirement of the benchmark
        return "unknown"


#: Environment variables that tune the MPI library (MPICH's CVARs, Open MPI's MCA parameters,
#: PRRTE's), recorded in the facts when set.
MPI_TUNING = ("MPIR_CVAR_", "OMPI_MCA_", "PRTE_MCA_")


def _single_copy() -> str:
    """Whether MPICH's single-copy transfers are on for the ranks of this node (docs/mpi.md): the
    variable's value where it is set (by the user, or by a rank's own probe when this process is
    a rank), else what the probe a launched rank makes answers here; "unknown" without the
    project's package."""
    try:
        from native_coll.mpienv import CMA_VAR, cma_allowed
    except ImportError:
        return "unknown"
    if CMA_VAR in os.environ:
        return f"{'on' if os.environ[CMA_VAR] == '1' else 'off'} ({CMA_VAR}={os.environ[CMA_VAR]})"
    return "on (the ranks' probe)" if cma_allowed() else "off (the ranks' probe)"


def facts(device: str = "cpu", *, config: Any = None) -> dict[str, Any]:
    """The facts of this run at its start; ``config`` (anything JSON can hold) is recorded as given,
    the MPI tuning variables set (:data:`MPI_TUNING`) as ``mpi_env`` and whether the ranks copy
    large messages once (``mpi_single_copy``). ``load_end`` is filled by :func:`finish`."""
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch, torch_version = None, "none"
    commit, dirty = checkout()
    record = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  commit=commit, dirty=dirty,
                  host=platform.node(), cpu=_cpu_model(), cores=os.cpu_count(),
                  load=round(os.getloadavg()[0], 2), load_end=None,
                  python=platform.python_version(), torch=torch_version, mpi=_mpi_library(),
                  command=" ".join([Path(sys.executable).name, *sys.argv]))
    if config is not None:
        record["config"] = config
    # How the MPI library was tuned (e.g. MPIR_CVAR_CH4_CMA_ENABLE): the command line does not say.
    tuning = {k: v for k, v in sorted(os.environ.items()) if k.startswith(MPI_TUNING)}
    if tuning:
        record["mpi_env"] = tuning
    record["mpi_single_copy"] = _single_copy()
    if torch is not None and device.startswith("cuda") and torch.cuda.is_available():
        record["gpu"] = torch.cuda.get_device_name(0)
    return record


def finish(record: dict[str, Any]) -> dict[str, Any]:
    """Stamp the end of the run (load and time) on ``record``; returns it."""
    record["load_end"] = round(os.getloadavg()[0], 2)
    record["date_end"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return record


def beside(table: str | os.PathLike) -> Path:
    """The raw file that goes with the Markdown table ``table`` (``x.md`` -> ``x.json``)."""
    return Path(table).with_suffix(".json")


def write_raw(path: str | os.PathLike, record: dict[str, Any], **data: Any) -> Path:
    """Write ``{"facts": record (finished), **data}`` to ``path`` whole (a temporary file, then a
    rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"facts": finish(record), **data}, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path
