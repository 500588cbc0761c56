"""``HabitatVectorEnv``: N habitat environments behind the embedded simulator's vector API."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from ..delays import Delays
from .adapter import HabitatEnv
from .loader import DEFAULT_CONFIG, make_habitat_gym_env, require_habitat

__all__ = ["HabitatVectorEnv"]

_SENSOR = "habitat.simulator.agents.main_agent.sim_sensors.depth_sensor"


class HabitatVectorEnv(VectorEnv):
    """``num_envs`` habitat PointNav environments with SAME_STEP autoreset, stepped in turn in
    this process, with the same observations, actions and ``infos`` arrays as
    :class:`envs.PointNavVectorEnv`.

    ``config``: habitat-lab config path; ``overrides``: extra ``"key=value"`` overrides.
    The common options map onto the config: ``seed`` (env ``i``: ``habitat.seed = seed + i``),
    ``depth_size`` (depth sensor width and height), ``max_episode_steps``, ``split``
    (``habitat.dataset.split``) and ``episodes`` (``habitat.dataset.data_path``). The
    heterogeneity knobs behave as in the embedded simulator. ``env_fn(i) -> (habitat gym env,
    max_episode_steps)`` replaces the config-based construction (custom setups, tests).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs, *, config=DEFAULT_CONFIG, overrides=(), scenes="default",
                 split=None, seed=0, depth_size=None, max_episode_steps=None, episodes=None,
                 slowdown=1.0, step_delay_s=0.0, step_delay_prob=0.0, reset_delay_s=0.0,
                 env_fn=None):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs!r}")
        if scenes != "default":
            raise ValueError("scenes selects the embedded simulator's scene sets; for habitat, "
                             "choose scenes through the config (habitat.dataset.*) or episodes")
        self.delays = Delays(slowdown=slowdown, step_delay_s=step_delay_s,
                             step_delay_prob=step_delay_prob, reset_delay_s=reset_delay_s,
                             seed=seed)
        if env_fn is None:
            require_habitat()  # fail at once, before any other work, with install help
            common = []
            if depth_size is not None:
                common += [f"{_SENSOR}.width={int(depth_size)}",
                           f"{_SENSOR}.height={int(depth_size)}"]
            if max_episode_steps is not None:
                common.append(f"habitat.environment.max_episode_steps={int(max_episode_steps)}")
            if split is not None:
                common.append(f"habitat.dataset.split={split}")
            if episodes is not None:
                common.append(f"habitat.dataset.data_path={episodes}")

            def env_fn(i):
                return make_habitat_gym_env(config, overrides=[
                    *common, f"habitat.seed={int(seed) + i}", *overrides])

        self.envs = []
        for i in range(int(num_envs)):
            henv, steps = env_fn(i)
            self.envs.append(HabitatEnv(henv, max_episode_steps=steps if max_episode_steps is None
                                        else max_episode_steps))
        self.num_envs = len(self.envs)
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = gym.spaces.Discrete(4)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._seed = seed
        self._started = False

    def reset(self, *, seed=None, options=None):
        """Reset every env (``seed``: env ``i`` reseeded with ``seed + i``)."""
        start = time.perf_counter()
        if seed is not None:
            self.delays.reseed(seed)
        results = [env.reset(seed=None if seed is None else seed + i)
                   for i, env in enumerate(self.envs)]
        self._started = True
        self.delays.wait(time.perf_counter() - start, resets=self.num_envs, step=False)
        return self._stack([r[0] for r in results]), self._infos([r[1] for r in results])

    def step(self, actions):
        """Step every env; a finished env is reset at once (its info describes the ended
        episode, its observation is the next episode's first)."""
        if not self._started:
            raise RuntimeError("call reset() before step()")
        a = np.asarray(actions)
        if a.shape != (self.num_envs,):
            raise ValueError(f"actions must be {self.num_envs} integers (0 STOP, 1 MOVE_FORWARD,"
                             f" 2 TURN_LEFT, 3 TURN_RIGHT), got shape {a.shape}")
        start = time.perf_counter()
        obs, rewards, terms, truncs, infos = [], [], [], [], []
        resets = 0
        for env, act in zip(self.envs, a):
            o, r, term, trunc, info = env.step(act)
            if term or trunc:
                o, _ = env.reset()
                resets += 1
            obs.append(o)
            rewards.append(r)
            terms.append(term)
            truncs.append(trunc)
            infos.append(info)
        self.delays.wait(time.perf_counter() - start, resets=resets)
        return (self._stack(obs), np.asarray(rewards, dtype=np.float32),
                np.asarray(terms, dtype=bool), np.asarray(truncs, dtype=bool), self._infos(infos))

    @staticmethod
    def _stack(obs):
        return {k: np.stack([o[k] for o in obs]) for k in obs[0]}

    @staticmethod
    def _infos(infos):
        return {
            "distance_to_goal": np.array([i["distance_to_goal"] for i in infos], np.float32),
            "success": np.array([i["success"] for i in infos], dtype=bool),
            "spl": np.array([i["spl"] for i in infos], np.float32),
            "episode_id": np.array([i["episode_id"] for i in infos], dtype=object),
            "elapsed_steps": np.array([i["elapsed_steps"] for i in infos], dtype=np.int64),
            "counted": np.ones(len(infos), dtype=bool),
        }

    def close_extras(self, **kwargs):
        """Close every habitat environment."""
        for env in self.envs:
            env.close()
