"""The Habitat backend: real habitat-sim PointNav environments behind this project's interface.

Needs habitat-sim and habitat-lab (see :data:`INSTALL_HELP`). Importing this package
does not import habitat; building an environment does, and fails at once with install help
when habitat is missing. The adapter targets habitat-lab :data:`HABITAT_LAB_VERSION`; its
default config (:data:`DEFAULT_CONFIG`) is depth-only PointNav. docs/environments.md has the
options, the evaluation set and the contract tests against the real habitat-lab. habitat-sim
runs one simulator per process: ``envs.make_vector_env("habitat", n, workers="process")`` gives
each env its own; :func:`worker_gpu`, :func:`renderer_gpu` and :func:`scene_split` place them (GPU,
scenes).
"""

from .adapter import HabitatEnv
from .loader import (DEFAULT_CONFIG, HABITAT_LAB_VERSION, INSTALL_HELP, make_habitat_config,
                     make_habitat_gym_env, require_habitat)
from .placement import renderer_gpu, scene_split, worker_gpu
from .vector_env import HabitatVectorEnv, eval_env

__all__ = ["HabitatEnv", "HabitatVectorEnv", "eval_env", "DEFAULT_CONFIG", "HABITAT_LAB_VERSION",
           "INSTALL_HELP", "make_habitat_config", "make_habitat_gym_env", "require_habitat",
           "renderer_gpu", "scene_split", "worker_gpu"]
