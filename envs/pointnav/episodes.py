"""PointNav episodes: sampling them per Habitat's rules, and the Habitat episode file format.

A file is gzipped JSON ``{"episodes": [{episode_id, scene_id, start_position, start_rotation,
goals: [{position, radius}], info: {geodesic_distance}}]}``. Positions are Habitat's
``[x, y_up, z]``; the simulator's plane position is ``(x, z)`` and the floor is at ``y_up = 0``.
``start_rotation`` is the quaternion ``[x, y, z, w]`` of the start yaw about the up axis.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os

import numpy as np

from .spec import SUCCESS_DISTANCE_M

__all__ = ["Episode", "sample_episode", "save_episodes", "load_episodes", "yaw_to_quaternion",
           "quaternion_to_yaw", "EpisodeFileError"]


class EpisodeFileError(ValueError):
    """An episode file that cannot be read or does not follow the Habitat PointNav format."""


@dataclasses.dataclass(frozen=True)
class Episode:
    """One PointNav episode in simulator coordinates (metres, yaw in radians)."""

    episode_id: str
    scene_id: str
    start_position: tuple     # (x, z)
    start_heading: float      # yaw about the up axis
    goal_position: tuple      # (x, z)
    geodesic_distance: float
    goal_radius: float = SUCCESS_DISTANCE_M

    def to_habitat(self):
        """This episode as a Habitat episode dict."""
        sx, sz = self.start_position
        gx, gz = self.goal_position
        return {
            "episode_id": self.episode_id,
            "scene_id": self.scene_id,
            "start_position": [float(sx), 0.0, float(sz)],
            "start_rotation": [float(v) for v in yaw_to_quaternion(self.start_heading)],
            "goals": [{"position": [float(gx), 0.0, float(gz)], "radius": self.goal_radius}],
            "info": {"geodesic_distance": float(self.geodesic_distance)},
        }

    @classmethod
    def from_habitat(cls, entry):
        """Parse a Habitat episode dict (raises :class:`EpisodeFileError` naming the problem)."""
        try:
            start = entry["start_position"]
            goal = entry["goals"][0]["position"]
            yaw = quaternion_to_yaw(entry["start_rotation"])
            geo = entry.get("info", {}).get("geodesic_distance", float("nan"))
            radius = entry["goals"][0].get("radius") or SUCCESS_DISTANCE_M
            return cls(episode_id=str(entry["episode_id"]), scene_id=str(entry["scene_id"]),
                       start_position=(float(start[0]), float(start[2])), start_heading=yaw,
                       goal_position=(float(goal[0]), float(goal[2])),
                       geodesic_distance=float(geo), goal_radius=float(radius))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EpisodeFileError(
                f"episode {entry.get('episode_id', '?') if isinstance(entry, dict) else entry!r}"
                f" is not a Habitat PointNav episode ({type(exc).__name__}: {exc}); each needs "
                f"episode_id, scene_id, start_position [x, y, z], start_rotation [x, y, z, w] "
                f"and goals [{{position: [x, y, z]}}]") from exc


def yaw_to_quaternion(yaw):
    """Quaternion ``[x, y, z, w]`` of a rotation by ``yaw`` about the up (y) axis."""
    return np.array([0.0, np.sin(yaw / 2.0), 0.0, np.cos(yaw / 2.0)])


def quaternion_to_yaw(quat):
    """Yaw about the up axis of quaternion ``[x, y, z, w]`` (its other components ignored)."""
    x, y, z, w = (float(v) for v in quat)
    return float(np.arctan2(2.0 * (w * y + x * z), 1.0 - 2.0 * (y * y + x * x)))


def sample_episode(scene, rng, *, episode_id, geodesic_range, min_ratio):
    """Draw an episode in ``scene``: a pool goal, then a start whose geodesic distance is in
    ``geodesic_range`` and whose geodesic/euclidean ratio is at least ``min_ratio``.

    Goals without any valid start are skipped; if no goal has one, the range is relaxed to the
    reachable distances of the scene (maps too small for the range), keeping the ratio rule
    when some start satisfies it.
    """
    order = rng.permutation(len(scene.goals))
    for g in order:
        cells = scene.start_candidates(int(g), geodesic_range, min_ratio)
        if cells.size:
            break
    else:
        g = int(order[0])
        field = scene.fields[g].ravel()
        cells = np.flatnonzero(scene.nav_flat & np.isfinite(field) & (field > 0.5))
        if not cells.size:
            cells = np.flatnonzero(scene.nav_flat & np.isfinite(field))
    cell = int(cells[rng.integers(len(cells))])
    start = ((cell % scene.cols + 0.5) * scene.resolution,
             (cell // scene.cols + 0.5) * scene.resolution)
    heading = float(rng.uniform(-np.pi, np.pi))
    return Episode(episode_id=str(episode_id), scene_id=scene.scene_id, start_position=start,
                   start_heading=heading, goal_position=tuple(map(float, scene.goals[g])),
                   geodesic_distance=float(scene.fields[g].ravel()[cell]))


def save_episodes(path, episodes):
    """Write ``episodes`` to ``path`` as a Habitat episode file (gzipped JSON)."""
    data = {"episodes": [ep.to_habitat() for ep in episodes]}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(data, fh)


def load_episodes(path):
    """Read a Habitat PointNav episode file (``.json.gz`` or plain ``.json``) into Episodes."""
    if not os.path.isfile(path):
        raise EpisodeFileError(f"episode file {path!r} does not exist")
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EpisodeFileError(f"cannot read episode file {path!r}: {exc}; expected gzipped "
                               f"JSON in the Habitat format") from exc
    if not isinstance(data, dict) or not isinstance(data.get("episodes"), list):
        raise EpisodeFileError(f"episode file {path!r} has no 'episodes' list (Habitat format:"
                               f" {{\"episodes\": [...]}})")
    if not data["episodes"]:
        raise EpisodeFileError(f"episode file {path!r} holds no episodes")
    try:
        return [Episode.from_habitat(e) for e in data["episodes"]]
    except EpisodeFileError as exc:
        raise EpisodeFileError(f"{path}: {exc}") from exc
