"""STAND-IN for ``habitat_sim.simulator``: the Simulator, backed by the embedded PointNav simulator.

It emulates depth and colour cameras (pinhole, square, 90 deg field of view at the embedded
camera height; colour: the embedded camera's flat shade per wall, RGBA uint8), the actions ``stop``/``move_forward``/``turn_left``/``turn_right`` with the amounts
of the agent's action space, and the path finder on scenes read from exported GLB files.
Anything else (semantic sensors, physics, other agents) raises, so a config that
needs it fails loudly instead of passing untested.
"""

import os
import weakref

import numpy as np

from envs.pointnav.mesh import grid_from_glb
from envs.pointnav.motion import move
from envs.pointnav.raycast import DepthCamera
from envs.pointnav.scenes import scene_from_grid
from envs.pointnav.spec import (AGENT_RADIUS_M, CAMERA_HEIGHT_M, HFOV_DEG, MAX_DEPTH_M,
                                forward_vector, wrap_angle)

from ._config import ConfigStruct
from .agent import Agent, AgentConfiguration
from .nav import PathFinder
from .sensor import SensorSubType, SensorType

from standin_placeholders import placeholder_module

__all__ = ["Configuration", "Simulator", "SimulatorConfiguration"]

_open = None  # a weak reference to this process's open Simulator


class SimulatorConfiguration(ConfigStruct):
    _defaults = {"scene_id": "", "scene_dataset_config_file": "default", "default_agent_id": 0,
                 "gpu_device_id": -1, "random_seed": 100, "allow_sliding": True,
                 "enable_physics": False, "create_renderer": True, "navmesh_settings": None}


class Configuration:
    def __init__(self, sim_cfg, agents=None):
        self.sim_cfg = sim_cfg
        self.agents = [AgentConfiguration()] if agents is None else list(agents)
        self.enable_batch_renderer = False


class _TemplateManager:
    def load_configs(self, path):
        raise NotImplementedError("object templates are not emulated by the habitat-sim "
                                  "stand-in")


