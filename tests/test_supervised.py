"""The supervised jobs' parts: generated data, readers, models, BLEU, configs, one-rank runs."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from in_process import supervised_here
from wagma_rl.config import ConfigError, config_to_dict, load_config
from wagma_rl.supervised import SupervisedConfig, train
from wagma_rl.supervised.bleu import corpus_bleu
from wagma_rl.supervised.data import (UNK, GrammarTask, Vocab, generate_pairs, generate_shapes,
                                      list_image_folder, load_images, read_parallel)
from wagma_rl.supervised.models import Seq2SeqTransformer, resnet18, resnet50

REPO = Path(__file__).resolve().parents[1]


class TestGeneratedData:
    def test_shapes_shards_are_disjoint_and_cover_the_set(self):
        full_x, full_y = generate_shapes(256, size=12, seed=3)
        parts = [generate_shapes(256, size=12, seed=3, rank=r, world_size=2) for r in range(2)]
        assert sum(len(p[1]) for p in parts) == len(full_y)
        # Chunks of 64 are dealt round robin: rank 0 has chunks 0 and 2, rank 1 chunks 1 and 3.
        assert np.array_equal(parts[0][0][:64], full_x[:64]) and np.array_equal(parts[1][0][:64], full_x[64:128])

    def test_shapes_use_every_class_and_are_reproducible(self):
        x, y = generate_shapes(512, size=16, seed=1)
        assert x.shape == (512, 3, 16, 16) and set(y.tolist()) == set(range(6))
        assert np.array_equal(generate_shapes(512, size=16, seed=1)[0], x)
        assert not np.array_equal(generate_shapes(512, size=16, seed=2)[0], x)

    def test_grammar_vocabulary_covers_every_generated_token(self):
        src_v, tgt_v = (Vocab(v) for v in GrammarTask().vocabularies())
        for s, t in generate_pairs(256, seed=5):
            assert UNK not in src_v.encode(s) and UNK not in tgt_v.encode(t)

    def test_grammar_reorders_and_agrees(self):
        task = GrammarTask()
        for s, t in generate_pairs(64, seed=2):
            verb = next(w for w in s if w in ("sees likes finds follows pushes paints builds carries "
                                              "watches helps").split())
            assert t[-1] in (task.lex[verb], task.lex[verb] + "n")  # the verb goes last (SOV)
            assert (t[-1].endswith("n") and t[-1] != task.lex[verb]) == (s[0] in ("two", "three", "four"))


class TestReaders:
    def test_image_folder_reads_classes_and_images(self, tmp_path):
        from PIL import Image
        for split in ("train", "val"):
            for cls, colour in (("cats", (255, 0, 0)), ("dogs", (0, 0, 255))):
                (tmp_path / split / cls).mkdir(parents=True)
                Image.new("RGB", (20, 10), colour).save(tmp_path / split / cls / "a.png")
        files, labels, classes = list_image_folder(tmp_path, "train")
        assert classes == ["cats", "dogs"] and labels == [0, 1]
        x = load_images(files, size=8)
        assert x.shape == (2, 3, 8, 8) and x[0, 0].mean() > x[0, 2].mean()

    def test_missing_image_folder_says_what_layout_is_expected(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="train/<class>"):
            list_image_folder(tmp_path, "train")

    def test_parallel_text_pairs_lines(self, tmp_path):
        (tmp_path / "train.src").write_text("a b\nc\n")
        (tmp_path / "train.tgt").write_text("x y z\nw\n")
        assert read_parallel(tmp_path, "train") == [(["a", "b"], ["x", "y", "z"]), (["c"], ["w"])]
        (tmp_path / "train.tgt").write_text("x\n")
        with pytest.raises(ValueError, match="one line per sentence pair"):
            read_parallel(tmp_path, "train")


class TestModelsAndMetrics:
    @pytest.mark.parametrize("build", [resnet18, resnet50])
    def test_resnets_classify(self, build):
        m = build(num_classes=7, width=4)
        assert m(torch.randn(2, 3, 16, 16)).shape == (2, 7)

    def test_resnet18_has_the_paper_size_at_full_width(self):
        m = resnet18(num_classes=1000, small_input=False)
        assert abs(sum(p.numel() for p in m.parameters()) - 11_689_512) < 1000

    def test_transformer_forward_and_greedy_decode(self):
        m = Seq2SeqTransformer(src_vocab=11, tgt_vocab=13, d_model=16, nhead=2, num_encoder_layers=1,
                               num_decoder_layers=1, dim_feedforward=32)
        src = torch.randint(4, 11, (3, 5))
        assert m(src, torch.randint(4, 13, (3, 4))).shape == (3, 4, 13)
        assert m.greedy_decode(src, bos_id=1, eos_id=2, max_len=6).shape[0] == 3

    def test_bleu(self):
        ref = "the cat sat on the mat".split()
        assert corpus_bleu([ref], [ref]) == pytest.approx(100.0)
        assert corpus_bleu([["dog"]], [ref]) == 0.0
        assert 0 < corpus_bleu(["the cat sat on a mat".split()], [ref]) < 100


class TestConfigs:
    @pytest.mark.parametrize("path", sorted(str(p) for p in REPO.glob("configs/resnet_*.yaml"))
                             + sorted(str(p) for p in REPO.glob("configs/resnet50_*.yaml"))
                             + sorted(str(p) for p in REPO.glob("configs/transformer_*.yaml")))
    def test_shipped_configs_load(self, path):
        cfg = load_config(SupervisedConfig, path)
        assert cfg.train.task in ("image", "translation")

    def test_unknown_key_is_named(self):
        with pytest.raises(ConfigError, match="optim.nme"):
            load_config(SupervisedConfig, REPO / "configs/resnet_shapes.yaml", ["optim.nme=wagma"])


def tiny(tmp_path, *overrides):
    base = ["data.image_size=8", "model.width=4", "data.train_size=128", "data.val_size=64",
            "train.batch_size=8", "train.steps=4", "train.eval_every=2", "run.log_interval=2",
            "run.checkpoint_interval=2", f"run.dir={tmp_path}", "averaging.name=allreduce"]
    return load_config(SupervisedConfig, REPO / "configs/resnet_shapes.yaml", base + list(overrides))


class TestOneRankRuns:
    def test_image_run_logs_evaluates_and_checkpoints(self, tmp_path):
        history = train(tiny(tmp_path))
        assert [r["step"] for r in history] == [2, 4] and 0 <= history[-1]["accuracy"] <= 100
        assert (tmp_path / "config.yaml").is_file() and list((tmp_path / "tb").iterdir())
        assert len(list((tmp_path / "checkpoints").glob("ckpt_*.pt"))) == 2
        assert len((tmp_path / "history.jsonl").read_text().splitlines()) == 2

    def test_resume_continues_from_the_checkpoint(self, tmp_path):
        train(tiny(tmp_path))
        history = train(tiny(tmp_path, "train.steps=6"))
        assert [r["step"] for r in history] == [2, 4, 6]
        assert "resumed from" in (tmp_path / "log.txt").read_text()
        assert history[-1]["samples"] == 6 * 8

    def test_a_fresh_run_in_a_folder_holding_checkpoints_is_refused(self, tmp_path):
        train(tiny(tmp_path))
        with pytest.raises(ConfigError, match="run.auto_resume=false .* choose a new run.name"):
            train(tiny(tmp_path, "run.auto_resume=false", "train.steps=6"))
        assert len((tmp_path / "history.jsonl").read_text().splitlines()) == 2

    @pytest.mark.parametrize("change,named", [("averaging.name=local_sgd", "saved by"),
                                              ("model.width=8", "size mismatch")])
    def test_a_checkpoint_that_does_not_fit_is_refused_in_one_line(self, tmp_path, change, named):
        train(tiny(tmp_path))
        with pytest.raises(ConfigError, match=f"does not fit this run \\(.*{named}") as info:
            train(tiny(tmp_path, change, "train.steps=6"))
        assert "\n" not in str(info.value) and "start a new run" in str(info.value)
        assert len((tmp_path / "history.jsonl").read_text().splitlines()) == 2

    def test_a_time_budget_stops_at_the_first_evaluation_past_it_with_a_checkpoint(self, tmp_path):
        history = train(tiny(tmp_path, "train.steps=1000", "train.time_budget_s=1e-6",
                             "run.checkpoint_interval=0"))
        assert [r["step"] for r in history] == [2]
        assert len(list((tmp_path / "checkpoints").glob("ckpt_*.pt"))) == 1

    def test_translation_run_reports_bleu(self, tmp_path):
        cfg = load_config(SupervisedConfig, REPO / "configs/transformer_grammar.yaml",
                          ["data.train_size=128", "data.val_size=64", "model.d_model=16", "model.layers=1",
                           "model.dim_feedforward=32", "train.batch_size=8", "train.steps=2",
                           "train.eval_every=2", "train.eval_batches=1", f"run.dir={tmp_path}",
                           "averaging.name=local_sgd"])
        history = train(cfg)
        assert "bleu" in history[-1] and 0 <= history[-1]["bleu"] <= 100

    def test_a_group_larger_than_the_job_shrinks_to_it_and_says_so(self, tmp_path):
        # One process, WAGMA's default group of 2: the group is the job (as in the RL trainer).
        history = train(tiny(tmp_path, "averaging.name=wagma", "averaging.group_size=2"))
        assert [r["step"] for r in history] == [2, 4]
        log = (tmp_path / "log.txt").read_text()
        assert "averaging.group_size=2 is larger than the job (1 rank): WAGMA averages in groups of 1" \
            in log

    def test_a_bad_optimizer_setting_is_one_line_naming_the_key(self, tmp_path, capsys):
        proc = supervised_here(
            capsys, "--config", REPO / "configs/resnet_shapes.yaml", "data.image_size=8",
            "model.width=4", "data.train_size=128", "data.val_size=64", "train.steps=2",
            f"run.dir={tmp_path}", "averaging.sync_period=0")
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "averaging.sync_period" in lines[0], proc.stderr

    def test_print_config_prints_the_resolved_config_and_starts_nothing(self, tmp_path, capsys,
                                                                         monkeypatch):
        monkeypatch.chdir(tmp_path)
        proc = supervised_here(capsys, "--config", REPO / "configs/resnet_shapes.yaml",
                               "optim.lr=0.05", "--print-config")
        assert proc.returncode == 0, proc.stderr
        expected = load_config(SupervisedConfig, REPO / "configs/resnet_shapes.yaml", ["optim.lr=0.05"])
        assert yaml.safe_load(proc.stdout) == config_to_dict(expected)
        assert yaml.safe_load(proc.stdout)["optim"]["lr"] == 0.05
        assert list(tmp_path.iterdir()) == []  # no run folder, no config.yaml

    def test_print_config_refuses_a_bad_key_in_one_line(self, tmp_path, capsys, monkeypatch):
        monkeypatch.chdir(tmp_path)
        proc = supervised_here(capsys, "--config", REPO / "configs/resnet_shapes.yaml",
                               "optim.nme=wagma", "--explain-config")
        assert proc.returncode == 2 and proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "unknown config key 'optim.nme'" in lines[0], proc.stderr
        assert list(tmp_path.iterdir()) == []

    def test_path_source_without_path_is_refused(self, tmp_path):
        with pytest.raises(ValueError, match="data.path"):
            train(tiny(tmp_path, "data.source=path"))


def test_the_device_rule_is_the_trainers(monkeypatch):
    # One rule for every job: cpu as given; cuda without CUDA falls back to the CPU with a warning.
    from mpi4py import MPI

    from wagma_rl.job.device import resolve_device

    assert resolve_device("cpu", MPI.COMM_SELF) == (torch.device("cpu"), None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device, warning = resolve_device("cuda", MPI.COMM_SELF)
    assert device == torch.device("cpu") and "CUDA is not available" in warning


class TestRunLifecycle:
    """The run folder's lock and the stop signals, as in the RL trainer (docs/faults.md)."""

    ARGS = ["--config", str(REPO / "configs/resnet_shapes.yaml"), "data.image_size=8",
            "model.width=4", "data.train_size=128", "data.val_size=64", "train.batch_size=8",
            "train.eval_every=2", "run.checkpoint_interval=1000", "averaging.name=allreduce"]

    def _run(self, run_dir, *more, **kw):
        return subprocess.Popen([sys.executable, "-m", "wagma_rl.supervised", *self.ARGS,
                                 f"run.dir={run_dir}", *more], cwd=REPO,
                                env=dict(os.environ, OMP_NUM_THREADS="1"), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)

    def test_rerunning_a_finished_run_says_to_raise_the_budget(self, tmp_path):
        run_dir = tmp_path / "run"
        for _ in range(2):
            proc = self._run(run_dir, "train.steps=2")
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
        assert ("nothing to train: the run is at step 2, train.steps is 2; raise train.steps to "
                "go on") in (run_dir / "log.txt").read_text()

    def test_a_second_run_on_a_folder_in_use_stops_naming_the_holder(self, tmp_path):
        from wagma_rl.job.runlock import RunLock

        run_dir = tmp_path / "run"
        run_dir.mkdir()
        holder = RunLock(run_dir).acquire()
        try:
            out, err = self._run(run_dir, "train.steps=4").communicate(timeout=120)
        finally:
            holder.release()
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "is in use by another run" in lines[0] and \
            f"pid {os.getpid()}" in lines[0], err
        assert not (run_dir / "checkpoints").exists()

    def test_sigterm_saves_a_checkpoint_at_the_next_evaluation_and_exits_cleanly(self, tmp_path):
        import signal
        import time

        from wagma_rl.job.checkpoint import CheckpointManager, load_checkpoint

        run_dir = tmp_path / "run"
        proc = self._run(run_dir, "train.steps=100000", "heterogeneity.stall_s=0.05",
                         "heterogeneity.stall_prob=1.0")
        end = time.monotonic() + 120
        while not (run_dir / "history.jsonl").exists():
            assert proc.poll() is None and time.monotonic() < end, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        log = (run_dir / "log.txt").read_text()
        step = int(log.split("stopped by signal at step ")[1].split()[0])
        saved = CheckpointManager(run_dir).latest()
        assert saved is not None and load_checkpoint(saved)["step"] == step
        assert step < 100000 and "Traceback" not in err
