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
* **slow and stalling environments** (the trainer only): inside every rank, the envs in
  ``slow_envs`` run ``env_slowdown`` times slower (``env_step_s`` adds an emulated simulator time
  to every env step), and each env stalls ``env_stall_s`` seconds with
  probability ``env_stall_prob`` at each of its own steps (drawn from ``(seed, rank, env, step)``).
  A lock-step rank waits for its slowest env at every step; with ``env.workers: process`` each env
  sleeps in its own worker process (:class:`SlowWorker`), so VER collection
  (``rollout.mode: ver``) keeps stepping the others meanwhile.

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

__all__ = ["HeterogeneityConfig", "check_heterogeneity", "Heterogeneity", "HeterogeneousVectorEnv",
           "SlowWorker"]


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
    env_step_s: float = 0.0
    """Trainer: seconds every env step sleeps on top of its work, emulating a simulator's own step
    time (habitat-sim renders in milliseconds where the embedded simulator takes ~0.1 ms); the
    slow envs' env_slowdown stretches it too (0: off)."""
    slow_envs: list[int] = field(default_factory=list)
    """Trainer: env indices (within every rank, 0..env.num_envs-1) that run env_slowdown times slower."""
    env_slowdown: float = 1.0
    """Trainer: how much slower the slow_envs step (>= 1)."""
    env_stall_s: float = 0.0
    """Trainer: seconds an env sleeps in a step where it stalls (with env_stall_prob)."""
    env_stall_prob: float = 0.0
    """Trainer: each env stalls at each of its steps with this probability (0: off)."""


def check_heterogeneity(cfg: HeterogeneityConfig, *, world_size: int,
                        num_envs: int | None = None) -> None:
    """Reject settings that cannot work (raises ConfigError naming the key); ``num_envs``: the
    trainer's envs per rank (None: a job without environments, whose env keys must stay off)."""
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
    if not cfg.env_slowdown >= 1.0:
        bad("env_slowdown", f"multiplies an env step's duration and must be >= 1, got {cfg.env_slowdown}")
    if not cfg.env_step_s >= 0.0:
        bad("env_step_s", f"must be >= 0, got {cfg.env_step_s}")
    if not cfg.env_stall_s >= 0.0:
        bad("env_stall_s", f"must be >= 0, got {cfg.env_stall_s}")
    if not 0.0 <= cfg.env_stall_prob <= 1.0:
        bad("env_stall_prob", f"is a probability and must be in [0, 1], got {cfg.env_stall_prob}")
    if num_envs is None:
        set_keys = [key for key, value in (
            ("slow_envs", cfg.slow_envs), ("env_slowdown", cfg.env_slowdown != 1.0),
            ("env_stall_prob", cfg.env_stall_prob), ("env_stall_s", cfg.env_stall_s),
            ("env_step_s", cfg.env_step_s)) if value]
        if set_keys:  # named by the key the config set, not always slow_envs
            bad(set_keys[0], "the env_* keys and slow_envs emulate slow environments of the RL "
                "trainer; this job has none: use slow_ranks/slowdown or the stall keys")
    elif any(e < 0 or e >= num_envs for e in cfg.slow_envs):
        bad("slow_envs", f"{cfg.slow_envs} names envs outside 0..{num_envs - 1} (env.num_envs "
            f"is {num_envs})")


