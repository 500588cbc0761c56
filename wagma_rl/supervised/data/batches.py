"""Shuffled mini-batches over an in-memory shard, addressable by step (so resuming is exact)."""
from __future__ import annotations

import numpy as np

__all__ = ["shard_indices", "BatchSchedule"]


def shard_indices(n: int, rank: int, world_size: int) -> np.ndarray:
    """The indices of items ``0..n-1`` that rank ``rank`` of ``world_size`` reads (round robin)."""
    return np.arange(rank, n, world_size)


class BatchSchedule:
    """Which items form the batch at each step: a fresh permutation per epoch, seeded per rank.

    ``indices(step)`` depends only on (seed, step), so a resumed run reads the same batches it
    would have read without the interruption.
    """

    def __init__(self, n_items: int, batch_size: int, *, seed: int):
        if n_items < batch_size:
            raise ValueError(f"a rank's data shard has {n_items} items, fewer than batch_size="
                             f"{batch_size}; use more data or a smaller batch")
        self.n, self.batch_size, self.seed = n_items, batch_size, seed
        self.per_epoch = n_items // batch_size
        self._epoch, self._perm = -1, None

    def indices(self, step: int) -> np.ndarray:
        epoch, pos = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._perm[pos * self.batch_size:(pos + 1) * self.batch_size]
