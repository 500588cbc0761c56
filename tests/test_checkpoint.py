"""wagma_rl.job.checkpoint and wagma_rl.job.tblog: atomic checkpoints and run logs."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from wagma_rl.job.checkpoint import CheckpointManager
from wagma_rl.job.tblog import RunLogger, format_progress, read_scalars


class TestCheckpointManager:
    def test_latest_is_none_in_an_empty_folder(self, tmp_path):
        assert CheckpointManager(tmp_path).latest() is None

    def test_save_then_load_round_trips_tensors_and_python_state(self, tmp_path):
        mgr = CheckpointManager(tmp_path)
        state = {"w": torch.arange(4.0), "step": 7, "rng": np.random.default_rng(1).bit_generator.state}
        mgr.save(state, step=7)
        back = mgr.load()
        assert torch.equal(back["w"], state["w"]) and back["step"] == 7 and back["rng"] == state["rng"]

    def test_keeps_only_the_last_k_and_latest_is_the_highest_step(self, tmp_path):
        mgr = CheckpointManager(tmp_path, keep_last=2)
        for step in (10, 30, 20, 40):
            mgr.save({"step": step}, step=step)
        assert [mgr.load(p)["step"] for p in mgr.all()] == [30, 40]
        assert mgr.load()["step"] == 40

    def test_failed_save_leaves_no_partial_file(self, tmp_path):
        mgr = CheckpointManager(tmp_path)
        mgr.save({"step": 1}, step=1)

        class Unpicklable:
            def __reduce__(self):
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            mgr.save({"bad": Unpicklable()}, step=2)
        assert [p.name for p in mgr.dir.iterdir()] == [mgr.path_for(1).name]

    def test_load_without_checkpoint_raises(self, tmp_path):
        with pytest.raises(FileNotFoundError):
            CheckpointManager(tmp_path).load()


class TestRunLogger:
    def test_scalars_read_back_from_event_files(self, tmp_path):
        with RunLogger(tmp_path, stream=io.StringIO()) as log:
            for step in (0, 100, 200):
                log.scalars({"reward": step / 100.0, "loss": 1.0}, step, prefix="train/")
        got = read_scalars(tmp_path)
        assert got["train/reward"] == [(0, 0.0), (100, 1.0), (200, 2.0)]
        assert set(got) == {"train/reward", "train/loss"}

    def test_info_goes_to_log_file_and_stream(self, tmp_path):
        out = io.StringIO()
        with RunLogger(tmp_path, tensorboard=False, stream=out) as log:
            log.progress({"frames": 1200, "fps": 310.25})
        assert "frames=1200 fps=310.2" in (tmp_path / "log.txt").read_text()
        assert "frames=1200" in out.getvalue()

    def test_disabled_logger_writes_nothing(self, tmp_path):
        out = io.StringIO()
        log = RunLogger(tmp_path / "r", enabled=False, stream=out)
        log.scalar("x", 1.0, 0)
        log.info("hello")
        log.close()
        assert not (tmp_path / "r").exists() and out.getvalue() == ""

    def test_a_video_is_recorded_only_where_moviepy_can_encode_it(self, tmp_path, monkeypatch):
        import importlib.util

        frames = np.arange(2 * 4 * 6 * 3, dtype=np.uint8).reshape(2, 4, 6, 3)  # (T, H, W, 3)
        with RunLogger(tmp_path, stream=io.StringIO()) as log:
            sent = []
            monkeypatch.setattr(log._writer, "add_video", lambda *a, **k: sent.append((a, k)))
            asked = []
            monkeypatch.setattr(importlib.util, "find_spec", lambda name: asked.append(name))
            assert log.video("v", frames, 7) is False and sent == []
            assert asked == ["moviepy.editor"]  # what add_video imports (moviepy 2 has none)

            def no_moviepy(name):
                raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")
            monkeypatch.setattr(importlib.util, "find_spec", no_moviepy)
            assert log.video("v", frames, 7) is False and sent == []
            monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
            assert log.video("v", frames, 7, fps=5) is True
        (tag, clip), options = sent[0]
        assert tag == "v" and options == {"global_step": 7, "fps": 5}
        assert np.array_equal(clip, frames.transpose(0, 3, 1, 2)[None])  # (1, T, 3, H, W)


def test_format_progress_handles_nan_and_large_numbers():
    assert format_progress({"a": float("nan"), "b": 2.5e6, "c": 3}) == "a=nan b=2.500e+06 c=3"


def test_the_per_worker_view_names_the_slowest_worker(tmp_path):
    log = RunLogger(tmp_path, echo=False)
    line = log.workers({"collect_s": [1.0, 4.0, 2.0], "wait_s": [0.5, 0.0, 0.25]}, 100,
                       slowest_by="collect_s")
    log.close()
    scalars = read_scalars(tmp_path)
    assert [v for _, v in scalars["worker/1/collect_s"]] == [4.0]
    assert scalars["workers/slowest_rank"] == [(100, 1.0)]
    assert scalars["workers/slowest_vs_median"] == [(100, 2.0)]
    assert line == "slowest worker: rank 1 (collect_s 4, 2.00x the median of 3); wait_s 0"


def test_the_per_worker_line_ends_with_the_callers_note(tmp_path):
    log = RunLogger(tmp_path, echo=False)
    line = log.workers({"collect_s": [1.0, 4.0, 2.0]}, 100, slowest_by="collect_s",
                       note="slowest env: rank 0 env 1, 31 ms/step, 3.1x the median")
    log.close()
    assert line == ("slowest worker: rank 1 (collect_s 4, 2.00x the median of 3); "
                    "slowest env: rank 0 env 1, 31 ms/step, 3.1x the median")
