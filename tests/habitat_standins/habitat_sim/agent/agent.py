"""STAND-IN for ``habitat_sim.agent.agent``: an agent is a floor position and a yaw.

Rotations are numpy-quaternion ``np.quaternion(w, x, y, z)`` as in habitat-sim; a rotation set
as a list is read as habitat-lab's ``[x, y, z, w]`` coefficients. The embedded simulator turns
only about the up axis, so a rotation with another component is rejected.
"""

import copy

import numpy as np
import quaternion  # noqa: F401  (numpy-quaternion: registers np.quaternion)

from .._config import ConfigStruct

from standin_placeholders import placeholder_module

__all__ = ["ActionSpec", "ActuationSpec", "Agent", "AgentConfiguration", "AgentState",
           "SixDOFPose", "as_quaternion", "yaw_of"]


class ActuationSpec(ConfigStruct):
    _defaults = {"amount": 0.0, "constraint": None}


class ActionSpec(ConfigStruct):
    def __init__(self, name="", actuation=None):
        super().__init__(name=name, actuation=actuation)


class AgentConfiguration(ConfigStruct):
    _defaults = {"height": 1.5, "radius": 0.1, "sensor_specifications": list,
                 "action_space": dict, "body_type": "cylinder"}


class SixDOFPose(ConfigStruct):
    _defaults = {"position": lambda: np.zeros(3), "rotation": lambda: np.quaternion(1, 0, 0, 0)}


def as_quaternion(rotation):
    """``np.quaternion`` of a quaternion or of ``[x, y, z, w]`` coefficients."""
    if isinstance(rotation, np.quaternion):
        return rotation
    x, y, z, w = (float(v) for v in rotation)
    return np.quaternion(w, x, y, z)


def yaw_of(rotation):
    """Yaw about +y of a rotation about the up axis (ValueError for any other rotation)."""
    q = as_quaternion(rotation)
    if abs(q.x) > 1e-6 or abs(q.z) > 1e-6:
        raise ValueError(f"the habitat-sim stand-in turns agents only about the up axis; got "
                         f"rotation {q}")
    return float(2.0 * np.arctan2(q.y, q.w))


class AgentState:
    def __init__(self, position=None, rotation=None, sensor_states=None):
        self.position = np.zeros(3, dtype=np.float32) if position is None else position
        self.rotation = np.quaternion(1, 0, 0, 0) if rotation is None else rotation
        self.sensor_states = {} if sensor_states is None else sensor_states


class Agent:
    """The agent body: its state is kept by the simulator that owns it."""

    def __init__(self, sim, config):
        self._sim = sim
        self.agent_config = config

    @property
    def state(self):
        return self.get_state()

    def get_state(self):
        x, z = self._sim._pos
        yaw = self._sim._yaw
        return AgentState(position=np.array([x, 0.0, z], dtype=np.float32),
                          rotation=np.quaternion(np.cos(yaw / 2), 0.0, np.sin(yaw / 2), 0.0))

    def set_state(self, state, reset_sensors=True, infer_sensor_states=True, is_initial=False):
        position = np.asarray(state.position, dtype=np.float64)
        self._sim._place(position, yaw_of(state.rotation))

    def __deepcopy__(self, memo):
        return copy.copy(self)


__getattr__ = placeholder_module("habitat_sim.agent.agent")
