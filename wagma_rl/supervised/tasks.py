"""The two supervised tasks: data shard, model, loss, micro-batching and evaluation for each.

The training loop (:mod:`wagma_rl.supervised.train`) only talks to a task through
``batch(step)``, ``loss(batch)``, ``split(batch, k)``, ``size(batch)`` and ``evaluate()``.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..job.device import memory_format
from .bleu import bleu_counts, bleu_from_counts
from .config import SupervisedConfig
from .data import (BOS, EOS, PAD, BatchSchedule, GrammarTask, ImageFiles, StreamedBatches, Vocab,
                   generate_pairs, generate_shapes, list_image_folder, ordered_batches,
                   read_parallel, shard_indices, SHAPE_CLASSES)
from .models import Seq2SeqTransformer, resnet18, resnet50

__all__ = ["ImageTask", "TranslationTask", "build_task", "memory_format"]


class ImageTask:
    """Image classification with a ResNet; the metric is top-1 accuracy in percent.

    Generated shapes live in memory; an image folder streams from disk through a DataLoader
    (``data.loader_workers``), each rank reading its own shard, batch by step as in memory.
    """

    metric = "accuracy"

    def __init__(self, cfg: SupervisedConfig, *, rank: int, world_size: int, device: torch.device):
        d, m = cfg.data, cfg.model
        if m.arch not in ("resnet18", "resnet50"):
            raise ValueError(f"task 'image' needs model.arch resnet18 or resnet50, got {m.arch!r}")
        self.stream = None
        if d.source == "generated":
            self.x, self.y = generate_shapes(d.train_size, size=d.image_size, seed=d.seed, rank=rank,
                                             world_size=world_size)
            self.vx, self.vy = generate_shapes(d.val_size, size=d.image_size, seed=d.seed + 10_000,
                                               rank=rank, world_size=world_size)
            classes = list(SHAPE_CLASSES)
        else:
            if d.loader_workers < 0:
                raise ValueError(f"data.loader_workers must be >= 0, got {d.loader_workers}")
            files, labels, classes = list_image_folder(d.path, "train")
            mine = shard_indices(len(files), rank, world_size)
            self.x = ImageFiles([files[i] for i in mine], np.asarray(labels)[mine], size=d.image_size)
            self.y = self.x.labels
            vfiles, vlabels, vclasses = list_image_folder(d.path, "val")
            if vclasses != classes:
                raise ValueError(f"{d.path}: val/ classes {vclasses} differ from train/ classes {classes}")
            vmine = shard_indices(len(vfiles), rank, world_size)
            self.vx = ImageFiles([vfiles[i] for i in vmine], np.asarray(vlabels)[vmine], size=d.image_size)
            self.vy = self.vx.labels
            self.workers = d.loader_workers
        self.classes = classes
        self.device = device
        build = resnet18 if m.arch == "resnet18" else resnet50
        self.memory_format = memory_format(m.memory_format, device)
        # Before the optimizer is built: its flat buffer mirrors the parameters as they are now.
        self.model = build(num_classes=len(classes), width=m.width, small_input=m.small_input).to(
            device, memory_format=self.memory_format)
        self.schedule = BatchSchedule(len(self.y), cfg.train.batch_size, seed=cfg.run.seed * 1000 + rank)
        self.batch_size = cfg.train.batch_size
        self.eval_batches = cfg.train.eval_batches
        if isinstance(self.x, ImageFiles):
            self.stream = StreamedBatches(self.x, self.schedule, workers=self.workers,
                                          pin=self.device.type == "cuda")

    def batch(self, step: int):
        if self.stream is not None:
            x, y = self.stream.batch(step)
            return self._images(x), y.to(self.device, non_blocking=True)
        idx = self.schedule.indices(step)
        return (self._images(self.x[idx]), torch.from_numpy(self.y[idx]).to(self.device))

    def _images(self, x) -> torch.Tensor:
        x = torch.from_numpy(x) if isinstance(x, np.ndarray) else x
        return x.to(self.device, memory_format=self.memory_format, non_blocking=True)

    def _val_batches(self, limit: int):
        if isinstance(self.vx, ImageFiles):
            yield from ordered_batches(self.vx, batch_size=self.batch_size, limit=limit,
                                       workers=self.workers, pin=self.device.type == "cuda")
            return
        for a in range(0, min(len(self.vy), limit), self.batch_size):
            yield self.vx[a:a + self.batch_size], torch.from_numpy(self.vy[a:a + self.batch_size])

    @staticmethod
    def size(batch) -> int:
        return int(batch[1].shape[0])

    @staticmethod
    def split(batch, k: int):
        return list(zip(batch[0].chunk(k), batch[1].chunk(k)))

    def loss(self, batch) -> torch.Tensor:
        return nn.functional.cross_entropy(self.model(batch[0]), batch[1])

    @torch.no_grad()
    def evaluate(self) -> np.ndarray:
        """Local sums ``[correct, count, loss_sum]`` over this rank's validation shard."""
        self.model.eval()
        correct = count = loss = 0.0
        n = len(self.vy)
        limit = self.eval_batches * self.batch_size if self.eval_batches else n
        for x, y in self._val_batches(limit):
            x, y = self._images(x), y.to(self.device)
            logits = self.model(x)
            correct += float((logits.argmax(1) == y).sum())
            loss += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
            count += len(y)
        self.model.train()
        return np.array([correct, count, loss], dtype=np.float64)

    @staticmethod
    def summarize(sums: np.ndarray) -> dict[str, float]:
        """Metrics from the rank-summed :meth:`evaluate` output."""
        return {"accuracy": 100.0 * sums[0] / max(sums[1], 1), "loss": sums[2] / max(sums[1], 1)}


