"""Navigation environments for wagma-rl.

``import envs`` registers ``"PointNav-v0"`` (the embedded simulator) with gymnasium.
:func:`make_vector_env` is the one factory the trainer uses: ``backend="pointnav"`` (default,
always available) or ``backend="habitat"`` (needs habitat-sim and habitat-lab).
"""

import gymnasium as gym

from .pointnav import Action, PointNavEnv, PointNavVectorEnv

__all__ = ["PointNavEnv", "PointNavVectorEnv", "Action", "make_vector_env", "BACKENDS"]

BACKENDS = ("pointnav", "habitat")

if "PointNav-v0" not in gym.registry:
    gym.register(id="PointNav-v0", entry_point="envs.pointnav.env:PointNavEnv",
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
