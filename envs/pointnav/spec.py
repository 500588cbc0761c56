"""The PointGoal navigation task specification (Habitat's PointNav), shared by every module.

Coordinates follow Habitat's ground plane: a position is ``(x, z)`` in metres, stored as a 2-D
``(x, y)`` pair where ``y`` is Habitat's ``z`` axis. ``agent_heading`` is Habitat's yaw: the
rotation about the up axis in radians; at heading 0 the agent looks along ``-y`` and TURN_LEFT
increases the heading (counter-clockwise seen from above, as in Habitat).
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = [
    "Action", "NUM_ACTIONS", "FORWARD_STEP_M", "TURN_ANGLE_RAD", "AGENT_RADIUS_M",
    "SUCCESS_DISTANCE_M", "SLACK_REWARD", "SUCCESS_REWARD", "MAX_EPISODE_STEPS", "HFOV_DEG",
    "CAMERA_HEIGHT_M", "CEILING_HEIGHT_M", "MAX_DEPTH_M", "forward_vector", "left_vector",
    "wrap_angle", "step_reward", "spl", "pointgoal_polar",
]


class Action(enum.IntEnum):
    """The four PointNav actions, in Habitat's order."""

    STOP = 0
    MOVE_FORWARD = 1
    TURN_LEFT = 2
    TURN_RIGHT = 3


NUM_ACTIONS = 4
FORWARD_STEP_M = 0.25
TURN_ANGLE_RAD = float(np.deg2rad(10.0))
AGENT_RADIUS_M = 0.1
SUCCESS_DISTANCE_M = 0.2
SLACK_REWARD = -0.01
SUCCESS_REWARD = 2.5
MAX_EPISODE_STEPS = 500
HFOV_DEG = 90.0
CAMERA_HEIGHT_M = 1.25
# Habitat scenes have ceilings around 2.5 m; with the camera at 1.25 m it sits mid-height.
CEILING_HEIGHT_M = 2.5
MAX_DEPTH_M = 10.0


def forward_vector(heading):
    """Unit vector(s) ``(x, y)`` the agent looks along at ``heading`` (Habitat yaw, radians)."""
    heading = np.asarray(heading, dtype=np.float64)
    return np.stack([-np.sin(heading), -np.cos(heading)], axis=-1)


def left_vector(heading):
    """Unit vector(s) ``(x, y)`` pointing to the agent's left at ``heading``."""
    heading = np.asarray(heading, dtype=np.float64)
    return np.stack([-np.cos(heading), np.sin(heading)], axis=-1)


def wrap_angle(angle):
    """Wrap angle(s) to ``[-pi, pi)``."""
    return (np.asarray(angle, dtype=np.float64) + np.pi) % (2.0 * np.pi) - np.pi


def step_reward(prev_distance, distance, success):
    """Habitat's PointNav reward: slack + decrease in geodesic distance + bonus on success."""
    return (SLACK_REWARD + (np.asarray(prev_distance, dtype=np.float64) - distance)
            + SUCCESS_REWARD * np.asarray(success, dtype=np.float64))


def spl(success, shortest_path, path_length):
    """Success weighted by path length: ``success * l / max(l, p)`` (0 where it is undefined)."""
    success = np.asarray(success, dtype=np.float64)
    shortest_path = np.asarray(shortest_path, dtype=np.float64)
    denom = np.maximum(shortest_path, np.asarray(path_length, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(denom > 0, success * shortest_path / np.where(denom > 0, denom, 1.0),
                       success)
    return out


def pointgoal_polar(position, heading, goal):
    """``pointgoal_with_gps_compass``: (euclidean distance, angle) of ``goal`` in the agent frame.

    The angle is positive when the goal is to the agent's left, zero straight ahead (Habitat's
    convention). Works on single positions ``(2,)`` or batches ``(N, 2)``.
    """
    delta = np.asarray(goal, dtype=np.float64) - np.asarray(position, dtype=np.float64)
    heading = np.asarray(heading, dtype=np.float64)
    s, c = np.sin(heading), np.cos(heading)
    # Components along forward (-sin h, -cos h) and left (-cos h, sin h).
    ahead = -delta[..., 0] * s - delta[..., 1] * c
    left = -delta[..., 0] * c + delta[..., 1] * s
    return np.stack([np.hypot(delta[..., 0], delta[..., 1]), np.arctan2(left, ahead)], axis=-1)
