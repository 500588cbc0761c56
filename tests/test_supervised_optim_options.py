"""averaging.background and averaging.bucket_mb of the supervised config reach the optimizers that take
them; averaging.background is refused in one line for the others."""
from pathlib import Path

import pytest
import torch
from mpi4py import MPI

from wagma_rl.config import ConfigError, load_config
from wagma_rl.supervised import SupervisedConfig, train
from wagma_rl.supervised.train import _build_optimizer

REPO = Path(__file__).resolve().parents[1]


def cfg_of(tmp_path, *overrides):
    base = ["data.image_size=8", "model.width=4", "data.train_size=64", "data.val_size=32",
            "train.batch_size=8", "train.steps=2", "train.eval_every=2", f"run.dir={tmp_path}"]
    return load_config(SupervisedConfig, REPO / "configs/resnet_shapes.yaml", base + list(overrides))


def built(cfg):
    model = torch.nn.Linear(4, 2)
    return _build_optimizer(cfg, model, MPI.COMM_SELF)


@pytest.mark.parametrize("name", ["wagma", "local_sgd", "dpsgd"])
@pytest.mark.parametrize("background", [True, False])
def test_optim_background_reaches_the_model_averaging_optimizers(tmp_path, name, background):
    opt = built(cfg_of(tmp_path, f"averaging.name={name}", f"averaging.background={background}"))
    assert opt.background is background


@pytest.mark.parametrize("name", ["allreduce", "nonblocking", "nonblocking_dpsgd"])
def test_optim_background_is_refused_for_the_gradient_averaging_optimizers(tmp_path, name):
    cfg = cfg_of(tmp_path, f"averaging.name={name}", "averaging.background=true")
    with pytest.raises(ConfigError, match=rf"^config key 'averaging.background': background averages "
                                          rf"are the model averages of averaging.name wagma, local_sgd, "
                                          rf"dpsgd; {name} averages gradients inside its step: "
                                          rf"leave averaging.background false$"):
        train(cfg, comm=MPI.COMM_SELF)
    assert not (tmp_path / "log.txt").exists()  # refused before any work


@pytest.mark.parametrize("name", ["allreduce", "nonblocking", "nonblocking_dpsgd"])
def test_optim_bucket_mb_reaches_the_optimizers_that_bucket_gradients(tmp_path, name):
    opt = built(cfg_of(tmp_path, f"averaging.name={name}", "averaging.bucket_mb=0.5"))
    assert opt.bucket_bytes == 2**19


def test_a_negative_bucket_mb_is_refused_by_the_range_beside_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"averaging.bucket_mb.*>= 0"):
        cfg_of(tmp_path, "averaging.name=nonblocking", "averaging.bucket_mb=-1")
