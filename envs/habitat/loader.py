"""Importing habitat-lab / habitat-sim and building their gym environments from a config.

Only this module imports ``habitat``; nothing else in the project does.
"""

from __future__ import annotations

__all__ = ["HABITAT_LAB_VERSION", "INSTALL_HELP", "require_habitat", "make_habitat_gym_env",
           "DEFAULT_CONFIG"]

# The habitat-lab release whose gym interface (habitat.gym.make_gym_from_config, HabGymWrapper:
# reset() -> obs, step(int) -> (obs, reward, done, info)) the adapter was written against.
HABITAT_LAB_VERSION = "0.3.3"
DEFAULT_CONFIG = "benchmark/nav/pointnav/pointnav_habitat_test.yaml"

INSTALL_HELP = f"""\
The "habitat" backend needs habitat-sim and habitat-lab, which are not installable from PyPI.
Install them with conda (Python 3.9+), for example:

    conda create -n habitat python=3.9 cmake=3.14.0
    conda activate habitat
    conda install habitat-sim={HABITAT_LAB_VERSION} withbullet headless -c conda-forge -c aihabitat
    pip install habitat-lab=={HABITAT_LAB_VERSION}

("headless" builds habitat-sim for clusters and machines without a display; drop it on a
desktop.) Then download the PointNav scenes and episodes (e.g. `python -m
habitat_sim.utils.datasets_download --uids habitat_test_scenes habitat_test_pointnav_dataset`).
The embedded simulator needs none of this: backend="pointnav" is the default."""


def require_habitat():
    """Import and return ``(habitat, habitat_sim)``; raise ImportError with install help."""
    try:
        import habitat_sim  # noqa: F401
        import habitat
    except ImportError as exc:
        raise ImportError(f"{exc}\n\n{INSTALL_HELP}") from exc
    return habitat, habitat_sim


def make_habitat_gym_env(config=DEFAULT_CONFIG, *, overrides=()):
    """Build one habitat gym environment (``HabGymWrapper``) from a habitat-lab config path
    plus ``overrides`` (``"key.path=value"`` strings); returns ``(env, max_episode_steps)``."""
    habitat, _ = require_habitat()
    from habitat.gym import make_gym_from_config

    cfg = habitat.get_config(config, overrides=list(overrides))
    env = make_gym_from_config(cfg)
    return env, int(cfg.habitat.environment.max_episode_steps)
