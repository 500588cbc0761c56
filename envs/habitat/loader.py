"""Importing habitat-lab / habitat-sim, composing their config, and building their gym environments.

Only this module imports ``habitat``; nothing else in the project does.
"""

from __future__ import annotations

import copy
import os
import re

from .py311 import allow_habitat_config_defaults

__all__ = ["HABITAT_LAB_VERSION", "HABITAT_LAB_PYPI_VERSION", "INSTALL_HELP", "DEFAULT_CONFIG",
           "require_habitat", "version_problem", "override", "make_habitat_config",
           "load_dataset", "subset",
           "make_habitat_gym_env", "unread_sensors", "scenes_to_load", "restrict_scenes",
           "RGB_CAMERA", "add_rgb_camera"]

# The habitat-lab release whose gym interface (habitat.gym.make_gym_from_config, HabGymWrapper:
# reset() -> obs, step(int) -> (obs, reward, done, info)) the adapter was written against, and
# the habitat-sim release it goes with.
HABITAT_LAB_VERSION = "0.3.3"
# PyPI names that release by its date (there is no "habitat-lab==0.3.3" there).
HABITAT_LAB_PYPI_VERSION = "0.3.320250127"
# Depth-only PointNav (habitat's benchmark configs also render an RGB camera nobody reads).
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                              "pointnav_depth.yaml")

INSTALL_HELP = f"""\
The "habitat" backend needs habitat-lab and habitat-sim {HABITAT_LAB_VERSION}, with Python 3.10 or 3.11 (this
project needs 3.10 or later; habitat-lab {HABITAT_LAB_VERSION} lists 3.9 to 3.11). habitat-lab is on PyPI; it
pins numpy==1.26.4 and gym<0.23.1, so give it its own virtual environment:

    pip install habitat-lab=={HABITAT_LAB_PYPI_VERSION}

habitat-sim is not on PyPI, and the aihabitat conda channel builds {HABITAT_LAB_VERSION} for Python 3.9 only,
so build it from source into the same environment, headless (for clusters and machines without
a display; it needs cmake, a C++ compiler and the EGL/GL development headers):

    git clone --branch v{HABITAT_LAB_VERSION} https://github.com/facebookresearch/habitat-sim.git
    cd habitat-sim && pip install -r requirements.txt && HEADLESS=True pip install .

Then download the PointNav scenes and episodes (e.g. `python -m
habitat_sim.utils.datasets_download --uids habitat_test_scenes habitat_test_pointnav_dataset`),
or export the embedded scenes (`python -m envs.pointnav.export`, see docs/environments.md).
The embedded simulator needs none of this: backend="pointnav" is the default."""


def require_habitat():
    """Import and return ``(habitat, habitat_sim)``; raise ImportError with install help, or
    with one line naming the versions when habitat-lab or habitat-sim is not
    :data:`HABITAT_LAB_VERSION` (:func:`version_problem`)."""
    allow_habitat_config_defaults()  # before habitat's config dataclasses are defined
    try:
        import habitat_sim  # noqa: F401
        import habitat
    except ImportError as exc:
        raise ImportError(f"{exc}\n\n{INSTALL_HELP}") from exc
    problem = version_problem(getattr(habitat, "__version__", None),
                              getattr(habitat_sim, "__version__", None))
    if problem:
        raise ImportError(problem)
    return habitat, habitat_sim


def version_problem(lab_version, sim_version):
    """The one line saying which installed habitat release is not the supported one
    (:data:`HABITAT_LAB_VERSION`: the adapter uses its gym interface and config schema, which
    change between releases), or None."""
    found = [(name, v) for name, v in (("habitat-lab", lab_version), ("habitat-sim", sim_version))
             if str(v) != HABITAT_LAB_VERSION]
    if not found:
        return None
    what = " and ".join(f"{name} {v or '(unknown version)'}" for name, v in found)
    return (f"{what} installed; the habitat backend supports habitat-lab and habitat-sim "
            f"{HABITAT_LAB_VERSION} only: pip install habitat-lab=={HABITAT_LAB_PYPI_VERSION} and "
            f"build habitat-sim v{HABITAT_LAB_VERSION} (docs/environments.md)")


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


def scenes_to_load(cfg):
    """The scene names ``cfg.habitat.dataset`` loads: its ``content_scenes``, or with ``"*"``
    every scene of the dataset (habitat's ``get_scenes_to_load``, as habitat-baselines asks)."""
    from habitat.datasets import make_dataset

    ds = cfg.habitat.dataset
    scenes = list(ds.content_scenes)
    if "*" in scenes:
        scenes = list(make_dataset(ds.type).get_scenes_to_load(ds))
    return scenes


def restrict_scenes(cfg, scenes):
    """``cfg`` with ``habitat.dataset.content_scenes`` set to ``scenes`` (in place)."""
    from habitat.config import read_write

    with read_write(cfg):
        cfg.habitat.dataset.content_scenes = list(scenes)
    return cfg


def subset(dataset, episodes):
    """A shallow copy of ``dataset`` holding only ``episodes``."""
    part = copy.copy(dataset)
    part.episodes = list(episodes)
    return part


#: The Hydra override that adds habitat's RGB camera to the default agent (``sensors=[depth,
#: rgb]``); :func:`add_rgb_camera` then gives it the depth camera's size.
RGB_CAMERA = ("+habitat/simulator/sim_sensors@habitat.simulator.agents.main_agent.sim_sensors."
              "rgb_sensor=rgb_sensor")


def add_rgb_camera(cfg):
    """``cfg`` (composed with :data:`RGB_CAMERA`) with the RGB camera at the depth camera's
    width and height (in place)."""
    from habitat.config import read_write

    cams = cfg.habitat.simulator.agents.main_agent.sim_sensors
    with read_write(cfg):
        cams.rgb_sensor.width, cams.rgb_sensor.height = cams.depth_sensor.width, \
            cams.depth_sensor.height
    return cfg


def unread_sensors(cfg, sensors=("depth",)):
    """The simulator sensors of ``cfg`` the policy does not read (all but depth cameras, and
    RGB cameras when ``sensors`` has ``"rgb"``), as config keys: habitat would render them every
    step for nothing."""
    kinds = ("Depth", *(("RGB",) if "rgb" in sensors else ()))
    return [f"habitat.simulator.agents.{agent}.sim_sensors.{name}"
            for agent, agent_cfg in cfg.habitat.simulator.agents.items()
            for name, sensor in agent_cfg.sim_sensors.items()
            if not any(k in str(sensor.type) for k in kinds)]


def make_habitat_gym_env(cfg, *, dataset=None, sensors=("depth",)):
    """One habitat gym environment (``HabGymWrapper``) for config ``cfg`` (and ``dataset``, else
    the config's); returns ``(env, max_episode_steps)``. A config rendering a sensor the policy
    does not read (an RGB camera unless ``sensors`` has ``"rgb"``) is refused (ValueError
    naming it)."""
    from habitat.gym import make_gym_from_config

    unread = unread_sensors(cfg, sensors)
    if unread:
        read = " + ".join((*sensors, "pointgoal_with_gps_compass"))
        raise ValueError(f"the habitat config renders sensor(s) {unread} that the policy does not "
                         f"read (it takes {read} only): remove them (the default config, "
                         f"{DEFAULT_CONFIG}, renders depth only), or ask for an RGB camera "
                         f"with sensors=['depth', 'rgb']")
    return make_gym_from_config(cfg, dataset=dataset), int(cfg.habitat.environment.max_episode_steps)
