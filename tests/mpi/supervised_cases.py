"""Multi-rank supervised runs: every optimizer trains the tiny image job end to end (under mpiexec)."""
import tempfile
from pathlib import Path

import pytest
from mpi4py import MPI

from wagma_rl.config import load_config
from wagma_rl.supervised import SupervisedConfig, train

REPO = Path(__file__).resolve().parents[2]


class TestSupervisedRun:
    COMM = MPI.COMM_WORLD

    @pytest.mark.parametrize("name", ["wagma", "allreduce", "local_sgd", "dpsgd", "nonblocking",
                                      "nonblocking_dpsgd"])
    def test_every_optimizer_trains_and_evaluates(self, name):
        run_dir = self.COMM.bcast(tempfile.mkdtemp(prefix="sup_") if self.COMM.rank == 0 else None)
        cfg = load_config(SupervisedConfig, REPO / "configs/resnet_shapes.yaml", [
            "data.image_size=8", "model.width=4", "data.train_size=512", "data.val_size=256",
            "train.batch_size=8", "train.steps=6", "train.eval_every=3", "run.log_interval=3",
            "averaging.micro_batches=2", "heterogeneity.stall_ranks=2", "heterogeneity.stall_s=0.01",
            f"averaging.name={name}", f"run.dir={run_dir}"])
        history = train(cfg, comm=self.COMM)
        assert [r["step"] for r in history] == [3, 6]
        # Every rank holds the same evaluation (the metrics are reduced over the ranks).
        assert all(h == history for h in self.COMM.allgather(history))
        assert history[-1]["samples"] <= 6 * 8 * self.COMM.size
        # The training loss of the batches since the previous evaluation (6 classes: about ln 6).
        assert all(0.0 < r["train_loss"] < 10.0 for r in history)
        if not name.startswith("nonblocking"):
            # The non-blocking rounds count a late rank's micro-batches when they enter a round:
            # those carried past the last step, and those never started, are not samples used.
            assert history[-1]["samples"] == 6 * 8 * self.COMM.size

    @pytest.mark.parametrize("name", ["wagma", "dpsgd"])  # group and global; ring (local_sgd: unit)
    def test_background_averages_train_and_evaluate(self, name):
        run_dir = self.COMM.bcast(tempfile.mkdtemp(prefix="sup_") if self.COMM.rank == 0 else None)
        cfg = load_config(SupervisedConfig, REPO / "configs/resnet_shapes.yaml", [
            "data.image_size=8", "model.width=4", "data.train_size=512", "data.val_size=256",
            "train.batch_size=8", "train.steps=6", "train.eval_every=3", "run.log_interval=3",
            f"averaging.name={name}", "averaging.background=true", "averaging.local_steps=2",
            f"run.dir={run_dir}"])
        history = train(cfg, comm=self.COMM)
        assert [r["step"] for r in history] == [3, 6]
        assert all(h == history for h in self.COMM.allgather(history))
        assert history[-1]["samples"] == 6 * 8 * self.COMM.size
        assert all(0.0 < r["train_loss"] < 10.0 for r in history)

    @pytest.mark.parametrize("target_metric,steps", [(0.0, [3]), (101.0, [3, 6])])
    def test_stops_at_the_first_evaluation_reaching_every_target_set(self, target_metric, steps):
        # A training-loss target of 100 is met at the first evaluation; accuracy never reaches 101%.
        run_dir = self.COMM.bcast(tempfile.mkdtemp(prefix="sup_") if self.COMM.rank == 0 else None)
        cfg = load_config(SupervisedConfig, REPO / "configs/resnet_shapes.yaml", [
            "data.image_size=8", "model.width=4", "data.train_size=512", "data.val_size=256",
            "train.batch_size=8", "train.steps=6", "train.eval_every=3", "averaging.name=allreduce",
            "train.target_loss=100", f"train.target_metric={target_metric}", f"run.dir={run_dir}"])
        history = train(cfg, comm=self.COMM)
        assert [r["step"] for r in history] == steps

    def test_a_group_larger_than_the_job_shrinks_to_it_on_every_rank(self, capfd):
        # As the RL trainer does: a group of twice the ranks averages in groups of all of them,
        # said in one log line.
        size = self.COMM.size
        run_dir = self.COMM.bcast(tempfile.mkdtemp(prefix="sup_") if self.COMM.rank == 0 else None)
        cfg = load_config(SupervisedConfig, REPO / "configs/resnet_shapes.yaml", [
            "data.image_size=8", "model.width=4", "data.train_size=256", "data.val_size=128",
            "train.batch_size=8", "train.steps=2", "train.eval_every=2",
            f"averaging.group_size={2 * size}", f"run.dir={run_dir}"])
        train(cfg, comm=self.COMM)
        note = (f"averaging.group_size={2 * size} is larger than the job ({size} "
                f"rank{'s' if size > 1 else ''}): WAGMA averages in groups of {size}")
        notes = self.COMM.bcast((Path(run_dir) / "log.txt").read_text().count(note)
                                if self.COMM.rank == 0 else None)
        assert notes == 1
        assert "Traceback" not in capfd.readouterr().err

    def test_the_slow_rank_is_named_the_slowest_worker_at_every_evaluation(self):
        from wagma_rl.job.tblog import read_scalars

        slow = self.COMM.size - 1
        run_dir = self.COMM.bcast(tempfile.mkdtemp(prefix="sup_") if self.COMM.rank == 0 else None)
        cfg = load_config(SupervisedConfig, REPO / "configs/resnet_shapes.yaml", [
            "data.image_size=8", "model.width=4", "data.train_size=512", "data.val_size=256",
            "train.batch_size=8", "train.steps=6", "train.eval_every=3", "averaging.name=wagma",
            f"heterogeneity.slow_ranks=[{slow}]", "heterogeneity.slowdown=10",
            f"run.dir={run_dir}"])
        train(cfg, comm=self.COMM)
        if self.COMM.rank == 0:
            scalars = read_scalars(cfg.run.run_dir())
            assert [v for _, v in scalars["workers/slowest_rank"]] == [float(slow)] * 2
            for r in range(self.COMM.size):
                for metric in ("compute_s", "comm_s", "samples_per_s", "staleness"):
                    assert len(scalars[f"worker/{r}/{metric}"]) == 2, (r, metric)
