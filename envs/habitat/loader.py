"""Importing habitat-lab / habitat-sim, composing their config, and building their gym environments.

Only this module imports ``habitat``; nothing else in the project does.
"""

from __future__ import annotations

import copy
import os
import re

from .py311 import allow_habitat_config_defaults

__all__ = ["HABITAT_LAB_VERSION", "INSTALL_HELP", "DEFAULT_CONFIG", "require_habitat",
           "override", "make_habitat_config", "load_dataset", "subset", "make_habitat_gym_env"]

# The habitat-lab release whose gym interface (habitat.gym.make_gym_from_config, HabGymWrapper:
# reset() -> obs, step(int) -> (obs, reward, done, info)) the adapter was written against.
HABITAT_LAB_VERSION = "0.3.3"
# Depth-only PointNav (habitat's benchmark configs also render an RGB camera nobody reads).
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                              "pointnav_depth.yaml")

INSTALL_HELP = f"""\
The "habitat" backend needs habitat-sim and habitat-lab, which are not installable from PyPI.
Install them with conda (Python 3.9+), for example:

    conda create -n habitat python=3.9 cmake=3.14.0
    conda activate habitat
    conda install habitat-sim={HABITAT_LAB_VERSION} withbullet headless -c conda-forge -c aihabitat
    pip install habitat-lab=={HABITAT_LAB_VERSION}

("headless" builds habitat-sim for clusters and machines without a display; drop it on a
desktop.) Then download the PointNav scenes and episodes (e.g. `python -m
habitat_sim.utils.datasets_download --uids habitat_test_scenes habitat_test_pointnav_dataset`),
or export the embedded scenes (`python -m envs.pointnav.export`, see docs/environments.md).
The embedded simulator needs none of this: backend="pointnav" is the default."""


def require_habitat():
    """Import and return ``(habitat, habitat_sim)``; raise ImportError with install help."""
    allow_habitat_config_defaults()  # before habitat's config dataclasses are defined
    try:
        import habitat_sim  # noqa: F401
        import habitat
    except ImportError as exc:
        raise ImportError(f"{exc}\n\n{INSTALL_HELP}") from exc
    return habitat, habitat_sim


def override(key, value):
    """The Hydra override ``key='value'`` with ``value`` quoted, so that paths with ``{split}``,
    commas, spaces or quotes reach habitat's config unchanged."""
    text = str(value)
    # Inside '...' Hydra unescapes only backslashes that precede a quote (or end the string)
    # and the quote itself; `${` would start an interpolation.
    text = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), text)
    return f"{key}='{text.replace('${', chr(92) + '${')}'"


def make_habitat_config(config=DEFAULT_CONFIG, *, overrides=()):
    """habitat-lab's config for ``config`` (a YAML path) and ``overrides`` (Hydra strings)."""
    habitat, _ = require_habitat()
    return habitat.get_config(os.fspath(config), overrides=list(overrides))


def load_dataset(cfg):
    """The episode dataset ``cfg.habitat.dataset`` names, through habitat's own loader."""
    from habitat.datasets import make_dataset

    ds = cfg.habitat.dataset
    return make_dataset(ds.type, config=ds)


def subset(dataset, episodes):
    """A shallow copy of ``dataset`` holding only ``episodes``."""
    part = copy.copy(dataset)
    part.episodes = list(episodes)
    return part


def make_habitat_gym_env(cfg, *, dataset=None):
    """One habitat gym environment (``HabGymWrapper``) for config ``cfg`` (and ``dataset``, else
    the config's); returns ``(env, max_episode_steps)``."""
    from habitat.gym import make_gym_from_config

    return make_gym_from_config(cfg, dataset=dataset), int(cfg.habitat.environment.max_episode_steps)
