"""Navigation environments for wagma-rl.

``import envs`` registers ``"PointNav-v0"`` (the embedded simulator) with gymnasium, with
:class:`PointNavVectorEnv` as its vector entry point (``gymnasium.make_vec``).
:func:`make_vector_env` is the one factory the trainer uses: ``backend="pointnav"`` (default,
always available) or ``backend="habitat"`` (needs habitat-sim and habitat-lab);
:func:`make_eval_env` gives a backend's fixed evaluation episode set. Both take the same
backend-neutral options (``split``, ``seed``, ``depth_size``, ``max_episode_steps``,
``episodes``, ``scenes``); anything else is the backend's own option.
"""

import gymnasium as gym

from .eval_set import EvalSet
from .pointnav import Action, PointNavEnv, PointNavVectorEnv

__all__ = ["PointNavEnv", "PointNavVectorEnv", "Action", "make_vector_env", "make_eval_env",
           "EvalSet", "BACKENDS"]

BACKENDS = ("pointnav", "habitat")

if "PointNav-v0" not in gym.registry:
    # ``gym.make_vec("PointNav-v0", n)`` builds the batched simulator itself (the vector entry
    # point), not n single envs behind gymnasium's SyncVectorEnv.
    gym.register(id="PointNav-v0", entry_point="envs.pointnav.env:PointNavEnv",
                 vector_entry_point="envs.pointnav.vector_env:PointNavVectorEnv",
                 max_episode_steps=None, disable_env_checker=True)


def make_vector_env(backend="pointnav", num_envs=1, **kwargs):
    """A batched PointNav environment of ``num_envs`` envs with the gymnasium vector API.

    ``backend="pointnav"``: :class:`PointNavVectorEnv` (``kwargs`` are its options).
    ``backend="habitat"``: :class:`envs.habitat.HabitatVectorEnv` over real Habitat scenes;
    raises ImportError with install instructions when habitat-sim/habitat-lab are missing.
    """
    if backend == "pointnav":
        return PointNavVectorEnv(num_envs, **kwargs)
    if backend == "habitat":
        from .habitat import HabitatVectorEnv

        return HabitatVectorEnv(num_envs, **kwargs)
    raise ValueError(f"unknown environment backend {backend!r}: use one of {list(BACKENDS)}")


def make_eval_env(backend="pointnav", num_envs=1, **kwargs):
    """The backend's evaluation set as an :class:`EvalSet` (a vector env of at most
    ``num_envs`` envs that runs each episode once, the episode ids, their source).

    Common options: ``split``, ``episodes`` (an episode file; None: the backend's own set for
    ``split``), ``num_episodes`` (the first that many; 0: all), ``seed``, ``episode_dir`` (where
    a backend may keep an episode set it draws), ``depth_size``, ``max_episode_steps``; the
    rest are the backend's options as for :func:`make_vector_env`.
    """
    if backend == "pointnav":
        from .pointnav.vector_env import eval_env
    elif backend == "habitat":
        from .habitat.vector_env import eval_env
    else:
        raise ValueError(f"unknown environment backend {backend!r}: use one of {list(BACKENDS)}")
    return eval_env(num_envs, **kwargs)
