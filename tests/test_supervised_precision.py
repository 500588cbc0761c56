"""run.precision (fp32 | tf32 | bf16), channels-last and the allreduce bucket size in the
supervised jobs, on cpu at a tiny size."""
from pathlib import Path

import pytest
import torch

from wagma_rl.config import load_config
from wagma_rl.heterogeneity import Heterogeneity
from wagma_rl.job.precision import apply_precision
from wagma_rl.optim import AllreduceSGD
from wagma_rl.supervised import SupervisedConfig, train
from wagma_rl.supervised.tasks import build_task, memory_format
from wagma_rl.supervised.train import _one_step

REPO = Path(__file__).resolve().parents[1]


def tiny(tmp_path, *overrides):
    base = ["data.image_size=8", "model.width=4", "data.train_size=64", "data.val_size=32",
            "train.batch_size=8", "train.steps=4", "train.eval_every=2", "run.log_interval=2",
            "run.checkpoint_interval=2", f"run.dir={tmp_path}", "averaging.name=allreduce"]
    return load_config(SupervisedConfig, REPO / "configs/resnet_shapes.yaml", base + list(overrides))


@pytest.fixture(autouse=True)
def fp32_afterwards():
    yield
    apply_precision("fp32")  # process-wide settings: leave them as the other tests expect


def one_step(cfg, *, precision):
    """One training step of a fresh image task; returns (the logits' dtype, the task)."""
    task = build_task(cfg, rank=0, world_size=1, device=torch.device("cpu"))
    opt = AllreduceSGD(torch.optim.SGD(task.model.parameters(), lr=0.1))
    seen = []
    task.model.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    _one_step(task, opt, Heterogeneity(cfg.heterogeneity, rank=0, world_size=1), step=0, micro=1,
              window=[0.0, 0], precision=precision)
    opt.close()
    return seen[0], task


class TestPrecision:
    def test_bf16_runs_the_forward_pass_in_bfloat16_and_keeps_fp32_weights(self, tmp_path):
        dtype, task = one_step(tiny(tmp_path), precision="bf16")
        assert dtype == torch.bfloat16
        assert all(p.dtype == torch.float32 for p in task.model.parameters())

    def test_fp32_runs_the_forward_pass_in_float32(self, tmp_path):
        dtype, _ = one_step(tiny(tmp_path), precision="fp32")
        assert dtype == torch.float32

    def test_a_bf16_run_trains_evaluates_and_checkpoints(self, tmp_path):
        history = train(tiny(tmp_path, "run.precision=bf16"))
        assert [r["step"] for r in history] == [2, 4]
        assert all(torch.isfinite(torch.tensor(r["train_loss"])) for r in history)

    def test_a_tf32_run_sets_tf32_for_the_job(self, tmp_path):
        train(tiny(tmp_path, "run.precision=tf32"))
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32


class TestChannelsLast:
    def test_auto_is_channels_last_on_cuda_and_contiguous_on_cpu(self):
        assert memory_format("auto", torch.device("cuda")) == torch.channels_last
        assert memory_format("auto", torch.device("cpu")) == torch.contiguous_format

    def test_channels_last_lays_out_the_weights_and_the_batches(self, tmp_path):
        cfg = tiny(tmp_path, "model.memory_format=channels_last")
        task = build_task(cfg, rank=0, world_size=1, device=torch.device("cpu"))
        conv = next(m for m in task.model.modules() if isinstance(m, torch.nn.Conv2d))
        assert conv.weight.is_contiguous(memory_format=torch.channels_last)
        assert task.batch(0)[0].is_contiguous(memory_format=torch.channels_last)

    def test_a_channels_last_bf16_run_trains(self, tmp_path):
        history = train(tiny(tmp_path, "model.memory_format=channels_last", "run.precision=bf16"))
        assert [r["step"] for r in history] == [2, 4]


def test_bucket_mb_is_allreduces_bucket_size_in_bytes(tmp_path):
    cfg = tiny(tmp_path, "averaging.bucket_mb=0.5")
    assert cfg.averaging.options(world_size=2)["bucket_bytes"] == 2**19
    assert tiny(tmp_path).averaging.options(world_size=2)["bucket_bytes"] is None  # by device
