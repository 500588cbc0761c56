"""A user's image folder streamed from disk: decoded in DataLoader workers, batches addressed by step.

The generated data sets stay in memory (they are small and drawn in a second); an image folder
can be any size, so each rank keeps only its shard's file names and a
``torch.utils.data.DataLoader`` with worker processes reads, decodes and resizes the images of
each batch off the training process. Which items form the batch of a step is the same
:class:`~.batches.BatchSchedule` as in memory, so a resumed run reads, from its first step on,
exactly the batches the uninterrupted run would have read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .batches import BatchSchedule
from .image_folder import load_images

__all__ = ["ImageFiles", "StepBatches", "StreamedBatches", "ordered_batches"]


class ImageFiles(Dataset):
    """Images and labels of ``files``: item ``i`` is ``(3 x size x size float32 tensor, label)``,
    normalised as :func:`~.image_folder.load_images` does."""

    def __init__(self, files: Sequence[Path], labels: Sequence[int], *, size: int):
        self.files, self.labels, self.size = list(files), np.asarray(labels, dtype=np.int64), size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        return torch.from_numpy(load_images([self.files[i]], size=self.size)[0]), int(self.labels[i])


class StepBatches(Sampler):
    """The batches of ``schedule`` from step ``start`` on, without end (the loop decides when to
    stop)."""

    def __init__(self, schedule: BatchSchedule, start: int):
        self.schedule, self.start = schedule, start

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start
        while True:
            yield self.schedule.indices(step).tolist()
            step += 1


class StreamedBatches:
    """``batch(step)`` through a DataLoader with ``workers`` processes (0: decode in this one).

    Steps are expected in order; asking for another step (a resume) starts the loader there.
    """

    def __init__(self, data: ImageFiles, schedule: BatchSchedule, *, workers: int, pin: bool):
        self.data, self.schedule, self.workers, self.pin = data, schedule, workers, pin
        self._it, self._next = None, None

    def batch(self, step: int):
        if self._it is None or step != self._next:
            loader = DataLoader(self.data, batch_sampler=StepBatches(self.schedule, step),
                                num_workers=self.workers, pin_memory=self.pin,
                                prefetch_factor=2 if self.workers else None)
            self._it = iter(loader)
        self._next = step + 1
        return next(self._it)

    def close(self) -> None:
        """Stop the worker processes."""
        self._it = None


def ordered_batches(data: ImageFiles, *, batch_size: int, limit: int, workers: int, pin: bool):
    """The first ``limit`` items of ``data`` in order, in batches (evaluation)."""
    part = torch.utils.data.Subset(data, range(min(len(data), limit)))
    return DataLoader(part, batch_size=batch_size, shuffle=False, num_workers=workers, pin_memory=pin)