class TranslationTask:
    """Sequence-to-sequence translation with a Transformer; the metric is corpus BLEU-4."""

    metric = "bleu"

    def __init__(self, cfg: SupervisedConfig, *, rank: int, world_size: int, device: torch.device):
        d, m = cfg.data, cfg.model
        if m.arch != "transformer":
            raise ValueError(f"task 'translation' needs model.arch transformer, got {m.arch!r}")
        if d.source == "generated":
            train = generate_pairs(d.train_size, seed=d.seed, rank=rank, world_size=world_size)
            val = generate_pairs(d.val_size, seed=d.seed + 10_000, rank=rank, world_size=world_size)
            src_tokens, tgt_tokens = GrammarTask().vocabularies()
            self.src_vocab, self.tgt_vocab = Vocab(src_tokens), Vocab(tgt_tokens)
        else:
            # Every rank reads the whole training text for the vocabulary so all build the same one.
            full = read_parallel(d.path, "train", src_ext=d.src_ext, tgt_ext=d.tgt_ext)
            self.src_vocab = Vocab.build((s for s, _ in full), max_size=d.max_vocab)
            self.tgt_vocab = Vocab.build((t for _, t in full), max_size=d.max_vocab)
            train = [full[i] for i in shard_indices(len(full), rank, world_size)]
            vfull = read_parallel(d.path, "valid", src_ext=d.src_ext, tgt_ext=d.tgt_ext)
            val = [vfull[i] for i in shard_indices(len(vfull), rank, world_size)]
        keep = lambda pairs: [(s, t) for s, t in pairs if len(s) <= d.max_len and len(t) + 1 <= d.max_len]
        self.train, self.val = keep(train), keep(val)
        self.device = device
        self.max_len = d.max_len
        self.model = Seq2SeqTransformer(src_vocab=len(self.src_vocab), tgt_vocab=len(self.tgt_vocab),
                                        d_model=m.d_model, nhead=m.nhead, num_encoder_layers=m.layers,
                                        num_decoder_layers=m.layers, dim_feedforward=m.dim_feedforward,
                                        dropout=m.dropout, max_len=d.max_len + 2).to(device)
        self.schedule = BatchSchedule(len(self.train), cfg.train.batch_size, seed=cfg.run.seed * 1000 + rank)
        self.batch_size = cfg.train.batch_size
        self.eval_batches = cfg.train.eval_batches

    def _tensors(self, pairs):
        src = [self.src_vocab.encode(s) for s, _ in pairs]
        tgt = [[BOS] + self.tgt_vocab.encode(t) + [EOS] for _, t in pairs]
        S = torch.full((len(pairs), max(map(len, src))), PAD, dtype=torch.long)
        T = torch.full((len(pairs), max(map(len, tgt))), PAD, dtype=torch.long)
        for i, (a, b) in enumerate(zip(src, tgt)):
            S[i, :len(a)] = torch.tensor(a)
            T[i, :len(b)] = torch.tensor(b)
        return S.to(self.device), T.to(self.device)

    def batch(self, step: int):
        return self._tensors([self.train[i] for i in self.schedule.indices(step)])

    @staticmethod
    def size(batch) -> int:
        return int(batch[0].shape[0])

    @staticmethod
    def split(batch, k: int):
        return list(zip(batch[0].chunk(k), batch[1].chunk(k)))

    def loss(self, batch) -> torch.Tensor:
        src, tgt = batch
        logits = self.model(src, tgt[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1),
                                           ignore_index=PAD)

    @torch.no_grad()
    def evaluate(self) -> np.ndarray:
        """Local sums ``[BLEU counts (10), sentences]`` over this rank's validation shard."""
        self.model.eval()
        total = np.zeros(11, dtype=np.float64)
        n = len(self.val)
        limit = self.eval_batches * self.batch_size if self.eval_batches else n
        for a in range(0, min(n, limit), self.batch_size):
            pairs = self.val[a:a + self.batch_size]
            src, _ = self._tensors(pairs)
            out = self.model.greedy_decode(src, bos_id=BOS, eos_id=EOS, max_len=self.max_len)
            for row, (_, ref) in zip(out.tolist(), pairs):
                total[:10] += bleu_counts(self.tgt_vocab.decode(row), ref)
            total[10] += len(pairs)
        self.model.train()
        return total

    @staticmethod
    def summarize(sums: np.ndarray) -> dict[str, float]:
        return {"bleu": bleu_from_counts(sums[:10].tolist())}


def build_task(cfg: SupervisedConfig, *, rank: int, world_size: int, device: torch.device):
    """The task named by ``cfg.train.task`` with this rank's data shard and a fresh model."""
    if cfg.data.source == "path" and not cfg.data.path:
        raise ValueError("data.source is 'path' but data.path is empty; set data.path=<folder>")
    cls = {"image": ImageTask, "translation": TranslationTask}[cfg.train.task]
    return cls(cfg, rank=rank, world_size=world_size, device=device)
