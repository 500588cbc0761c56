"""The ``averaging:`` section both stacks share, and the keys it replaced (``distrib.*`` in the
RL config, the averaging keys of the supervised ``optim:``): read for one release, with one
rename line in the run's log, never an error."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from mpi_launch import REPO
from wagma_rl.config import ConfigError, config_notes, config_to_dict, format_config, load_config
from wagma_rl.rl.config import DDPPOConfig
from wagma_rl.supervised import SupervisedConfig, train

QUICK = REPO / "configs" / "quick_pointnav.yaml"
SHAPES = REPO / "configs" / "resnet_shapes.yaml"


def old_rl_config(tmp_path, **distrib):
    """configs/quick_pointnav.yaml as the release before wrote it (a ``distrib:`` section)."""
    data = yaml.safe_load(QUICK.read_text())
    averaging = data.pop("averaging")
    data["distrib"] = {"mode": averaging.pop("name"), **averaging, **distrib}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def old_supervised_config(tmp_path):
    """configs/resnet_shapes.yaml as the release before wrote it (averaging keys in ``optim:``)."""
    data = yaml.safe_load(SHAPES.read_text())
    data["optim"].update(data.pop("averaging"))
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class TestOldKeys:
    def test_an_old_rl_config_loads_as_the_new_one_with_one_rename_line(self, tmp_path):
        old = load_config(DDPPOConfig, old_rl_config(tmp_path))
        assert config_to_dict(old) == config_to_dict(load_config(DDPPOConfig, QUICK))
        notes = config_notes(old)
        assert len(notes) == 1 and "\n" not in notes[0]
        assert "distrib.mode -> averaging.name" in notes[0]
        assert "distrib.sync_period -> averaging.sync_period" in notes[0]

    def test_an_old_supervised_config_loads_as_the_new_one(self, tmp_path):
        old = load_config(SupervisedConfig, old_supervised_config(tmp_path))
        assert config_to_dict(old) == config_to_dict(load_config(SupervisedConfig, SHAPES))
        assert "optim.name -> averaging.name" in config_notes(old)[0]

    def test_a_current_config_has_no_rename_line(self):
        assert config_notes(load_config(DDPPOConfig, QUICK)) == []

    @pytest.mark.parametrize("overrides", [["distrib.mode=local_sgd", "distrib.sync_period=3"],
                                           ["averaging.name=local_sgd", "distrib.sync_period=3"]])
    def test_local_sgds_old_period_is_its_local_steps(self, overrides):
        spec = load_config(DDPPOConfig, QUICK, overrides).averaging
        assert (spec.local_steps, spec.sync_period, spec.steps_per_average()) == (3, 2, 3)

    def test_an_old_override_moves_the_key_in_the_supervised_config_too(self):
        cfg = load_config(SupervisedConfig, SHAPES, ["optim.name=local_sgd", "optim.local_steps=2"])
        assert cfg.averaging.steps_per_average() == 2

    def test_an_old_key_and_its_new_one_that_disagree_are_refused_naming_both(self):
        with pytest.raises(ConfigError, match=r"'distrib\.group_size' \(old\) and "
                                              r"'averaging\.group_size' both given"):
            load_config(DDPPOConfig, QUICK, ["distrib.group_size=4", "averaging.group_size=8"])

    def test_the_explained_config_shows_the_new_section_only(self):
        text = format_config(load_config(DDPPOConfig, QUICK, ["distrib.mode=dpsgd"]), explain=True)
        assert "\naveraging:\n" in text and "  name: dpsgd" in text and "distrib" not in text

    def test_the_rename_line_is_in_the_runs_log(self, tmp_path):
        over = ["data.image_size=8", "model.width=4", "data.train_size=64", "data.val_size=32",
                "train.batch_size=8", "train.steps=2", "train.eval_every=2",
                f"run.dir={tmp_path / 'run'}", "optim.name=local_sgd"]
        train(load_config(SupervisedConfig, SHAPES, over))
        log = (tmp_path / "run" / "log.txt").read_text()
        assert "renamed config keys, read until the next release" in log
        assert "optim.name -> averaging.name" in log


def test_the_rl_entry_point_reads_an_old_config_file(tmp_path):
    proc = subprocess.run([sys.executable, "run_ddppo.py", "--config", str(old_rl_config(tmp_path)),
                           "distrib.group_size=1", "--print-config"], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = yaml.safe_load(proc.stdout)
    assert printed["averaging"]["name"] == "wagma" and printed["averaging"]["group_size"] == 1
    assert "distrib" not in printed


class TestOneStrategyForEveryModelAverager:
    """The trainer's generic strategy averages every ``local_steps``-th update; the global
    averages are its synchronised points (one process: every average is a real collective)."""

    @pytest.mark.parametrize("overrides,synced", [
        (["averaging.name=local_sgd", "averaging.local_steps=3"], [0, 0, 1, 0, 0, 1]),
        (["averaging.name=dpsgd", "averaging.sync_period=2"], [0, 1, 0, 1, 0, 1]),
        (["averaging.name=wagma", "averaging.group_size=1", "averaging.sync_period=3"],
         [0, 0, 1, 0, 0, 1]),
        (["averaging.name=wagma", "averaging.group_size=1", "averaging.sync_period=1",
          "averaging.local_steps=2"], [0, 1, 0, 1, 0, 1]),
    ])
    def test_synchronised_points_follow_the_spec(self, overrides, synced):
        import torch
        from mpi4py import MPI

        from wagma_rl.distrib import build_strategy
        strategy = build_strategy(load_config(DDPPOConfig, QUICK, overrides).averaging,
                                  comm=MPI.COMM_SELF)
        strategy.wrap_optimizer(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1))
        try:
            assert [int(strategy.after_update().synced) for _ in synced] == synced
            assert strategy.state_dict()["strategy_updates"] == len(synced)
        finally:
            strategy.close()


def test_the_late_rule_has_one_default_from_the_config_to_the_native_collective():
    """`averaging.late`, WAGMA's `late=` and the collective's `allreduce(late=)` default alike."""
    import inspect

    from native_coll.collective import WaitAvoidingAllreduce
    from wagma_rl.optim.spec import AveragingConfig
    from wagma_rl.optim.wagma import WAGMA

    defaults = {AveragingConfig().late,
                inspect.signature(WAGMA).parameters["late"].default,
                inspect.signature(WaitAvoidingAllreduce.allreduce).parameters["late"].default}
    assert defaults == {"apply"}
