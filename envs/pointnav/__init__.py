"""The embedded PointNav simulator: Habitat's PointGoal navigation task on occupancy grids."""

from .env import PointNavEnv
from .episodes import Episode, EpisodeFileError, load_episodes, save_episodes
from .grid import OccupancyGrid, load_occupancy_png, save_occupancy_png
from .generator import generate_floor_plan
from .scenes import SCENE_SETS, SceneSet, get_scene_set, load_scene, register_scene_set
from .spec import Action
from .vector_env import PointNavVectorEnv

__all__ = ["PointNavEnv", "PointNavVectorEnv", "Action", "Episode", "EpisodeFileError",
           "load_episodes", "save_episodes", "OccupancyGrid", "load_occupancy_png",
           "save_occupancy_png", "generate_floor_plan", "SceneSet", "SCENE_SETS",
           "get_scene_set", "load_scene", "register_scene_set"]
