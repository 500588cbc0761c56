"""The ``run:`` section (wagma_rl.job.run_config.RunConfig) that the DD-PPO trainer's and the
supervised jobs' configs share: same keys, same meaning, same checks."""
from dataclasses import fields
from pathlib import Path
from typing import get_args, get_type_hints

import pytest

from wagma_rl.config import ConfigError, load_config
from wagma_rl.distrib.spec import TrainerAveragingConfig
from wagma_rl.rl.config import DDPPOConfig, DDPPORunConfig
from wagma_rl.rl.setup import check_config
from wagma_rl.job.run_config import RunConfig, check_run
from wagma_rl.supervised import SupervisedConfig, train
from wagma_rl.optim.spec import AveragingConfig

REPO = Path(__file__).resolve().parents[1]
QUICK = REPO / "configs" / "quick_pointnav.yaml"
SHAPES = REPO / "configs" / "resnet_shapes.yaml"


def shared_keys():
    return {f.name for f in fields(RunConfig)}


class TestOneSection:
    def test_both_stacks_use_the_same_run_section(self):
        assert isinstance(load_config(DDPPOConfig).run, RunConfig)
        assert type(load_config(SupervisedConfig).run) is RunConfig

    def test_the_trainer_adds_only_its_own_keys(self):
        assert {f.name for f in fields(DDPPORunConfig)} - shared_keys() == \
            {"total_frames", "stats_window", "trace"}

    def test_the_supervised_loop_section_holds_no_run_key(self):
        assert not {f.name for f in fields(type(load_config(SupervisedConfig).train))} & shared_keys()

    def test_each_stack_names_its_default_output_folder(self):
        assert load_config(DDPPOConfig).run.run_dir() == "runs/pointnav"
        assert load_config(SupervisedConfig).run.run_dir() == "runs/supervised"
        assert load_config(SupervisedConfig, None, ["run.dir=/tmp/x"]).run.run_dir() == "/tmp/x"

    @pytest.mark.parametrize("old", ["train.seed=3", "train.dir=runs/x", "train.log_interval=5",
                                     "train.checkpoint_interval=0", "train.auto_resume=false",
                                     "train.torch_threads=2", "train.device=cpu",
                                     "train.keep_checkpoints=1"])
    def test_run_keys_under_train_name_their_new_place(self, old):
        key = old.split("=")[0].split(".")[1]
        with pytest.raises(ConfigError, match=rf"config key 'train\.{key}' has moved: use "
                                              rf"'run\.{key}' \(edit the config file"):
            load_config(SupervisedConfig, SHAPES, [old])

    def test_a_key_that_never_existed_still_lists_the_valid_ones(self):
        with pytest.raises(ConfigError, match=r"unknown config key 'train\.bogus'; valid keys in "
                                              r"section 'train': batch_size, eval_batches"):
            load_config(SupervisedConfig, SHAPES, ["train.bogus=1"])


class TestOneVocabulary:
    def test_the_trainers_averaging_modes_are_named_as_the_supervised_optimizers(self):
        modes = set(get_args(get_type_hints(TrainerAveragingConfig)["name"]))
        names = set(get_args(get_type_hints(AveragingConfig)["name"]))
        assert "local_sgd" in modes and modes - {"preempt"} <= names

    def test_both_stacks_hold_one_averaging_section(self):
        assert issubclass(get_type_hints(DDPPOConfig)["averaging"], AveragingConfig)
        assert get_type_hints(SupervisedConfig)["averaging"] is AveragingConfig

    @pytest.mark.parametrize("source", [QUICK, None])
    def test_averaging_name_localsgd_is_refused_naming_local_sgd(self, tmp_path, source):
        if source is None:  # a run folder's config.yaml written before the rename
            source = tmp_path / "config.yaml"
            source.write_text("distrib:\n  mode: localsgd\n")
        over = ["averaging.name=localsgd"] if source == QUICK else []
        with pytest.raises(ConfigError, match=r"config key 'averaging\.name': 'localsgd' has been "
                                              r"renamed: use averaging\.name=local_sgd"):
            load_config(DDPPOConfig, source, over)


    def test_optim_period_is_refused_naming_averaging_local_steps(self):
        with pytest.raises(ConfigError, match=r"config key 'optim\.period' has moved: use "
                                              r"'averaging\.local_steps'"):
            load_config(SupervisedConfig, SHAPES, ["optim.period=4"])

    @pytest.mark.parametrize("overrides, steps", [
        (["averaging.name=wagma"], 1), (["averaging.name=local_sgd"], 4), (["averaging.name=dpsgd"], 1),
        (["averaging.name=local_sgd", "averaging.local_steps=2"], 2),
        (["averaging.name=wagma", "averaging.local_steps=3"], 3)])
    def test_local_steps_is_each_optimizers_own_default_unless_set(self, overrides, steps):
        assert load_config(SupervisedConfig, SHAPES, overrides).averaging.steps_per_average() == steps


