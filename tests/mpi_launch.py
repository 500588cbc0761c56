"""Launch multi-rank tests under mpiexec from pytest.

Multi-rank behaviour is specified by pytest modules under ``tests/mpi/`` that every rank runs under
``mpiexec`` (the mpi4py test-suite pattern: the same test class at several rank counts). The outer
pytest process parametrizes over rank counts and calls :func:`mpi_pytest`, which fails with the ranks'
combined output when any rank fails, and kills the whole job when it runs past its timeout.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from native_coll.mpienv import mpiexec_path, with_netmod, with_sleeping_waits
from procs import start_time

__all__ = ["REPO", "mpiexec_path", "mpi_command", "mpi_env", "python_pids", "mpi_run", "mpi_pytest",
           "mpi_pytest_shared", "assert_module_passed", "Running", "start_time", "stopped"]

REPO = Path(__file__).resolve().parents[1]


def mpi_command(nprocs: int, argv: list[str], *, cluster=None,
                mpiexec_args: tuple[str, ...] = ()) -> list[str]:
    """The mpiexec command line that runs ``python argv`` on ``nprocs`` ranks.

    With ``cluster`` (a :class:`cluster.netns.Cluster`) the ranks are spread evenly over its nodes
    (``nprocs / nodes`` per node) and mpiexec itself runs on the first node. ``mpiexec_args`` go
    to mpiexec before the program.
    """
    if cluster is None:
        return [mpiexec_path(), *mpiexec_args, "-n", str(nprocs), sys.executable, *argv]
    return cluster.launch_command(mpiexec_path(), nprocs, [sys.executable, *argv],
                                  extra=mpiexec_args)


def mpi_run(nprocs: int, argv: list[str], *, timeout: float = 300.0, env: dict | None = None,
            cwd: Path | None = None, cluster=None) -> subprocess.CompletedProcess:
    """Run ``argv`` (a command after ``python``) on ``nprocs`` ranks; return the finished process.

    Output of all ranks is captured together. The job is killed after ``timeout`` seconds and
    reported as a failure, so a deadlock never hangs the suite. ``cluster``: see :func:`mpi_command`.
    """
    full_env = mpi_env(timeout, env, sleeping_waits=cluster is None)
    cmd = mpi_command(nprocs, argv, cluster=cluster)
    try:
        return subprocess.run(cmd, cwd=cwd or REPO, env=full_env, capture_output=True, text=True,
                              timeout=timeout + 30)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        raise AssertionError(f"mpiexec -n {nprocs} {' '.join(argv)} timed out after {timeout}s\n{out}")


def mpi_env(timeout: float, env: dict | None = None, *, sleeping_waits: bool = True) -> dict:
    """The environment the ranks run with: the repo on PYTHONPATH, one thread per rank, MPICH's OFI
    network module and sleeping waits, Hydra's own kill at ``timeout`` + 5 s, then ``env`` (a
    value of None leaves that variable out)."""
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONPATH", str(REPO))
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.setdefault("MKL_NUM_THREADS", "1")
    # What docs/cluster.md tells users to export: MPICH's OFI network module between hosts (the
    # UCX one stalls the collective's polled messages; native_coll/mpienv.py).
    with_netmod(full_env)
    # `make test` runs 3 workers on 2 cores: every launch shares the cores with others, so MPICH's
    # waits always sleep (a rank's own rule, native_coll.mpienv.with_yield, counts only its job's
    # ranks). At 2 ranks this halved the CPU of the specification launch. Not across namespaced
    # nodes (``sleeping_waits=False``): there each rank keeps its own rule, as the node-fault
    # tests' timing was measured with (with sleeping waits, Hydra once killed both survivors of a
    # lost node before either had named it).
    if sleeping_waits:
        with_sleeping_waits(full_env)
    # Hydra's own limit as a second line of defence; it kills every rank.
    full_env["MPIEXEC_TIMEOUT"] = str(int(timeout) + 5)
    for name, value in (env or {}).items():  # (None: leave the variable out)
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    return full_env


def mpi_pytest(nprocs: int, module: str, *, timeout: float = 300.0, select: str | None = None,
               env: dict | None = None, cluster=None) -> None:
    """Run the pytest module ``module`` (path relative to the repo) on ``nprocs`` ranks.

    Every rank runs the same tests; any failing rank fails the call with all ranks' output.
    ``select`` is passed to pytest's ``-k``.
    """
    argv = ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", module]
    if select:
        argv += ["-k", select]
    proc = mpi_run(nprocs, argv, timeout=timeout, env=env, cluster=cluster)
    if proc.returncode != 0:
        where = f" on {len(cluster.nodes)} nodes" if cluster is not None else ""
        raise AssertionError(
            f"{module} failed at {nprocs} ranks{where} (exit {proc.returncode}):\n"
            f"--- stdout ---\n{proc.stdout[-20000:]}\n--- stderr ---\n{proc.stderr[-8000:]}")


def mpi_pytest_shared(nprocs: int, modules: list[str], *, timeout: float = 600.0,
                      select: str | None = None, env: dict | None = None,
                      cluster=None) -> subprocess.CompletedProcess:
    """Run several pytest modules in one launch on ``nprocs`` ranks (each rank one pytest session
    over them, ``-x``: a failure stops the launch, so no later module runs against a broken job);
    return the finished process for :func:`assert_module_passed`. The ranks start once instead of
    once per module: a start costs each rank about 2.5 CPU-s (torch, MPI, pytest)."""
    argv = ["-m", "pytest", "-q", "-x", "-rA", "-p", "no:cacheprovider", *modules]
    if select:
        argv += ["-k", select]
    return mpi_run(nprocs, argv, timeout=timeout, env=env, cluster=cluster)


def assert_module_passed(proc: subprocess.CompletedProcess, module: str) -> None:
    """``module``'s outcome in a :func:`mpi_pytest_shared` launch: it ran, none of its tests
    failed on any rank, and the launch succeeded; else fail with the launch's output."""
    failed = sorted(set(re.findall(rf"(?:FAILED|ERROR) {re.escape(module)}::\S+", proc.stdout)))
    why = ", ".join(failed) or "none of its own (another module failed, or it never ran)"
    assert proc.returncode == 0 and not failed and f"PASSED {module}::" in proc.stdout, (
        f"{module} failed in a launch shared with other modules (exit {proc.returncode}); its "
        f"failures: {why}\n--- stdout ---\n{proc.stdout[-20000:]}\n"
        f"--- stderr ---\n{proc.stderr[-8000:]}")


