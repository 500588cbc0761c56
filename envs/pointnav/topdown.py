"""Top-down maps of episodes: the occupancy grid with the path an agent walked, its start, where
it ended and its goal, as an RGB image (what habitat's ``top_down_map`` shows for PointNav)."""

from __future__ import annotations

import numpy as np

__all__ = ["top_down_map", "FREE_RGB", "WALL_RGB", "PATH_RGB", "START_RGB", "GOAL_RGB"]

FREE_RGB = (230, 230, 230)
WALL_RGB = (40, 40, 40)
PATH_RGB = (30, 60, 220)
START_RGB = (230, 140, 0)
GOAL_RGB = (0, 170, 0)


def _cell(xy, resolution, shape):
    """The (row, col) of position ``xy`` (metres; x along columns, y along rows), clipped."""
    r = min(max(int(xy[1] / resolution), 0), shape[0] - 1)
    c = min(max(int(xy[0] / resolution), 0), shape[1] - 1)
    return r, c


def top_down_map(blocked, resolution, path, goal, *, marker=2):
    """uint8 ``(H, W, 3)``: ``blocked`` (the scene's occupancy grid, ``resolution`` metres per
    cell) with the agent's ``path`` (positions ``(x, y)`` in metres, in order) drawn as a line
    of cells and squares of side ``2 * marker + 1`` cells at its first position (START_RGB), at
    its last (PATH_RGB: where the agent is) and at ``goal`` (GOAL_RGB), drawn in that order."""
    blocked = np.asarray(blocked, dtype=bool)
    img = np.where(blocked[..., None], np.uint8(WALL_RGB), np.uint8(FREE_RGB)).astype(np.uint8)
    path = np.asarray(path, dtype=np.float64).reshape(-1, 2)
    for a, b in zip(path[:-1], path[1:]):  # every cell the segment passes (a cell per half cell)
        steps = max(1, int(np.ceil(2 * np.abs(b - a).max() / resolution)))
        for t in np.linspace(0.0, 1.0, steps + 1):
            img[_cell(a + t * (b - a), resolution, blocked.shape)] = PATH_RGB
    ends = ((path[0], START_RGB), (path[-1], PATH_RGB)) if len(path) else ()
    for xy, colour in (*ends, (goal, GOAL_RGB)):
        r, c = _cell(xy, resolution, blocked.shape)
        img[max(r - marker, 0):r + marker + 1, max(c - marker, 0):c + marker + 1] = colour
    return img