class TestChecks:
    @pytest.mark.parametrize("key,value", [("log_interval", 0), ("torch_threads", 0),
                                           ("checkpoint_interval", -1), ("keep_checkpoints", -1),
                                           ("device", "tpu")])
    def test_a_bad_value_is_refused_naming_the_key(self, key, value):
        with pytest.raises(ConfigError, match=f"run.{key}"):
            check_run(RunConfig(**{key: value}))

    def test_the_trainer_runs_the_same_check(self):
        with pytest.raises(ConfigError, match="run.log_interval"):
            check_config(load_config(DDPPOConfig, QUICK, ["run.log_interval=0"]), world_size=1)

    def test_a_supervised_job_runs_the_same_check_before_any_work(self, tmp_path):
        cfg = load_config(SupervisedConfig, SHAPES, ["run.log_interval=0", f"run.dir={tmp_path}"])
        with pytest.raises(ConfigError, match="run.log_interval"):
            train(cfg)
        assert not (tmp_path / "config.yaml").exists()

    def test_checkpoint_interval_zero_is_valid_in_both_stacks(self):
        check_config(load_config(DDPPOConfig, QUICK, ["run.checkpoint_interval=0"]), world_size=1)
        check_run(load_config(SupervisedConfig, SHAPES, ["run.checkpoint_interval=0"]).run)


def tiny(tmp_path, *overrides):
    base = ["data.image_size=8", "model.width=4", "data.train_size=128", "data.val_size=64",
            "train.batch_size=8", "train.steps=4", "train.eval_every=2", "run.log_interval=2",
            f"run.dir={tmp_path}", "averaging.name=allreduce"]
    return load_config(SupervisedConfig, SHAPES, base + list(overrides))


class TestSupervisedRunKeys:
    def test_checkpoint_interval_zero_checkpoints_only_at_the_end(self, tmp_path):
        train(tiny(tmp_path, "run.checkpoint_interval=0"))
        assert [p.name for p in (tmp_path / "checkpoints").glob("ckpt_*.pt")] == [f"ckpt_{4:012d}.pt"]

    def test_tensorboard_false_writes_no_event_files(self, tmp_path):
        train(tiny(tmp_path, "run.tensorboard=false"))
        assert (tmp_path / "log.txt").is_file() and not (tmp_path / "tb").exists()


def quick(tmp_path, *overrides):
    return load_config(DDPPOConfig, QUICK, [f"run.dir={tmp_path}", "averaging.name=allreduce",
                                            "run.total_frames=512", *overrides])


class TestTrainerRunKeys:
    def test_checkpoint_interval_zero_checkpoints_only_at_the_end(self, tmp_path):
        from wagma_rl.rl.trainer import train as train_rl
        result = train_rl(quick(tmp_path, "run.checkpoint_interval=0"))
        assert result.updates > 1
        assert [p.name for p in (tmp_path / "checkpoints").glob("ckpt_*.pt")] == \
            [result.checkpoint.name]
