"""Multi-rank supervised runs (tests/mpi/supervised_cases.py under mpiexec)."""
import pytest

from mpi_launch import mpi_pytest, mpi_run

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [2])
def test_supervised_runs_with_every_optimizer(nprocs):
    mpi_pytest(nprocs, "tests/mpi/supervised_cases.py", timeout=180)


def test_a_group_larger_than_the_job_shrinks_to_it_on_every_rank(tmp_path):
    # As the RL trainer does: averaging.group_size=4 at 2 ranks averages in groups of 2, one log line.
    proc = mpi_run(2, ["-m", "wagma_rl.supervised", "--config", "configs/resnet_shapes.yaml",
                       "data.image_size=8", "model.width=4", "data.train_size=256",
                       "data.val_size=128", "train.batch_size=8", "train.steps=2",
                       "train.eval_every=2", "averaging.group_size=4", f"run.dir={tmp_path}"],
                   timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    note = "averaging.group_size=4 is larger than the job (2 ranks): WAGMA averages in groups of 2"
    assert (tmp_path / "log.txt").read_text().count(note) == 1