def python_pids(marker: str) -> list[int]:
    """Python processes (the ranks, not mpiexec) whose command line contains ``marker``, sorted."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"python" in Path(argv[0].decode(errors="replace")).name.encode() \
                and any(marker.encode() in a for a in argv):
            pids.append(int(d.name))
    return sorted(pids)


class Running:
    """A job a test starts in the background and acts on while it runs, waited for with a bound.

    Either a process (``argv``: in a session of its own, its stdout and stderr collected line by
    line in :attr:`lines` as they come) or a call on a thread of its own (``call``; ``group()``
    gives the process group it started, or None). Every wait is bounded: past it, or when the job
    ends before what was waited for, the job's process group is killed and the test fails with
    the job's output and ``context()`` (e.g. the run's log), never hangs.
    """

    def __init__(self, argv: list[str] | None = None, *, env: dict | None = None,
                 cwd: Path | None = None, call: Callable[[], object] | None = None,
                 group: Callable[[], int | None] = lambda: None,
                 context: Callable[[], str] = lambda: "", keep_lines: int = 0):
        if (argv is None) == (call is None):
            raise ValueError("Running needs argv (a process) or call (a function), not both")
        self.lines: list[str] = []
        self._context, self._keep, self._outcome = context, keep_lines, []
        if argv is not None:
            self.proc = subprocess.Popen(argv, cwd=cwd or REPO, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True,
                                         start_new_session=True)
            self._group = lambda: self.proc.pid
            self.thread = threading.Thread(target=self._read, daemon=True)
        else:
            self.proc, self._group = None, group
            self.thread = threading.Thread(target=lambda: self._outcome.append(_outcome(call)),
                                           daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        """The process's output so far (its last ``keep_lines`` lines where that was given)."""
        return "\n".join(self.lines[-self._keep:] if self._keep else self.lines)

    def running(self) -> bool:
        return self.proc.poll() is None if self.proc is not None else self.thread.is_alive()

    def kill(self) -> None:
        """SIGKILL the job's process group; wait for the process (and its output's last lines,
        5 s: a rank on another node may hold the pipe a while), or for the call's thread (30 s)."""
        pid = self._group()
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            self.proc.wait()
        self.thread.join(5 if self.proc is not None else 30)

    def fail(self, why: str, shown: str = "") -> None:
        """Kill the job and fail the test with ``why``, the job's output, ``shown`` and the
        job's context."""
        self.kill()
        raise AssertionError("\n".join(part for part in (f"{why}:", self.output, shown,
                                                           self._context()) if part))

    def poll_until(self, done: Callable[[], bool], limit_s: float, poll_s: float = 0.2) -> bool:
        """Poll ``done()`` until it holds (True), the job ends or ``limit_s`` passes (False)."""
        end = time.monotonic() + limit_s
        while not done():
            if time.monotonic() > end or not self.running():
                return False
            time.sleep(poll_s)
        return True

    def wait_until(self, done: Callable[[], bool], what: str, limit_s: float, *,
                   shown: Callable[[], str] = lambda: "", poll_s: float = 0.2) -> None:
        """:meth:`poll_until`, failing (the job killed) if ``done()`` never held; the failure
        shows ``shown()`` besides the job's output."""
        if not self.poll_until(done, limit_s, poll_s):
            self.fail(f"no {what} within {limit_s} s", shown())

    def wait_for_line(self, pattern: str, text: Callable[[], str], limit_s: float) -> None:
        """Wait until ``text()`` (e.g. a run's log) has a line matching ``pattern``."""
        self.wait_until(lambda: re.search(pattern, text(), re.M) is not None, f"'{pattern}'",
                        limit_s, shown=lambda: f"--- the text so far\n{text()[-3000:]}")

    def result(self, limit_s: float):
        """The process's exit code, or the call's return value (its exception is raised here);
        fails the test, killing the job, if it is still running after ``limit_s`` seconds."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout=limit_s)
            except subprocess.TimeoutExpired:
                self.fail(f"the job was still running after {limit_s} s")
            self.thread.join(timeout=5)  # the last lines of its output
            return self.proc.returncode
        self.thread.join(limit_s)
        if self.thread.is_alive():
            self.fail(f"the job was still running after {limit_s} s")
        if isinstance(self._outcome[0], BaseException):
            raise self._outcome[0]
        return self._outcome[0]


class RunningTraining(Running):
    """A training job started in the background (:class:`Running`) whose run folder
    (``run_dir``, set before ``super().__init__``) a test reads as it goes."""

    run_dir: Path

    def log(self) -> str:
        """The run's log.txt so far ("" before it exists)."""
        path = self.run_dir / "log.txt"
        return path.read_text() if path.exists() else ""

    def wait_for(self, pattern: str, limit_s: float) -> None:
        """Wait until a line of log.txt matches ``pattern`` (a regular expression)."""
        self.wait_until(lambda: re.search(pattern, self.log(), re.M) is not None,
                        f"'{pattern}' in log.txt", limit_s)


@contextlib.contextmanager
def stopped(pid: int):
    """SIGSTOP the process ``pid`` for the block (its value: when, ``time.time()``); SIGKILL it
    after, so that a stopped rank never outlives its test. Only if it is still that process: a
    launcher may have ended it meanwhile and its pid gone to another test's process."""
    started = start_time(pid)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield time.time()
    finally:
        try:
            if started is not None and start_time(pid) == started:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _outcome(call):
    try:
        return call()
    except BaseException as exc:  # (raised in the test's thread by Running.result)
        return exc
