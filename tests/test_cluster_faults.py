"""Faults across namespaced nodes: a killed node, killed ranks, a cut link (long and short).

tests/programs/collective_loop.py runs WAGMA's collective on 2 nodes x 2 ranks (n0: ranks 0, 1;
n1: ranks 2, 3) while the test breaks something; the job must end within the collective's timeout
(never hang), survivors must name the ranks they lost with their host, and a short cut must be
survived with the exact result.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from mpi_launch import Running, mpi_command, mpi_env

pytestmark = [pytest.mark.mpi, pytest.mark.cluster]

PROGRAM = "tests/programs/collective_loop.py"
TIMEOUT = 5.0  # the collective's timeout in the faulty runs


class Job(Running):
    """The loop program (or ``argv``) on ``nprocs`` ranks spread evenly across the cluster, its
    output collected as it comes."""

    def __init__(self, cluster, iterations: int, timeout: float, *, survivors_report: bool,
                 argv: list[str] | None = None, nprocs: int = 4):
        # -disable-auto-cleanup: Hydra lets the survivors of a dead rank run on, so they detect
        # the loss themselves (and report it) instead of being killed by the process manager.
        extra = ("-disable-auto-cleanup",) if survivors_report else ()
        argv = argv or [PROGRAM, str(iterations), str(timeout)]
        super().__init__(mpi_command(nprocs, argv, cluster=cluster, mpiexec_args=extra),
                         env=mpi_env(120, sleeping_waits=False))

    def wait_ready(self, deadline_s: float = 60.0) -> None:
        self.wait_until(lambda: sum(line.startswith("ready ") for line in self.lines) >= 4,
                        "start of every rank", deadline_s, poll_s=0.05)

    def wait(self, limit_s: float) -> float:
        """Seconds until the job ended; fails (killing it) past ``limit_s``."""
        t0 = time.monotonic()
        self.result(limit_s)
        return time.monotonic() - t0


def _kill(pids):
    """Kill ``pids`` as a node dies: all stopped first, so none of them runs (and reports the
    others' loss as a survivor would) between the first kill and the last."""
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _rank_pids(cluster, node):
    return [p for p in cluster.pids(node)
            if PROGRAM.encode() in open(f"/proc/{p}/cmdline", "rb").read()]


def _being_killed(pid: int) -> bool:
    """Whether ``pid`` is gone, a zombie, exiting, or has a SIGKILL pending: killed, even if a
    loaded machine has not yet run it to its end (the job's mpiexec may return before that)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    pending = [int(line.split()[1], 16) for line in status.splitlines()
               if line.startswith(("SigPnd:", "ShdPnd:"))]
    sigkill = 1 << (signal.SIGKILL - 1)
    pf_exiting = 0x4
    return stat[0] in "ZX" or bool(int(stat[6]) & pf_exiting) or any(p & sigkill for p in pending)


def _survivors(cluster, node):
    """The program's ranks in ``node`` that are still running and not already killed."""
    return [p for p in _rank_pids(cluster, node) if not _being_killed(p)]


def _reports(output: str) -> dict[int, str]:
    """The one-line reports of the survivors, by rank: the program's 'rank R on HOST: message'
    (an exception reached it) or the collective's exit report 'native_coll: rank R (host ...'
    (MPI aborted the rank from inside a call; native_coll/src/exit_report.c)."""
    pattern = r"^(?:native_coll: )?rank (\d+) (?:on \S+:|\(host ).*$"
    return {int(m.group(1)): m.group(0) for m in re.finditer(pattern, output, re.M)}


@pytest.fixture
def healthy(cluster):
    """The cluster with both links up and no process left in its nodes after the test."""
    yield cluster
    for node in cluster.nodes:
        cluster.link(node, up=True)
        _kill(cluster.pids(node))


def test_killing_every_process_of_a_node_ends_the_job_within_the_timeout(healthy):
    job = Job(healthy, 100_000, TIMEOUT, survivors_report=False)
    job.wait_ready()
    time.sleep(1.0)
    _kill(healthy.pids("n1"))  # the ranks and Hydra's proxy: the node is gone
    elapsed = job.wait(TIMEOUT + 10)
    assert job.proc.returncode != 0
    assert elapsed < TIMEOUT + 10
    assert _survivors(healthy, "n0") == []  # no survivor left behind


def test_survivors_of_killed_ranks_name_them_with_their_host(healthy):
    job = Job(healthy, 100_000, TIMEOUT, survivors_report=True)
    job.wait_ready()
    time.sleep(1.0)
    _kill(_rank_pids(healthy, "n1"))
    job.wait(TIMEOUT + 15)
    reports = _reports(job.output)
    # Every survivor that detects the loss names it. Not necessarily both: the first survivor that
    # MPICH aborts (a broken connection is fatal inside MPI) makes Hydra kill its node's other
    # ranks at once, and rank 0 may be killed before its own wait touched a lost peer (CI of
    # a211bb3: rank 1's report, then Hydra's SIGKILL of rank 0, which had printed nothing).
    # A survivor that MPICH aborts while it waits in a *group* iteration with its n0 partner (the
    # broken connection was another one, to n1) can only name what that call waited for: its
    # partner, with the line's hint at a lost node (a loaded run of the suite, 2026-11-27).
    assert reports and set(reports) <= {0, 1}, job.output
    for line in reports.values():
        named = [int(r) for r in re.findall(r"rank (\d+) \(host n1", line)]
        in_group = re.search(r"exiting inside MPI while group iteration \d+ was in flight; "
                             r"rank\(s\) \[[01]\] had not delivered.*a lost node", line)
        # Or that partner was the survivor MPICH aborted (and Hydra then killed): the other one,
        # waiting on it in a group iteration, reaches the timeout first and names it, on n0
        # (CI of 3412982, 2026-11-28: rank 0 timed out on rank 1).
        partner = re.search(r"group iteration \d+ did not complete within [\d.]+ s: "
                            r"rank\(s\) \[[01]\] did not answer.*"
                            r"missing: rank [01] \(host n0, pid \d+\)", line)
        assert (named and set(named) <= {2, 3}) or in_group or partner, line
    assert _survivors(healthy, "n0") == []  # no survivor left behind


def test_a_link_cut_longer_than_the_timeout_names_the_unreachable_ranks(healthy):
    job = Job(healthy, 100_000, TIMEOUT, survivors_report=True)
    job.wait_ready()
    time.sleep(1.0)
    healthy.link("n1", up=False)
    # 8 s past the timeout: on a loaded machine (make test's parallel workers) n1's ranks may run
    # seconds late, and they must have seen the timeout before the link comes back.
    time.sleep(TIMEOUT + 8)
    healthy.link("n1", up=True)  # the reports of n1's ranks travel to mpiexec on n0
    job.wait(30)
    reports = _reports(job.output)
    assert sorted(reports) == [0, 1, 2, 3], job.output
    for rank, line in reports.items():
        assert "did not answer" in line or "broke" in line, line
        other = "n1" if rank < 2 else "n0"
        assert f"host {other}" in line, line


def test_a_short_link_cut_is_survived_with_the_exact_result(healthy):
    iterations = 400  # ~5 s at 10 ms per iteration
    job = Job(healthy, iterations, 30.0, survivors_report=False)
    job.wait_ready()
    time.sleep(1.5)
    healthy.link("n1", up=False)
    time.sleep(1.0)
    healthy.link("n1", up=True)
    job.wait(90)
    assert job.proc.returncode == 0, job.output
    done = [line.split() for line in job.lines if line.startswith("done ")]
    assert len(done) == 4, job.output
    # late="apply" conserves the sum: ranks start at 0..3 and each adds 1 per iteration, so the
    # final global average is (0 + 1 + 2 + 3 + 4 * iterations) / 4 on every rank, bitwise equal.
    assert len({tuple(d[2:]) for d in done}) == 1, job.output
    assert float(done[0][2]) == pytest.approx(1.5 + iterations, abs=1e-3)


def test_training_on_a_lost_node_ends_and_resumes_from_its_last_checkpoint(healthy, tmp_path):
    # One rank per node (2 ranks): the job still loses a whole node and a rank on it, which is
    # what ends it; the loss of a node of several ranks is in the loop program's tests above
    # and tests/test_elastic_nodes.py's. The same frames after the resume (512) as at 4 ranks.
    from wagma_rl.job.checkpoint import CheckpointManager

    run_dir = tmp_path / "run"
    train = ["run_ddppo.py", "--config", "configs/quick_pointnav.yaml", f"run.dir={run_dir}",
             "run.total_frames=1000000", "averaging.timeout=10"]
    ckpts = CheckpointManager(run_dir)
    for attempt in (1, 2):
        job = Job(healthy, 0, 0, survivors_report=False, argv=train, nprocs=2)
        if job.poll_until(lambda: len(list((run_dir / "checkpoints").glob("ckpt_*.pt"))) >= 2,
                          120):
            break
        job.kill()
        # MPICH's OFI transport may fail a connection between the namespaces while the machine
        # is overloaded (seen once at start-up: "OFI poll failed ... Input/output error"): that
        # is not the fault under test, so the start is tried once more; anything else fails.
        if attempt == 2 or "OFI poll failed" not in job.output:
            pytest.fail(f"no checkpoint was written:\n{job.output}")
        shutil.rmtree(run_dir)
    _kill(healthy.pids("n1"))
    job.wait(10 + 10)
    assert job.proc.returncode != 0
    if job.proc.returncode == 3:  # the survivors stopped the job themselves (not Hydra's clean-up)
        last = (run_dir / "log.txt").read_text().splitlines()[-1]
        assert "stopped: " in last and "host n1" in last, last
    saved = ckpts.latest()
    frames_at_loss = int(re.match(r"ckpt_(\d+)\.pt", saved.name).group(1))
    resume = ["run_ddppo.py", "--resume", str(run_dir), f"run.total_frames={frames_at_loss + 512}"]
    job = Job(healthy, 0, 0, survivors_report=False, argv=resume, nprocs=2)
    job.wait(180)
    assert job.proc.returncode == 0, job.output
    assert f"frames {frames_at_loss}" in job.output, job.output  # "resumed from ...: frames N"
    final = int(re.match(r"ckpt_(\d+)\.pt", ckpts.latest().name).group(1))
    assert final >= frames_at_loss + 512
