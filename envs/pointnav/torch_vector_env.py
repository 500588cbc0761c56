"""``TorchPointNavVectorEnv``: the device batch simulator behind gymnasium's vector API.

The trainer's device rollout steps it: observations, rewards, dones and infos are tensors on the
simulator's device, never copied to the host per step. ``gymnasium.make_vec("PointNav-v0")`` keeps
returning the numpy :class:`envs.pointnav.vector_env.PointNavVectorEnv`.
"""

from __future__ import annotations

import gymnasium as gym
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from .env import observation_space
from .spec import MAX_EPISODE_STEPS
from .torch_sim import TorchPointNavSim

__all__ = ["TorchPointNavVectorEnv"]


class TorchPointNavVectorEnv(VectorEnv):
    """``num_envs`` PointNav environments as rows of tensors on ``device`` (SAME_STEP autoreset).

    ``step(actions)`` takes an int tensor (or array) of N actions and returns ``(obs, rewards,
    terminated, truncated, infos)`` as tensors on ``device`` (see
    :class:`envs.pointnav.torch_sim.TorchPointNavSim` for the infos and the options, which are
    the numpy env's with ``repeat_episodes`` always on, plus ``graph``: CUDA graph replay, and
    ``compile``: the ray cast through torch.compile).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
    on_device = True
    """Marks a vector env whose results are device tensors (the trainer's device rollout)."""

    def __init__(self, num_envs, *, device="cpu", scenes="default", split="train", seed=0,
                 depth_size=64, max_episode_steps=MAX_EPISODE_STEPS, episodes=None, **more):
        self._sim = TorchPointNavSim(num_envs, device=device, scenes=scenes, split=split,
                                     seed=seed, depth_size=depth_size,
                                     max_episode_steps=max_episode_steps, episodes=episodes,
                                     **more)
        self.num_envs = self._sim.num_envs
        self.device = self._sim.device
        self.single_observation_space = observation_space(int(depth_size))
        self.single_action_space = gym.spaces.Discrete(4)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._seed = seed
        self._started = False

    def reset(self, *, seed=None, options=None):
        """Reset every env (the first reset uses the constructor's seed)."""
        if seed is None and not self._started:
            seed = self._seed
        self._started = True
        return self._sim.reset(seed=seed)

    def step(self, actions):
        """Step every env with ``actions`` (N integers: 0 STOP, 1 MOVE_FORWARD, 2 TURN_LEFT,
        3 TURN_RIGHT)."""
        if not self._started:
            raise RuntimeError("call reset() before step()")
        return self._sim.step(actions)

    def close_extras(self, **kwargs):
        """Nothing to release beyond the tensors."""

    @property
    def sim(self):
        """The batch simulator (state for tests and tools)."""
        return self._sim
