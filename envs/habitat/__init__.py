"""The Habitat backend: real habitat-sim PointNav environments behind this project's interface.

Needs habitat-sim and habitat-lab (conda; see :data:`INSTALL_HELP`). Importing this package
does not import habitat; building an environment does, and fails at once with install help
when habitat is missing. The adapter targets habitat-lab :data:`HABITAT_LAB_VERSION`.
"""

from .adapter import HabitatEnv
from .loader import HABITAT_LAB_VERSION, INSTALL_HELP, make_habitat_gym_env, require_habitat
from .vector_env import HabitatVectorEnv

__all__ = ["HabitatEnv", "HabitatVectorEnv", "HABITAT_LAB_VERSION", "INSTALL_HELP",
           "make_habitat_gym_env", "require_habitat"]
