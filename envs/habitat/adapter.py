"""Translation between a habitat-lab gym environment and this project's env interface.

habitat-lab's ``HabGymWrapper`` speaks the old gym API: ``reset() -> obs`` and
``step(action) -> (obs, reward, done, info)`` with ``info`` holding the task metrics. This module
turns that into the embedded simulator's interface: the same observation keys and dtypes,
gymnasium's ``(obs, reward, terminated, truncated, info)``, and ``info`` with
``distance_to_goal``, ``success``, ``spl`` and ``episode_id`` (and, when asked, habitat's
``top_down_map`` measure as an RGB image). Habitat does not say whether an episode ended on STOP
or on its step limit, so ``truncated`` is derived from the step count.
It never imports habitat: it only calls the wrapped object's documented methods.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from ..pointnav.env import check_sensors, observation_space
from ..pointnav.spec import Action
from ..pointnav.topdown import FREE_RGB, GOAL_RGB, PATH_RGB, START_RGB, WALL_RGB

__all__ = ["HabitatEnv", "measures", "BASE_MEASURES", "colorize_top_down_map"]

OBS_KEYS = ("depth", "pointgoal_with_gps_compass")  # always read; "rgb" too when asked


class HabitatEnv(gym.Env):
    """One habitat gym environment presented like ``PointNav-v0``.

    ``habitat_env``: a habitat-lab gym env (``habitat.gym.make_gym_from_config``);
    ``max_episode_steps``: the config's ``habitat.environment.max_episode_steps``;
    ``sensors``: ``("depth",)`` or ``("depth", "rgb")`` (then habitat's ``rgb`` observation,
    uint8 ``(H, W, 3)`` of the depth image's size, is passed on); ``top_down_map``: with N > 0,
    ``info["top_down_map"]`` is habitat's ``top_down_map`` measure (the config must have it) as
    an RGB image of at most N pixels a side (:func:`colorize_top_down_map`), at a reset the
    new episode's.
    """

    metadata = {"render_modes": []}

    def __init__(self, habitat_env, *, max_episode_steps, sensors=("depth",), top_down_map=0):
        self._env = habitat_env
        self.top_down_map = int(top_down_map)
        self.max_episode_steps = int(max_episode_steps)
        self.sensors = check_sensors(sensors)
        read = (*OBS_KEYS, *(("rgb",) if "rgb" in self.sensors else ()))
        spaces = getattr(habitat_env.observation_space, "spaces", {})
        missing = [k for k in read if k not in spaces]
        if missing:
            raise ValueError(f"the habitat environment lacks observation(s) {missing}: use a "
                             f"PointNav config with a depth sensor and the "
                             f"pointgoal_with_gps_compass sensor (and habitat.gym.obs_keys "
                             f"including them)")
        extra = [k for k in spaces if k not in read]
        if extra:
            # Rendered (an RGB camera: about half the rendering time) and then dropped: refused.
            raise ValueError(f"the habitat environment gives observation(s) {extra} that the "
                             f"policy does not read (it takes {' + '.join(read)} "
                             f"only): remove those sensors from the habitat config (cameras "
                             f"from habitat.simulator.agents.<agent>.sim_sensors, task sensors "
                             f"from habitat.task.lab_sensors), or ask for an RGB camera with "
                             f"sensors=['depth', 'rgb']")
        depth = spaces["depth"]
        if float(np.max(depth.high)) > 1.0 + 1e-6:
            raise ValueError("the habitat depth sensor is not normalised to [0, 1]: set "
                             "habitat.simulator.agents.main_agent.sim_sensors.depth_sensor."
                             "normalize_depth=True")
        n_actions = getattr(habitat_env.action_space, "n", None)
        if n_actions != 4:
            raise ValueError(f"the habitat environment has action space "
                             f"{habitat_env.action_space}; PointNav needs Discrete(4) "
                             f"(stop, move_forward, turn_left, turn_right)")
        shape = tuple(depth.shape)
        if len(shape) != 3 or shape[0] != shape[1] or shape[2] != 1:
            raise ValueError(f"the habitat depth sensor gives {shape}; use a square depth image "
                             f"(width == height)")
        if "rgb" in self.sensors and tuple(spaces["rgb"].shape) != (shape[0], shape[0], 3):
            raise ValueError(f"the habitat RGB sensor gives {tuple(spaces['rgb'].shape)}; use "
                             f"the depth image's size, {shape[0]}x{shape[0]}")
        self.observation_space = observation_space(shape[0], self.sensors)
        self.action_space = gym.spaces.Discrete(4)
        self._elapsed = 0
        self._needs_reset = True
        self._episode_id = None

    @property
    def habitat_env(self):
        """The wrapped habitat gym environment."""
        return self._env

    def _episode(self):
        current = getattr(self._env, "current_episode", None)
        ep = current() if callable(current) else current
        return str(getattr(ep, "episode_id", "")) if ep is not None else ""

    def _start_metrics(self):
        # The task's metrics after reset (RLEnv.habitat_env is habitat's Env); none without them.
        env = getattr(self._env, "habitat_env", None)
        return env.get_metrics() if hasattr(env, "get_metrics") else {}

    def reset(self, *, seed=None, options=None):
        """Start the next habitat episode; returns ``(obs, info)``."""
        super().reset(seed=seed)
        if seed is not None and hasattr(self._env, "seed"):
            self._env.seed(int(seed))
        obs = self._env.reset()
        if isinstance(obs, tuple):  # reset(return_info=True) style
            obs = obs[0]
        self._elapsed = 0
        self._needs_reset = False
        self._episode_id = self._episode()
        metrics = self._start_metrics()
        # (Every measure at the start too, so that a reset names the measures a run will log.)
        info = {**{k: v for k, v in measures(metrics).items() if k not in BASE_MEASURES},
                "distance_to_goal": np.float32(metrics.get("distance_to_goal", np.nan)),
                "success": False, "spl": np.float32(0.0), "episode_id": self._episode_id,
                "elapsed_steps": 0}
        self._add_map(info, metrics)
        return translate_obs(obs, self.sensors), info

    def _add_map(self, info, metrics):
        if self.top_down_map > 0:
            if not isinstance(metrics.get("top_down_map"), dict):
                raise ValueError("top_down_map: the habitat environment reports no top_down_map "
                                 "measure; add it to the task (habitat/task/measurements: "
                                 "top_down_map)")
            info["top_down_map"] = colorize_top_down_map(metrics["top_down_map"],
                                                         self.top_down_map)

    def step(self, action):
        """Apply ``action`` (0 STOP, 1 MOVE_FORWARD, 2 TURN_LEFT, 3 TURN_RIGHT)."""
        if self._needs_reset:
            raise RuntimeError("step() called on an episode that has ended; call reset() first")
        a = np.asarray(action)
        if a.size != 1 or not float(a) == int(a) or not 0 <= int(a) < 4:
            raise ValueError(f"action must be an integer in [0, 4) (0 STOP, 1 MOVE_FORWARD, "
                             f"2 TURN_LEFT, 3 TURN_RIGHT), got {action!r}")
        a = int(a)
        obs, reward, done, hinfo = self._env.step(a)
        self._elapsed += 1
        done = bool(done)
        # Habitat ends an episode on STOP or at its step limit without saying which.
        truncated = done and a != Action.STOP and self._elapsed >= self.max_episode_steps
        terminated = done and not truncated
        self._needs_reset = done
        info = translate_info(hinfo, self._episode_id, self._elapsed)
        self._add_map(info, hinfo)
        return translate_obs(obs, self.sensors), float(reward), terminated, truncated, info

    def close(self):
        """Close the habitat environment."""
        close = getattr(self._env, "close", None)
        if callable(close):
            close()


def translate_obs(obs, sensors=("depth",)):
    """Habitat observation dict -> ``depth`` (H, W, 1) and ``pointgoal_with_gps_compass`` (2,),
    both float32, and with ``"rgb"`` in ``sensors`` ``rgb`` (H, W, 3) uint8."""
    depth = np.asarray(obs["depth"], dtype=np.float32)
    if depth.ndim == 2:
        depth = depth[..., None]
    goal = np.asarray(obs["pointgoal_with_gps_compass"], dtype=np.float32).reshape(2)
    out = {"depth": np.clip(depth, 0.0, 1.0), "pointgoal_with_gps_compass": goal}
    if "rgb" in sensors:
        out["rgb"] = np.asarray(obs["rgb"])[..., :3].astype(np.uint8)
    return out


#: Colours of habitat's top-down map values (habitat.utils.visualizations.maps: 0 not
#: navigable, 1 navigable, 2 border, 4 source, 6 target, 7 shortest path, 8 view point, 9 goal
#: box, 10-255 the agent's path), in the embedded maps' palette (envs.pointnav.topdown).
MAP_COLOURS = np.zeros((256, 3), dtype=np.uint8)
MAP_COLOURS[:] = PATH_RGB
MAP_COLOURS[:10] = (WALL_RGB, FREE_RGB, (120, 120, 120), FREE_RGB, START_RGB, FREE_RGB,
                    GOAL_RGB, (150, 205, 150), GOAL_RGB, GOAL_RGB)


def colorize_top_down_map(metric, size):
    """habitat's ``top_down_map`` measure (``{"map": uint8 values, "agent_map_coord": [(row,
    col)], ...}``) as uint8 ``(H, W, 3)`` of at most ``size`` pixels a side: each block of the
    value map reduced to its largest value (so the path and markers survive the scaling), then
    coloured (:data:`MAP_COLOURS`), the agent a square of ``PATH_RGB``."""
    values = np.asarray(metric["map"], dtype=np.uint8)
    k = max(1, -(-max(values.shape) // int(size)))
    h, w = -(-values.shape[0] // k) * k, -(-values.shape[1] // k) * k
    padded = np.zeros((h, w), dtype=np.uint8)
    padded[:values.shape[0], :values.shape[1]] = values
    image = MAP_COLOURS[padded.reshape(h // k, k, w // k, k).max(axis=(1, 3))]
    coords = metric.get("agent_map_coord") or []
    if len(coords):
        r, c = (int(v) // k for v in coords[0])
        m = max(1, image.shape[0] // 40)
        image[max(r - m, 0):r + m + 1, max(c - m, 0):c + m + 1] = PATH_RGB
    return image


#: The measures every PointNav env reports (the embedded simulator's too); habitat's others are
#: ``extra`` measures, named by :func:`measures`.
BASE_MEASURES = ("distance_to_goal", "success", "spl")


def measures(hinfo):
    """Every scalar measure in a habitat ``info`` as ``{name: float}``, as habitat-baselines'
    ``extract_scalars_from_info`` reads them: a dict measure gives ``<name>.<key>`` (habitat's
    ``collisions`` gives ``collisions.count`` and ``collisions.is_collision``), booleans count as
    0/1, anything else (``top_down_map``'s image, text) is left out."""
    out = {}
    for name, value in hinfo.items():
        if isinstance(value, dict):
            for key, v in measures(value).items():
                out[f"{name}.{key}"] = v
        elif isinstance(value, (bool, int, float, np.number, np.bool_)) or (
                isinstance(value, np.ndarray) and value.size == 1
                and np.issubdtype(value.dtype, np.number)):
            out[name] = float(np.asarray(value).reshape(()))
    return out


def translate_info(hinfo, episode_id, elapsed):
    """Habitat metrics -> this project's info keys: the PointNav ones (:data:`BASE_MEASURES`),
    then every other scalar measure (:func:`measures`) as a float."""
    out = {k: v for k, v in measures(hinfo).items() if k not in BASE_MEASURES}
    out["distance_to_goal"] = np.float32(hinfo.get("distance_to_goal", np.nan))
    out["success"] = bool(hinfo.get("success", 0.0))
    out["spl"] = np.float32(hinfo.get("spl", 0.0))
    out["episode_id"] = episode_id
    out["elapsed_steps"] = elapsed
    return out
