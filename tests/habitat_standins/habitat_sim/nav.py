"""STAND-IN for ``habitat_sim.nav``: the path finder's distance queries on the embedded scene.

``find_path`` answers with the embedded simulator's geodesic distance (its distance field to
the end point); ``points`` holds only the start and the nearest end, not the path's corners (a
top-down map's shortest path is then one straight segment). ``get_bounds`` and
``get_topdown_view`` give the scene's grid for habitat's ``TopDownMap`` measure.
"""

import numpy as np

from ._config import ConfigStruct

from standin_placeholders import placeholder_module

__all__ = ["NavMeshSettings", "PathFinder", "ShortestPath", "MultiGoalShortestPath"]


class NavMeshSettings(ConfigStruct):
    def set_defaults(self):
        self.agent_radius, self.agent_height, self.agent_max_climb = 0.1, 1.5, 0.2
        self.agent_max_slope, self.include_static_objects = 45.0, False


class ShortestPath:
    def __init__(self):
        self.requested_start = np.zeros(3, dtype=np.float32)
        self.requested_end = np.zeros(3, dtype=np.float32)
        self.points = []
        self.geodesic_distance = float("inf")


class MultiGoalShortestPath:
    def __init__(self):
        self.requested_start = np.zeros(3, dtype=np.float32)
        self.requested_ends = np.zeros((0, 3), dtype=np.float32)
        self.points = []
        self.geodesic_distance = float("inf")
        self.closest_end_point_index = -1


def _plane(point):
    p = np.asarray(point, dtype=np.float64).reshape(3)
    return float(p[0]), float(p[2])


class PathFinder:
    """Distances and navigability on the scene an embedded :class:`~envs.pointnav.scenes.Scene`
    holds (the agent radius is the embedded simulator's 0.1 m)."""

    def __init__(self, scene):
        self._scene = scene
        self._rng = np.random.default_rng(0)

    @property
    def is_loaded(self):
        return True

    def seed(self, new_seed):
        self._rng = np.random.default_rng(int(new_seed))

    def find_path(self, path):
        if isinstance(path, MultiGoalShortestPath):
            ends = np.asarray(path.requested_ends, dtype=np.float64).reshape(-1, 3)
        else:
            ends = np.asarray(path.requested_end, dtype=np.float64).reshape(1, 3)
        start = _plane(path.requested_start)
        dists = [self._scene.geodesic_distance(start, _plane(e)) for e in ends]
        best = int(np.argmin(dists)) if dists else -1
        path.geodesic_distance = float(dists[best]) if dists else float("inf")
        found = bool(np.isfinite(path.geodesic_distance))
        path.points = [np.asarray(path.requested_start, np.float32),
                       ends[best].astype(np.float32)] if found else []
        if isinstance(path, MultiGoalShortestPath):
            path.closest_end_point_index = best if found else -1
        return found

    def is_navigable(self, point, max_y_delta=0.5):
        p = np.asarray(point, dtype=np.float64).reshape(3)
        return abs(p[1]) <= max_y_delta and self._scene.is_navigable((p[0], p[2]))

    def get_random_navigable_point(self, max_tries=10, island_index=-1):
        cells = np.flatnonzero(self._scene.nav_flat)
        cell = int(cells[self._rng.integers(len(cells))])
        res, cols = self._scene.resolution, self._scene.cols
        return np.array([(cell % cols + 0.5) * res, 0.0, (cell // cols + 0.5) * res],
                        dtype=np.float32)

    # What habitat-lab's TopDownMap measure (habitat.utils.visualizations.maps) asks. A real
    # PathFinder answers from its navmesh: the bounds of the navigable surface, and a slice of
    # the navmesh at `height` rasterised at `meters_per_pixel`. Here: the scene's whole grid
    # (floor at y = 0, the agent's height above it) and its navigable cells sampled at pixel
    # centres, so the map shows the walls the embedded simulator collides with.
    def get_bounds(self):
        s = self._scene
        return (np.zeros(3, dtype=np.float32),
                np.array([s.cols * s.resolution, 1.5, s.rows * s.resolution], dtype=np.float32))

    def get_topdown_view(self, meters_per_pixel, height):
        s, mpp = self._scene, float(meters_per_pixel)
        if mpp <= 0:
            raise ValueError(f"meters_per_pixel must be positive, got {meters_per_pixel}")
        rows = ((np.arange(int(np.ceil(s.rows * s.resolution / mpp))) + 0.5) * mpp
                / s.resolution).astype(np.int64)
        cols = ((np.arange(int(np.ceil(s.cols * s.resolution / mpp))) + 0.5) * mpp
                / s.resolution).astype(np.int64)
        nav = s.nav_flat.reshape(s.rows, s.cols)
        return nav[np.minimum(rows, s.rows - 1)][:, np.minimum(cols, s.cols - 1)].astype(bool)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise NotImplementedError(f"PathFinder.{name} is not emulated by the habitat-sim "
                                  f"stand-in (PointNav needs only find_path and is_navigable, "
                                  f"its top-down map get_bounds and get_topdown_view)")


__getattr__ = placeholder_module("habitat_sim.nav")
