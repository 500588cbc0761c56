"""The asynchronous calls of a pool over a batched vector env in this process (no worker)."""

from __future__ import annotations

import os

import numpy as np
from gymnasium.vector import VectorWrapper

from .actions import check_async

__all__ = ["InProcessAsync"]


class InProcessAsync(VectorWrapper):
    """The asynchronous calls of :class:`~envs.pool.process_env.ProcessVectorEnv` over a batched vector env in this
    process (e.g. ``PointNavVectorEnv``), whose one ``step`` moves every env.

    ``step_async`` records actions; ``step_wait_any`` steps the wrapped env once every env has
    an action pending and returns all envs as finished together. It raises RuntimeError when
    only some envs have one (a batched env cannot step a subset). ``reset``, ``step`` and any
    other attribute pass through to the wrapped env.
    """

    def __init__(self, env):
        super().__init__(env)
        self._in_flight = np.zeros(env.num_envs, dtype=bool)
        self._actions = [None] * env.num_envs

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, *, seed=None, options=None):
        """Reset the wrapped env; no step may be pending."""
        self._check_idle("reset()")
        return self.env.reset(seed=seed, options=options)

    def step(self, actions):
        """Step the wrapped env; no step may be pending."""
        self._check_idle("step()")
        return self.env.step(actions)

    def step_async(self, actions, env_ids):
        """Record ``actions[k]`` for env ``env_ids[k]`` (ValueError when one is pending)."""
        ids, acts = check_async(actions, env_ids, self._in_flight, self.single_action_space)
        for i, a in zip(ids, acts):
            self._actions[i] = a
        self._in_flight[ids] = True

    def step_wait_any(self, *, timeout=None, within=None):
        """Step every env with its pending action; returns ``(env_ids, obs, rewards,
        terminated, truncated, infos)`` with ``env_ids`` all envs. ``timeout`` and ``within``
        are not used (the step is synchronous)."""
        if not self._in_flight.any():
            raise RuntimeError("step_wait_any() with no step in flight: call step_async() first")
        if not self._in_flight.all():
            raise RuntimeError(f"{type(self.env).__name__} steps all its envs at once: call "
                               f"step_async() for every env before step_wait_any() (envs "
                               f"{np.flatnonzero(~self._in_flight).tolist()} have no action); "
                               "stepping a subset needs ProcessVectorEnv")
        actions = np.asarray(self._actions)
        self._in_flight[:] = False
        self._actions = [None] * self.num_envs
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        return np.arange(self.num_envs, dtype=np.int64), obs, rewards, terminated, truncated, infos

    @property
    def in_flight(self):
        """Bool array (num_envs,): the envs with an action pending."""
        return self._in_flight.copy()

    @property
    def pids(self):
        """This process's pid for every env."""
        return [os.getpid()] * self.num_envs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_idle(self, what):
        if self._in_flight.any():
            raise RuntimeError(f"{what} with actions pending for envs "
                               f"{np.flatnonzero(self._in_flight).tolist()}: collect them with "
                               "step_wait_any() first")
