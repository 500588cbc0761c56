"""STAND-IN for habitat-sim 0.3.3 (compiled, conda-only; not on PyPI), for the Habitat contract tests.

It emulates the part of habitat-sim's Python API that habitat-lab's ``HabitatSim`` ("Sim-v0")
and the PointNav task call, backed by this project's embedded simulator (``envs.pointnav``):
a scene is a GLB written by ``python -m envs.pointnav.export``, read back into its occupancy
grid; depth images come from the embedded ray caster, motion from its collision-and-sliding
model, geodesic distances from its distance fields. Only depth and colour sensors (the colour
one gives the embedded camera's flat shades, RGBA), the four PointNav
actions and the path finder's distance queries are emulated; every other name resolves to a
placeholder that raises when used. Like habitat-sim 0.3.3 (one GL context per process) it
runs one open Simulator per process: a second one raises RuntimeError. Nothing here is
habitat-sim's code.
"""

from standin_placeholders import placeholder_module

from . import agent, errors, logging, nav, physics, sensor, sim, simulator, utils  # noqa: F401
from .agent import ActionSpec, ActuationSpec, AgentConfiguration, AgentState
from .nav import MultiGoalShortestPath, PathFinder, ShortestPath
from .sensor import (CameraSensorSpec, EquirectangularSensorSpec, FisheyeSensorDoubleSphereSpec,
                     FisheyeSensorModelType, SensorSpec, SensorSubType, SensorType)
from .simulator import Configuration, Simulator, SimulatorConfiguration

__version__ = "0.3.3"
__all__ = ["ActionSpec", "ActuationSpec", "AgentConfiguration", "AgentState", "CameraSensorSpec",
           "Configuration", "EquirectangularSensorSpec", "FisheyeSensorDoubleSphereSpec",
           "FisheyeSensorModelType", "MultiGoalShortestPath", "PathFinder", "SensorSpec",
           "SensorSubType", "SensorType", "ShortestPath", "Simulator", "SimulatorConfiguration"]

__getattr__ = placeholder_module("habitat_sim")