class Simulator:
    """One agent in one exported scene (see the module docs); one open per process."""

    def __init__(self, config):
        global _open
        other = _open() if _open is not None else None
        if other is not None and not other._closed:
            # habitat-sim 0.3.3 crashes here (segmentation fault, or "GL::Context::current():
            # no current context" at exit): it holds one GL context per process.
            raise RuntimeError("habitat-sim stand-in: a second Simulator in this process while "
                               "one is open; habitat-sim runs one simulator (GL context) per "
                               "process: close the first or build each in its own process")
        self._closed = False
        self._scene_path = None
        self._pos, self._yaw = np.zeros(2), 0.0
        self._load(config)  # habitat-lab's HabitatSim overrides reconfigure()
        _open = weakref.ref(self)

    # ---- configuration -----------------------------------------------------------------
    def reconfigure(self, config):
        self._load(config)

    def _load(self, config):
        self.config = config
        path = str(config.sim_cfg.scene_id)
        if path != self._scene_path:
            if not (path.endswith(".glb") and os.path.isfile(path)):
                raise FileNotFoundError(f"habitat-sim stand-in: scene {path!r} is not a GLB "
                                        f"file (it loads scenes written by envs.pointnav.export)")
            self._scene = scene_from_grid(grid_from_glb(path), scene_id=path)
            self._scene_path = path
            self.pathfinder = PathFinder(self._scene)
        agent_cfg = config.agents[config.sim_cfg.default_agent_id or 0]
        if abs(float(agent_cfg.radius) - AGENT_RADIUS_M) > 1e-9:
            raise ValueError(f"habitat-sim stand-in: agent radius {agent_cfg.radius} m; the "
                             f"embedded navigable area is computed for {AGENT_RADIUS_M} m")
        self._actions = {key: (spec.name, None if spec.actuation is None
                               else float(spec.actuation.amount))
                         for key, spec in agent_cfg.action_space.items()}
        self._cameras = {spec.uuid: (spec.sensor_type, self._camera(spec))
                         for spec in agent_cfg.sensor_specifications}
        self.agents = [Agent(self, agent_cfg)]
        self._pos = self.pathfinder.get_random_navigable_point()[[0, 2]].astype(np.float64)
        self._yaw = 0.0

    @staticmethod
    def _camera(spec):
        if spec.sensor_type not in (SensorType.DEPTH, SensorType.COLOR):
            raise NotImplementedError(f"habitat-sim stand-in: sensor {spec.uuid!r} of type "
                                      f"{SensorType(spec.sensor_type).name}; only depth and "
                                      f"colour (the embedded flat shades) are emulated")
        h, w = (int(v) for v in spec.resolution)
        if (spec.sensor_subtype != SensorSubType.PINHOLE or h != w
                or abs(float(spec.hfov) - HFOV_DEG) > 1e-9
                or abs(float(spec.position[1]) - CAMERA_HEIGHT_M) > 1e-9
                or any(abs(float(v)) > 1e-9 for v in spec.orientation)):
            raise NotImplementedError(
                f"habitat-sim stand-in: camera {spec.uuid!r} must be a square pinhole "
                f"camera, {HFOV_DEG} deg hfov, level, at {CAMERA_HEIGHT_M} m (got {h}x{w}, "
                f"hfov {spec.hfov}, position {list(spec.position)})")
        return DepthCamera(size=h)

    # ---- agent state -------------------------------------------------------------------
    def _place(self, position, yaw):
        if abs(position[1]) > 0.5:
            raise ValueError(f"habitat-sim stand-in: position {position.tolist()} is not on the "
                             f"floor (y = 0)")
        self._pos = np.array([position[0], position[2]], dtype=np.float64)
        self._yaw = float(wrap_angle(yaw))

    def get_agent(self, agent_id=0):
        return self.agents[agent_id]

    def initialize_agent(self, agent_id, initial_state=None):
        if initial_state is not None:
            self.agents[agent_id].set_state(initial_state)
        return self.agents[agent_id]

    # ---- stepping and sensing ----------------------------------------------------------
    def seed(self, new_seed):
        self.pathfinder.seed(new_seed)

    def reset(self, agent_ids=None):
        return self.get_sensor_observations()

    def step(self, action, dt=1.0 / 60.0):
        name, amount = self._actions[action] if action in self._actions else (action, None)
        collided = False
        if name == "move_forward":
            s = self._scene
            disp = forward_vector(self._yaw) * amount
            new, hit = move(s.nav_flat, np.zeros(1, np.int64), np.array([s.cols]),
                            self._pos[None], disp[None], resolution=s.resolution)
            self._pos, collided = new[0], bool(hit[0])
        elif name in ("turn_left", "turn_right"):
            sign = 1.0 if name == "turn_left" else -1.0
            self._yaw = float(wrap_angle(self._yaw + sign * np.deg2rad(amount)))
        elif name != "stop":
            raise NotImplementedError(f"habitat-sim stand-in: action {name!r} is not emulated")
        obs = self.get_sensor_observations()
        obs["collided"] = collided
        return obs

    def get_sensor_observations(self, agent_ids=0):
        s = self._scene
        out = {}
        for uuid, (kind, cam) in self._cameras.items():
            normalised = cam.render(s.table, np.zeros(1, np.int64), np.array([s.cols]),
                                    np.array([s.cells]), self._pos[None], np.array([self._yaw]),
                                    resolution=s.resolution, rgb=kind == SensorType.COLOR)
            if kind == SensorType.COLOR:  # RGBA uint8, as habitat-sim's colour sensor
                rgb = normalised[1][0]
                out[uuid] = np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], -1)
                continue
            out[uuid] = normalised[0, :, :, 0] * np.float32(MAX_DEPTH_M)  # metres, like habitat-sim
        return out

    # ---- the rest of the API that habitat-lab touches for PointNav -----------------------
    def step_physics(self, dt=1.0 / 60.0):
        """A static scene without physics objects: advancing the world changes nothing."""

    @property
    def semantic_scene(self):
        return None

    def get_object_template_manager(self):
        return _TemplateManager()

    def close(self, destroy=True):
        self._closed = True

    def __del__(self):
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__getattr__ = placeholder_module("habitat_sim.simulator")
