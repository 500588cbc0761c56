"""An image folder streams from disk through a DataLoader, batch by step as the in-memory path."""
from pathlib import Path

import numpy as np
import pytest
import torch

from wagma_rl.config import load_config
from wagma_rl.supervised import SupervisedConfig, train
from wagma_rl.supervised.data import (BatchSchedule, ImageFiles, StreamedBatches, list_image_folder,
                                      load_images)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def folder(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, per_class in (("train", 12), ("val", 4)):
        for c in range(2):
            d = tmp_path / "imgs" / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return tmp_path / "imgs"


def in_memory(files, labels, schedule, step, size=8):
    idx = schedule.indices(step)
    return torch.from_numpy(load_images([files[i] for i in idx], size=size)), torch.from_numpy(labels[idx])


@pytest.mark.parametrize("workers", [0, 1])
def test_streamed_batches_are_the_in_memory_batches_of_the_same_steps(folder, workers):
    files, labels, _ = list_image_folder(folder, "train")
    labels = np.asarray(labels)
    stream = StreamedBatches(ImageFiles(files, labels, size=8), BatchSchedule(len(files), 4, seed=3),
                             workers=workers, pin=False)
    ref = BatchSchedule(len(files), 4, seed=3)
    for step in range(8):  # two epochs of 6 steps: the permutation changes at step 6
        x, y = stream.batch(step)
        want_x, want_y = in_memory(files, labels, ref, step)
        assert torch.equal(x, want_x) and torch.equal(y, want_y)
    stream.close()


def test_a_resumed_stream_starts_at_the_step_asked_for(folder):
    files, labels, _ = list_image_folder(folder, "train")
    labels = np.asarray(labels)
    stream = StreamedBatches(ImageFiles(files, labels, size=8), BatchSchedule(len(files), 4, seed=3),
                             workers=0, pin=False)
    x, y = stream.batch(5)
    want_x, want_y = in_memory(files, labels, BatchSchedule(len(files), 4, seed=3), 5)
    assert torch.equal(x, want_x) and torch.equal(y, want_y)


def test_an_image_folder_run_streams_evaluates_and_resumes(folder, tmp_path):
    def cfg(steps):
        return load_config(SupervisedConfig, REPO / "configs/resnet_shapes.yaml", [
            "data.source=path", f"data.path={folder}", "data.image_size=8", "data.loader_workers=1",
            "model.width=4", "train.batch_size=4", f"train.steps={steps}", "train.eval_every=2",
            "run.log_interval=2", "run.checkpoint_interval=2", f"run.dir={tmp_path / 'run'}",
            "averaging.name=allreduce"])

    assert [r["step"] for r in train(cfg(4))] == [2, 4]
    history = train(cfg(6))
    assert [r["step"] for r in history] == [2, 4, 6] and 0 <= history[-1]["accuracy"] <= 100