class Heterogeneity:
    """How long rank ``rank`` of ``world_size`` (and each of its ``num_envs`` envs, in the
    trainer) sleeps at each step (``cfg`` checked first)."""

    def __init__(self, cfg: HeterogeneityConfig, *, rank: int, world_size: int,
                 num_envs: int | None = None):
        check_heterogeneity(cfg, world_size=world_size, num_envs=num_envs)
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

    @property
    def envs_active(self) -> bool:
        """Whether any env of this rank ever sleeps (the env_* keys)."""
        c = self.cfg
        return bool(c.slow_envs and c.env_slowdown > 1.0) or (c.env_stall_s > 0 and c.env_stall_prob > 0) \
            or c.env_step_s > 0

    def env_delay(self, env: int, work_s: float, *, step: int) -> float:
        """Seconds env ``env`` of this rank sleeps after its step ``step`` that took ``work_s``:
        the emulated simulator time, a slow env's stretch of its whole step, a stall."""
        c = self.cfg
        pause = c.env_step_s
        if env in c.slow_envs:
            pause += (c.env_slowdown - 1.0) * (work_s + c.env_step_s)
        if c.env_stall_s > 0 and c.env_stall_prob > 0 and \
                np.random.default_rng([c.seed, 2, self.rank, env, step]).random() < c.env_stall_prob:
            pause += c.env_stall_s
        return pause

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
    resumed run passes the steps already taken).

    ``envs_inside``: the envs sleep their own delays in their worker processes
    (:class:`SlowWorker`); otherwise a lock-step ``step`` also sleeps the longest of its envs'
    delays (a batched step waits for its slowest env). The asynchronous calls of a process pool
    (``step_async``/``step_wait_any``, VER) pass through; the rank's own delays are applied to
    them at :meth:`rank_step`, which the collector calls once per ``num_envs`` frames.
    """

    def __init__(self, env: VectorEnv, heterogeneity: Heterogeneity, *, first_step: int = 0,
                 envs_inside: bool = False):
        super().__init__(env)
        self.heterogeneity = heterogeneity
        self.steps = int(first_step)
        self.envs_inside = envs_inside

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
        self._after_lockstep(time.perf_counter() - start)
        return out

    def _after_lockstep(self, work: float) -> None:
        """Sleep the delay of one lock-step step that took ``work`` seconds."""
        het = self.heterogeneity
        pause = het.delay(work, step=self.steps) if het.active else 0.0
        if het.envs_active and not self.envs_inside:
            pause += max(het.env_delay(i, work, step=self.steps) for i in range(self.num_envs))
        if pause > 0:
            time.sleep(pause)
        self.steps += 1

    def step_async(self, actions, env_ids) -> None:
        """Send ``actions`` to the envs ``env_ids`` (a pool's call)."""
        self.env.step_async(actions, env_ids)

    def step_wait_any(self, **kwargs):
        """The results of the envs that finished (a pool's call). An in-process pool steps all
        its envs at once: that is a lock-step step, delayed as :meth:`step` is."""
        if self.envs_inside:
            return self.env.step_wait_any(**kwargs)
        start = time.perf_counter()
        out = self.env.step_wait_any(**kwargs)
        self._after_lockstep(time.perf_counter() - start)
        return out

    @property
    def in_flight(self):
        """Which envs have a step in flight (a pool's property)."""
        return self.env.in_flight

    def rank_step(self, work_s: float) -> None:
        """One step of this rank's schedule for asynchronous collection over worker processes:
        sleep the slow-rank share of ``work_s`` and this step's stall (no-op for an in-process
        pool, whose :meth:`step_wait_any` is the step)."""
        if self.envs_inside:
            self.heterogeneity.sleep(work_s, step=self.steps)
            self.steps += 1


class SlowWorker:
    """Picklable: wraps the env of a worker process (env ``index`` of its rank) so that its steps
    take as long as ``heterogeneity`` says (slow env, env stalls and, with ``rank_slowdown``, the
    rank's own slowdown), sleeping in the worker so the other envs go on. Called in the worker
    as ``SlowWorker(...)(env, index)``."""

    def __init__(self, heterogeneity: Heterogeneity, *, first_step: int = 0,
                 rank_slowdown: bool = False):
        self.heterogeneity, self.first_step, self.rank_slowdown = \
            heterogeneity, int(first_step), rank_slowdown

    def __call__(self, env: VectorEnv, index: int) -> VectorEnv:
        het = self.heterogeneity
        if not het.envs_active and not (self.rank_slowdown and het.factor > 1.0):
            return env
        return _SlowEnv(env, het, index=index, first_step=self.first_step,
                        rank_slowdown=self.rank_slowdown)


class _SlowEnv(VectorWrapper):
    """One env slowed inside its worker process (see :class:`SlowWorker`)."""

    def __init__(self, env: VectorEnv, heterogeneity: Heterogeneity, *, index: int, first_step: int,
                 rank_slowdown: bool):
        super().__init__(env)
        self.heterogeneity, self.index, self.steps = heterogeneity, index, int(first_step)
        self.rank_factor = heterogeneity.factor if rank_slowdown else 1.0

    def step(self, actions):
        start = time.perf_counter()
        out = self.env.step(actions)
        work = time.perf_counter() - start
        het = self.heterogeneity
        pause = (self.rank_factor - 1.0) * work + het.env_delay(self.index, work, step=self.steps)
        if pause > 0:
            time.sleep(pause)
        self.steps += 1
        return out
