"""``PointNav-v0``: one embedded PointNav environment with the gymnasium API."""

from __future__ import annotations


import gymnasium as gym
import numpy as np

from .sim import PointNavSim, check_options
from .spec import MAX_EPISODE_STEPS
from .topdown import top_down_map

__all__ = ["PointNavEnv", "observation_space", "check_sensors", "SENSORS"]


#: The cameras an env may render (``sensors``): depth always, RGB on request.
SENSORS = ("depth", "rgb")


def check_sensors(sensors):
    """``sensors`` as a tuple in :data:`SENSORS` order; ValueError unless it is depth, or depth
    and rgb."""
    got = tuple(sensors)
    if "depth" not in got or set(got) - set(SENSORS) or len(set(got)) != len(got):
        raise ValueError(f"sensors must be ['depth'] or ['depth', 'rgb'] (the policy always reads "
                         f"depth), got {list(got)}")
    return tuple(s for s in SENSORS if s in got)


def observation_space(depth_size, sensors=("depth",)):
    """The Dict observation space of one environment: ``depth`` (float32 in [0, 1]), ``rgb``
    (uint8, as Habitat's RGB sensor) when ``sensors`` has it, and
    ``pointgoal_with_gps_compass``."""
    spaces = {"depth": gym.spaces.Box(0.0, 1.0, (depth_size, depth_size, 1), dtype=np.float32)}
    if "rgb" in check_sensors(sensors):
        spaces["rgb"] = gym.spaces.Box(0, 255, (depth_size, depth_size, 3), dtype=np.uint8)
    spaces["pointgoal_with_gps_compass"] = gym.spaces.Box(
        np.array([0.0, -np.pi], dtype=np.float32),
        np.array([np.inf, np.pi], dtype=np.float32), dtype=np.float32)
    return gym.spaces.Dict(spaces)


class PointNavEnv(gym.Env):
    """A single PointNav environment (the embedded simulator).

    Options are those of :class:`envs.PointNavVectorEnv` (``scenes``, ``split``, ``seed``,
    ``depth_size``, ``max_episode_steps``, ``episodes``, noise options). ``terminated``
    is True after STOP, ``truncated`` after ``max_episode_steps`` steps; ``info`` holds
    ``distance_to_goal``, ``success`` and ``spl`` (final when the episode ends) and
    ``episode_id``. The state is exposed for tools: ``agent_position``, ``agent_heading``,
    ``goal_position``, ``occupancy``, ``resolution`` and ``geodesic_distance(a, b)``.
    """

    # render_fps: the rate a viewer replays rendered frames at (the simulator itself has no
    # clock: an action is one discrete step).
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, *, seed=0, depth_size=64, max_episode_steps=MAX_EPISODE_STEPS,
                 render_mode=None, **options):
        check_options(options, "PointNav-v0")
        self._sim = PointNavSim(1, seed=seed, depth_size=depth_size,
                                max_episode_steps=max_episode_steps, **options)
        self.observation_space = observation_space(int(depth_size), self._sim.sensors)
        self.action_space = gym.spaces.Discrete(4)
        self.render_mode = render_mode
        self._seed = seed
        self._started = False

    def reset(self, *, seed=None, options=None):
        """Start the next episode (reseeding first when ``seed`` is given)."""
        super().reset(seed=seed)
        sim = self._sim
        if seed is not None or not self._started:
            obs, info = sim.reset(seed=self._seed if seed is None else seed)
            self._started = True
        else:
            # Continue the seeded stream, exactly as an auto-resetting vector env does.
            sim.reset_env(0)
            obs, info = sim.observe(), sim.start_infos()
        return _single(obs), _single_info(info)

    def step(self, action):
        """Apply ``action`` (0 STOP, 1 MOVE_FORWARD, 2 TURN_LEFT, 3 TURN_RIGHT)."""
        if not self._started:
            raise RuntimeError("call reset() before step()")
        obs, reward, term, trunc, info = self._sim.step(np.array([action]).reshape(-1),
                                                        autoreset=False)
        return _single(obs), float(reward[0]), bool(term[0]), bool(trunc[0]), _single_info(info)

    def render(self):
        """Top-down RGB image of the map with the agent (blue) and goal (green)
        (:func:`envs.pointnav.topdown.top_down_map` of the agent's position alone)."""
        sim = self._sim
        return top_down_map(sim.scene[0].grid.blocked, sim.resolution, [sim.pos[0]], sim.goal[0])

    # ---- state for tests and tools ------------------------------------------------------
    @property
    def agent_position(self):
        """Agent position ``(x, y)`` in metres (``y`` is Habitat's ``z``)."""
        return self._sim.pos[0].copy()

    @property
    def agent_heading(self):
        """Agent yaw in radians (Habitat's convention; TURN_LEFT increases it)."""
        return float(self._sim.heading[0])

    @property
    def goal_position(self):
        """Goal position ``(x, y)`` in metres."""
        return self._sim.goal[0].copy()

    @property
    def occupancy(self):
        """The scene's occupancy grid: 2-D bool array, True = blocked; ``[row, col]`` is the
        cell at ``x = col * resolution``, ``y = row * resolution``."""
        return self._sim.scene[0].grid.blocked

    @property
    def resolution(self):
        """Metres per occupancy cell."""
        return self._sim.resolution

    @property
    def episode_geodesic_distance(self):
        """Geodesic start-goal distance of the current episode (SPL's shortest path)."""
        return float(self._sim.shortest[0])

    @property
    def scene(self):
        """The current :class:`envs.pointnav.scenes.Scene`."""
        return self._sim.scene[0]

    @property
    def episode(self):
        """The current :class:`envs.pointnav.episodes.Episode`."""
        return self._sim.episode[0]

    def geodesic_distance(self, a, b):
        """Geodesic distance in metres between positions ``a`` and ``b`` in the current scene."""
        return self._sim.scene[0].geodesic_distance(a, b)

    def set_agent_state(self, position, heading):
        """Place the agent (for tests and tools); the position must be navigable."""
        sim = self._sim
        if not sim.scene[0].is_navigable(position):
            raise ValueError(f"position {tuple(position)} is not navigable")
        sim.pos[0] = position
        sim.heading[0] = heading
        sim.prev_distance[0] = sim.distances(np.array([0]))[0]


def _single(obs):
    return {k: v[0] for k, v in obs.items()}


def _single_info(info):
    return {k: (v[0].item() if isinstance(v[0], np.generic) else v[0]) for k, v in info.items()}
