"""What ``step_async(actions, env_ids)`` accepts, checked alike by both asynchronous pools
(:class:`~envs.pool.process_env.ProcessVectorEnv`, :class:`~envs.pool.in_process.InProcessAsync`)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

__all__ = ["check_async"]


def check_async(actions, env_ids, in_flight, action_space):
    """``(env_ids, actions)`` as arrays after checking them (ValueError naming the problem)."""
    ids = np.asarray(env_ids).reshape(-1)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"env_ids must be integers, got {env_ids!r}")
    ids = ids.astype(np.int64)
    actions = np.asarray(actions)
    if actions.ndim == 0 or len(actions) != len(ids):
        raise ValueError(f"step_async needs one action per env id: {len(ids)} env ids, actions "
                         f"of shape {actions.shape}")
    n = len(in_flight)
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise ValueError(f"env ids {ids.tolist()} out of range [0, {n})")
    if len(np.unique(ids)) != len(ids):
        raise ValueError(f"env ids {ids.tolist()} repeat an env")
    if in_flight[ids].any():
        raise ValueError(f"envs {ids[in_flight[ids]].tolist()} already have a step in flight: "
                         "collect it with step_wait_any() first")
    if isinstance(action_space, gym.spaces.Discrete):
        a = actions.reshape(-1)
        if not (np.issubdtype(a.dtype, np.integer) or (
                np.issubdtype(a.dtype, np.floating) and np.all(a == np.round(a)))) or (
                a.size and (a.min() < action_space.start
                            or a.max() >= action_space.start + action_space.n)):
            raise ValueError(f"actions must be integers in [{action_space.start}, "
                             f"{action_space.start + action_space.n}), got {a.tolist()}")
        actions = [int(x) for x in a]
    return ids, actions
