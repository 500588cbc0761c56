"""wagma_rl.job.Job, the lifecycle both training loops run in (one process here; every rank
together: tests/mpi/job_cases.py)."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

from mpi_launch import mpi_pytest
from wagma_rl import elastic
from wagma_rl.job import Job
from wagma_rl.job.exits import JobError
from wagma_rl.job.run_config import RunConfig


def config(tmp_path: Path) -> RunConfig:
    return RunConfig(dir=str(tmp_path), name="run", tensorboard=False)


def test_nothing_but_the_lock_is_written_before_the_log_opens(tmp_path):
    run = config(tmp_path)
    with Job(MPI.COMM_SELF, run=run, timeout=5) as job:
        job.start(lambda: (None, None, ["skipped checkpoint: a note"]))
        assert [p.name for p in Path(run.run_dir()).iterdir()] == [".lock"]
        job.open_log()
    assert "skipped checkpoint: a note" in (Path(run.run_dir()) / "log.txt").read_text()


def test_a_folder_another_live_run_holds_is_refused_and_its_log_left_alone(tmp_path):
    run = config(tmp_path)
    with Job(MPI.COMM_SELF, run=run, timeout=5) as first:
        first.start(lambda: (None, None, []))
        first.open_log().info("the first run")
        with pytest.raises(JobError, match="is in use by another run"):
            with Job(MPI.COMM_SELF, run=run, timeout=5) as second:
                second.start(lambda: (None, None, []))
    assert "stopped:" not in (Path(run.run_dir()) / "log.txt").read_text()


def test_a_failure_in_the_loop_is_one_stopped_line_in_the_log(tmp_path):
    run = config(tmp_path)
    with pytest.raises(JobError):
        with Job(MPI.COMM_SELF, run=run, timeout=5) as job:
            job.start(lambda: (None, None, []))
            job.open_log()
            raise JobError("the data folder vanished; restore it, then resume")
    lines = (Path(run.run_dir()) / "log.txt").read_text().splitlines()
    assert lines[-1].endswith("stopped: the data folder vanished; restore it, then resume")


def test_the_lock_and_the_signal_handlers_are_released_at_the_end(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    run = config(tmp_path)
    with Job(MPI.COMM_SELF, run=run, timeout=5) as job:
        job.start(lambda: (None, None, []))
        assert signal.getsignal(signal.SIGTERM) != before
    assert signal.getsignal(signal.SIGTERM) == before
    with Job(MPI.COMM_SELF, run=run, timeout=5) as again:  # the folder is free again
        again.start(lambda: (None, None, []))


def test_a_failure_while_the_job_starts_puts_the_signal_handlers_back(tmp_path, monkeypatch):
    import wagma_rl.job.lifecycle as lifecycle

    def no_device(name, comm):
        raise JobError("run.device=cuda: no GPU here; use run.device=cpu")

    monkeypatch.setattr(lifecycle, "resolve_device", no_device)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(JobError, match="no GPU here"):
        with Job(MPI.COMM_SELF, run=config(tmp_path), timeout=5):
            pass
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_finished_job_tells_the_elastic_supervisor(tmp_path, monkeypatch):
    (tmp_path / "elastic").mkdir()  # the supervisor makes it
    monkeypatch.setenv(elastic.ELASTIC_DIR_ENV, str(tmp_path / "elastic"))
    with Job(MPI.COMM_SELF, run=config(tmp_path), timeout=5) as job:
        job.start(lambda: (None, None, []))
        job.open_log()
        job.end(stopped=False, finished=True, at="update 3", frames=96, update=3)
    assert elastic.finished(tmp_path / "elastic")["update"] == 3


def test_a_rejoin_request_stops_the_job_and_tells_the_supervisor_where_it_saved(tmp_path, monkeypatch):
    folder = tmp_path / "elastic"
    folder.mkdir()  # the supervisor makes it
    monkeypatch.setenv(elastic.ELASTIC_DIR_ENV, str(folder))
    elastic.request_rejoin(folder, ["nodeb"])
    run = config(tmp_path)
    with Job(MPI.COMM_SELF, run=run, timeout=5) as job:
        job.start(lambda: (None, None, []))
        job.open_log()
        job.check_rejoin("update 4")
        assert job.stop_requested
        path = job.save({"update": 4}, step=4)
        job.end(stopped=True, finished=False, at="update 4", frames=128, update=4, checkpoint=path)
    assert elastic.stopped_for_rejoin(folder)["checkpoint"] == str(path)
    assert "stopped at update 4 after saving the checkpoint" in (Path(run.run_dir()) / "log.txt").read_text()


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_job_on_every_rank(nprocs):
    mpi_pytest(nprocs, "tests/mpi/job_cases.py", timeout=120)


def test_the_stop_signals_are_caught_before_torch_loads():
    # run_entry installs the handlers first; a SLURM warning (--signal=USR1@N) that comes while a
    # loaded node still imports torch must find them (the default action of SIGUSR1 kills the
    # rank). wagma_rl.job loads Job, and with it torch, only on first use.
    code = ("import sys, wagma_rl.entry, wagma_rl.job.signals; "
            "print(sorted(m for m in ('torch', 'mpi4py.MPI') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
