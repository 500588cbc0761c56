"""Emulated heterogeneity: slow ranks and random stalls, one ``heterogeneity:`` section for every job.

Two kinds of slowness, each term with one meaning in the DD-PPO trainer and the supervised jobs
(a *step* is one vector-environment step of the trainer, one optimizer step of a supervised job):

* **slow ranks**: the ranks in ``slow_ranks`` run ``slowdown`` times slower: after each piece of
  work (a vector-environment step or reset, a batch's gradient) they sleep ``slowdown - 1`` times
  the time it took.
* **stalls**: at some steps a rank sleeps ``stall_s`` seconds. Two models pick the stalled ranks:
  ``stall_prob`` (each rank stalls with that probability at each step, on its own draw) and
  ``stall_ranks`` (at each step 1 to ``stall_ranks`` ranks, drawn from ``seed`` identically on
  every rank so they agree without communicating: the WAGMA paper's ImageNet setting). A rank that
  either model picks stalls once. Both draw from ``(seed, step)``, so a schedule is the same in
  every run with that seed and a resumed run continues it (the trainer's continues from its
  updates times ``ppo.num_steps``, exact unless preemption cut rollouts short).

Why here and not in ``envs``: the stalls need the rank, the world size and a step index that all
ranks count alike, and a supervised job has no environment at all. Environments stay free of
training notions (the project's dependency direction: wagma_rl -> envs); the trainer wraps its vector environment in
:class:`HeterogeneousVectorEnv` and the supervised loop calls :meth:`Heterogeneity.sleep`, so one
object decides every delay in both stacks.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper

from .config import ConfigError

__all__ = ["HeterogeneityConfig", "check_heterogeneity", "Heterogeneity", "HeterogeneousVectorEnv"]


@dataclass
class HeterogeneityConfig:
    slow_ranks: list[int] = field(default_factory=list)
    """Ranks that run ``slowdown`` times slower (empty: none)."""
    slowdown: float = 1.0
    """How much slower the slow ranks are (>= 1): they sleep slowdown - 1 times each step's work."""
    stall_s: float = 0.0
    """Seconds a stalled rank sleeps in a step (with stall_prob or stall_ranks)."""
    stall_prob: float = 0.0
    """Independent stalls: each rank stalls at each step with this probability (0: off)."""
    stall_ranks: int = 0
    """Agreed stalls: at each step 1 to stall_ranks ranks (at most all), the same on every rank,
    stall (0: off; the WAGMA paper's ImageNet setting)."""
    seed: int = 1
    """Seed of the stall schedules."""


def check_heterogeneity(cfg: HeterogeneityConfig, *, world_size: int) -> None:
    """Reject settings that cannot work (raises ConfigError naming the key)."""
    def bad(key: str, why: str) -> None:
        raise ConfigError(f"config key 'heterogeneity.{key}': {why}")
    if any(r < 0 or r >= world_size for r in cfg.slow_ranks):
        bad("slow_ranks", f"{cfg.slow_ranks} names ranks outside 0..{world_size - 1}")
    if not cfg.slowdown >= 1.0:
        bad("slowdown", f"multiplies the work's duration and must be >= 1, got {cfg.slowdown}")
    if not cfg.stall_s >= 0.0:
        bad("stall_s", f"must be >= 0, got {cfg.stall_s}")
    if not 0.0 <= cfg.stall_prob <= 1.0:
        bad("stall_prob", f"is a probability and must be in [0, 1], got {cfg.stall_prob}")
    if cfg.stall_ranks < 0:
        bad("stall_ranks", f"must be >= 0 (0: off), got {cfg.stall_ranks}")


class Heterogeneity:
    """How long rank ``rank`` of ``world_size`` sleeps at each step (``cfg`` checked first)."""

    def __init__(self, cfg: HeterogeneityConfig, *, rank: int, world_size: int):
        check_heterogeneity(cfg, world_size=world_size)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.factor = cfg.slowdown if rank in cfg.slow_ranks else 1.0
        self.max_stalled = min(cfg.stall_ranks, world_size)

    @property
    def active(self) -> bool:
        """Whether this rank ever sleeps."""
        stalls = self.cfg.stall_s > 0 and (self.cfg.stall_prob > 0 or self.max_stalled > 0)
        return self.factor > 1.0 or stalls

    def agreed_stalls(self, step: int) -> list[int]:
        """The ranks the ``stall_ranks`` model stalls at ``step`` (the same list on every rank)."""
        if self.max_stalled == 0:
            return []
        rng = np.random.default_rng([self.cfg.seed, step])
        k = int(rng.integers(1, self.max_stalled + 1))
        return sorted(rng.choice(self.world_size, size=k, replace=False).tolist())

    def stalled(self, step: int) -> bool:
        """Whether this rank stalls at ``step`` (picked by either model)."""
        if self.cfg.stall_prob > 0:
            # A stream of its own per rank and step: independent of the other ranks' draws and
            # of the agreed model's (which draws from (seed, step) alone).
            if np.random.default_rng([self.cfg.seed, step, 1 + self.rank]).random() < self.cfg.stall_prob:
                return True
        return self.rank in self.agreed_stalls(step)

    def delay(self, work_s: float, *, step: int | None = None, fraction: float = 1.0) -> float:
        """Seconds to sleep after work that took ``work_s``: the slow-rank share, plus ``fraction``
        of ``stall_s`` when this rank stalls at ``step`` (None: work outside the steps, e.g. a reset)."""
        pause = (self.factor - 1.0) * work_s
        if step is not None and self.cfg.stall_s > 0 and self.stalled(step):
            pause += fraction * self.cfg.stall_s
        return pause

    def sleep(self, work_s: float, *, step: int | None = None, fraction: float = 1.0) -> None:
        """Sleep :meth:`delay` (``fraction``: a micro-batch's share of the step's stall)."""
        if self.active:
            pause = self.delay(work_s, step=step, fraction=fraction)
            if pause > 0:
                time.sleep(pause)


class HeterogeneousVectorEnv(VectorWrapper):
    """A vector environment whose steps and resets take as long as ``heterogeneity`` says: a slow
    rank's are stretched by its slowdown, and every ``step`` call is a step of the stall schedule,
    counted from ``first_step`` (the same on every rank, so ranks agree on the step index; a
    resumed run passes the steps already taken)."""

    def __init__(self, env: VectorEnv, heterogeneity: Heterogeneity, *, first_step: int = 0):
        super().__init__(env)
        self.heterogeneity = heterogeneity
        self.steps = int(first_step)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the wrapped environments, then sleep the slow-rank share of that work."""
        start = time.perf_counter()
        out = self.env.reset(seed=seed, options=options)
        self.heterogeneity.sleep(time.perf_counter() - start)
        return out

    def step(self, actions):
        """Step the wrapped environments (auto-resets included), then sleep this step's delay."""
        start = time.perf_counter()
        out = self.env.step(actions)
        self.heterogeneity.sleep(time.perf_counter() - start, step=self.steps)
        self.steps += 1
        return out
