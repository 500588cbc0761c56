"""Occupancy grids: the floor plan of a scene, its PNG form, and the masks derived from it.

``blocked[row, col]`` is True where a wall or obstacle stands. Cell ``(row, col)`` covers
``x in [col * res, (col + 1) * res)`` and ``y in [row * res, (row + 1) * res)``; in a PNG the
first pixel row is ``row = 0``, so a Habitat top-down map (rows along ``z``) loads unchanged.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from .spec import AGENT_RADIUS_M

__all__ = ["OccupancyGrid", "load_occupancy_png", "save_occupancy_png", "navigable_mask",
           "largest_component"]


@dataclasses.dataclass(frozen=True)
class OccupancyGrid:
    """A floor plan: ``blocked`` (2-D bool, True = wall/obstacle) at ``resolution`` m per cell.

    The outermost ring of cells is always blocked so that no ray or agent leaves the map.
    """

    blocked: np.ndarray
    resolution: float

    def __post_init__(self):
        blocked = np.array(self.blocked, dtype=bool, copy=True)
        if blocked.ndim != 2 or min(blocked.shape) < 8:
            raise ValueError(f"occupancy grid must be 2-D and at least 8x8 cells, got shape "
                             f"{blocked.shape}")
        if not (0.005 <= float(self.resolution) <= 0.5):
            raise ValueError(f"resolution must be metres per cell in [0.005, 0.5], got "
                             f"{self.resolution!r}")
        blocked[0, :] = blocked[-1, :] = True
        blocked[:, 0] = blocked[:, -1] = True
        blocked.setflags(write=False)
        object.__setattr__(self, "blocked", blocked)
        object.__setattr__(self, "resolution", float(self.resolution))

    @property
    def shape(self):
        """``(rows, cols)`` of the grid."""
        return self.blocked.shape

    @property
    def size_m(self):
        """``(width, height)`` of the map in metres (x extent, y extent)."""
        return (self.blocked.shape[1] * self.resolution, self.blocked.shape[0] * self.resolution)

    def cell_of(self, xy):
        """Integer ``(row, col)`` cell(s) containing position(s) ``xy`` (``(..., 2)`` metres)."""
        xy = np.asarray(xy, dtype=np.float64)
        col = np.floor(xy[..., 0] / self.resolution).astype(np.int64)
        row = np.floor(xy[..., 1] / self.resolution).astype(np.int64)
        return row, col

    def cell_center(self, row, col):
        """Centre position(s) ``(..., 2)`` of cell(s) ``(row, col)``."""
        return np.stack([(np.asarray(col) + 0.5) * self.resolution,
                         (np.asarray(row) + 0.5) * self.resolution], axis=-1)


def load_occupancy_png(path, *, resolution, threshold=128):
    """Load a floor plan from a PNG, one pixel per cell: dark pixels (< ``threshold``) are blocked.

    Transparent pixels count as blocked. ``resolution`` is the metres per pixel.
    """
    from PIL import Image

    if not os.path.isfile(path):
        raise FileNotFoundError(f"occupancy image {path!r} does not exist")
    try:
        with Image.open(path) as img:
            img.load()
            rgba = np.asarray(img.convert("LA"))
    except Exception as exc:  # PIL raises several unrelated types for bad files
        raise ValueError(f"cannot read occupancy image {path!r} as a PNG: {exc}") from exc
    blocked = (rgba[..., 0] < threshold) | (rgba[..., 1] < 128)
    return OccupancyGrid(blocked, resolution)


def save_occupancy_png(grid, path):
    """Write ``grid`` as a PNG (black = blocked, white = free); the resolution is not stored."""
    from PIL import Image

    Image.fromarray(np.where(grid.blocked, 0, 255).astype(np.uint8)).save(path)  # 8-bit grey


def _shift_or(mask, offsets):
    """OR of ``mask`` shifted by each ``(drow, dcol)`` in ``offsets`` (out of range = False)."""
    rows, cols = mask.shape
    out = np.zeros_like(mask)
    for dr, dc in offsets:
        src = mask[max(0, -dr):rows - max(0, dr), max(0, -dc):cols - max(0, dc)]
        out[max(0, dr):rows - max(0, -dr), max(0, dc):cols - max(0, -dc)] |= src
    return out


def navigable_mask(grid, *, radius=AGENT_RADIUS_M):
    """Cells where the agent's centre may stand: its disc misses every blocked cell.

    Conservative per cell: a cell is navigable only if a disc of ``radius`` centred anywhere in
    it stays clear, i.e. the square-to-square distance to every blocked cell is at least
    ``radius``. So a position in a navigable cell never overlaps a wall or obstacle.
    """
    reach = int(np.ceil(radius / grid.resolution)) + 1
    offsets = []
    for dr in range(-reach, reach + 1):
        for dc in range(-reach, reach + 1):
            gap = np.hypot(max(abs(dr) - 1, 0), max(abs(dc) - 1, 0)) * grid.resolution
            if gap < radius - 1e-9:
                offsets.append((dr, dc))
    return ~_shift_or(grid.blocked, offsets)


def _flood(mask_flat, cols, seed):
    """Flat indices of the 4-connected component of ``seed`` (the mask border must be False)."""
    seen = np.zeros(mask_flat.size, dtype=bool)
    seen[seed] = True
    frontier = np.array([seed], dtype=np.int64)
    steps = np.array([1, -1, cols, -cols], dtype=np.int64)
    fresh = np.zeros(mask_flat.size, dtype=bool)
    while frontier.size:
        nb = (frontier[:, None] + steps[None, :]).ravel()
        nb = nb[mask_flat[nb] & ~seen[nb]]
        seen[nb] = True
        fresh[nb] = True  # duplicates in nb collapse here
        frontier = np.flatnonzero(fresh)
        fresh[frontier] = False
    return seen


def largest_component(mask):
    """The largest 4-connected component of ``mask`` (a bool array of the same shape).

    Cells on the array border are ignored (a grid's border is always blocked).
    """
    inner = np.zeros_like(mask)
    inner[1:-1, 1:-1] = mask[1:-1, 1:-1]
    flat = inner.ravel()
    left = flat.copy()
    best = np.zeros_like(flat)
    best_size = 0
    while int(left.sum()) > best_size:
        comp = _flood(flat, mask.shape[1], int(np.argmax(left)))
        size = int(comp.sum())
        if size > best_size:
            best, best_size = comp, size
        left &= ~comp
    return best.reshape(mask.shape)
