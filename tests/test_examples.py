"""The scripts under examples/ run, at a tiny size on cpu, as a user would launch them."""
import os
import subprocess

import numpy as np
import pytest

from mpi_launch import REPO, mpi_command

pytestmark = pytest.mark.mpi


def image_folder(root, classes=2, per_class=6, size=8):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / "train" / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def run_example(tmp_path, epochs):
    argv = ["examples/imagenet_resnet50.py", "--data", str(tmp_path / "data"), "--arch", "resnet18",
            "--width", "4", "--image-size", "8", "--batch", "2", "--epochs", str(epochs),
            "--workers", "1", "--device", "cpu", "--precision", "bf16", "--channels-last",
            "--checkpoint", str(tmp_path / "ckpt.pt"), "--tb", str(tmp_path / "tb")]
    proc = subprocess.run(mpi_command(2, argv), cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_the_imagenet_example_trains_checkpoints_and_resumes_at_the_next_epoch(tmp_path):
    image_folder(tmp_path / "data")
    first = run_example(tmp_path, epochs=2)
    assert "epoch 0:" in first and "epoch 1:" in first
    assert (tmp_path / "ckpt.pt").is_file() and list((tmp_path / "tb").iterdir())
    resumed = run_example(tmp_path, epochs=3)
    assert "epoch 2:" in resumed and "epoch 0:" not in resumed


def test_the_transformer_example_with_the_outer_step_trains_and_resumes(tmp_path):
    def run(steps):
        argv = ["examples/transformer_outer.py", "--sentences", "1024", "--d-model", "16", "--batch", "4",
                "--steps", str(steps), "--log-every", "2", "--device", "cpu", "--precision", "bf16",
                "--sync-period", "2", "--checkpoint", str(tmp_path / "t.pt")]
        proc = subprocess.run(mpi_command(2, argv), cwd=REPO, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc.stdout

    first = run(4)
    assert "step 2:" in first and "step 4:" in first
    resumed = run(6)
    assert "step 6:" in resumed and "step 2:" not in resumed
