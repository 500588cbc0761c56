"""wagma_rl.job.Job on every rank: the start rank 0 decides reaches every rank together (the
checkpoint's contents, or the problem), and checkpoints are agreed."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from mpi4py import MPI

from wagma_rl.config import ConfigError
from wagma_rl.job import Job
from wagma_rl.job.exits import JobError
from wagma_rl.job.run_config import RunConfig

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


@pytest.fixture
def run():
    base = COMM.bcast(tempfile.mkdtemp(prefix="job_cases_") if RANK == 0 else None, root=0)
    return RunConfig(dir=base, name="run", tensorboard=False)


def test_every_rank_gets_the_checkpoint_rank_0_picked(run):
    state = {"model": torch.arange(4.0), "step": 7}
    with Job(COMM, run=run, timeout=20) as job:
        path, got = job.start(lambda: (Path("/nowhere/ckpt.pt"), state, ["a note"]))
    assert path == Path("/nowhere/ckpt.pt") and got["step"] == 7
    assert torch.equal(got["model"], torch.arange(4.0))


def test_a_config_problem_rank_0_finds_is_a_config_error_on_every_rank(run):
    def pick():
        raise ConfigError("config key 'run.dir': not usable")

    with pytest.raises(ConfigError, match="not usable"):
        with Job(COMM, run=run, timeout=20) as job:
            job.start(pick)


def test_a_bug_in_rank_0s_pick_stops_the_others_with_its_line(run):
    def pick():
        raise ZeroDivisionError("division by zero")

    expected = ZeroDivisionError if RANK == 0 else JobError
    with pytest.raises(expected) as info:
        with Job(COMM, run=run, timeout=20) as job:
            job.start(pick)
    if RANK:
        assert str(info.value) == "rank 0: ZeroDivisionError: division by zero"


def test_a_checkpoint_rank_0_cannot_write_stops_every_rank_with_one_line(run):
    with pytest.raises(JobError, match="cannot write") as info:
        with Job(COMM, run=run, timeout=20) as job:
            job.start(lambda: (None, None, []))
            job.open_log()
            path = job.save({"step": 1}, step=1)
            assert COMM.allgather(str(path)) == [str(path)] * SIZE  # every rank learns the path
            if RANK == 0:  # the checkpoints folder becomes a file: the next write fails
                ckpts = job.ckpts.path_for(2).parent
                for f in ckpts.iterdir():
                    f.unlink()
                ckpts.rmdir()
                ckpts.write_text("not a folder")
            job.save({"step": 2}, step=2)
    assert info.value.kind == "config"
    if RANK == 0:
        log = (Path(run.run_dir()) / "log.txt").read_text()
        assert "stopped: cannot write" in log  # the exit policy wrote it, once
        assert log.count("stopped:") == 1
