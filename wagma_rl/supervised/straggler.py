"""Emulated stragglers: make some ranks slower so the optimizers' tolerance can be measured."""
from __future__ import annotations

import time

import numpy as np

__all__ = ["Straggler"]


class Straggler:
    """Decides how long this rank sleeps in each step.

    ``slow_rank``: rank ``rank`` sleeps ``(factor - 1)`` times its measured compute time, i.e. it
    runs ``factor`` times slower. ``random``: at each step 1 to ``max_ranks`` ranks, drawn from a
    generator seeded identically on every rank (so all agree without communicating), sleep
    ``delay_s``. ``none``: never sleeps.
    """

    def __init__(self, *, mode: str, rank: int, world_size: int, slow_rank: int = 0,
                 factor: float = 2.0, delay_s: float = 0.2, max_ranks: int = 2, seed: int = 1):
        if mode not in ("none", "slow_rank", "random"):
            raise ValueError(f"straggler mode must be none, slow_rank or random, got {mode!r}")
        if mode == "slow_rank" and not 0 <= slow_rank < world_size:
            raise ValueError(f"straggler.rank={slow_rank} is not a rank of {world_size}")
        if factor < 1.0 or delay_s < 0 or max_ranks < 1:
            raise ValueError("straggler factor must be >= 1, delay_s >= 0 and max_ranks >= 1")
        self.mode, self.rank, self.world_size = mode, rank, world_size
        self.slow_rank, self.factor, self.delay_s = slow_rank, factor, delay_s
        self.max_ranks, self.seed = min(max_ranks, world_size), seed

    def delayed_ranks(self, step: int) -> list[int]:
        """The ranks that sleep at ``step`` in ``random`` mode (the same answer on every rank)."""
        rng = np.random.default_rng([self.seed, step])
        k = int(rng.integers(1, self.max_ranks + 1))
        return sorted(rng.choice(self.world_size, size=k, replace=False).tolist())

    def delay(self, step: int, compute_s: float) -> float:
        """Seconds this rank should sleep after a step whose compute took ``compute_s``."""
        if self.mode == "slow_rank":
            return (self.factor - 1.0) * compute_s if self.rank == self.slow_rank else 0.0
        if self.mode == "random":
            return self.delay_s if self.rank in self.delayed_ranks(step) else 0.0
        return 0.0

    def sleep(self, step: int, compute_s: float, *, fraction: float = 1.0) -> None:
        """Sleep this rank's delay for ``step`` (``fraction`` of it, for a micro-batch)."""
        d = self.delay(step, compute_s) * (fraction if self.mode == "random" else 1.0)
        if d > 0:
            time.sleep(d)
