"""Batched 2.5-D depth rendering: one ray per image column, cast through the occupancy grid.

Walls and obstacles span floor to ceiling, so a column's depth is the wall hit by its ray,
and rows above/below the wall show the ceiling/floor planes. All rays of all environments are
cast together; each ray jumps through the largest free square ahead of it in its direction's
quadrant (so it can never jump over a wall) and crosses cells one boundary at a time only
next to walls; the hit is the exact time the ray enters the blocked cell.
"""

from __future__ import annotations

import numpy as np

from .spec import CAMERA_HEIGHT_M, CEILING_HEIGHT_M, HFOV_DEG, MAX_DEPTH_M

__all__ = ["skip_table", "cast_rays", "DepthCamera", "WALL_COLOURS", "FLOOR_RGB", "CEILING_RGB",
           "FAR_RGB"]

#: The RGB camera's flat shades: a wall takes ``WALL_COLOURS[(5 * k + 3 * face) % 8]``, ``face``
#: 0 for a wall in the plane x = k and 1 for one in y = k (grid cells; drawn at 80%), so each
#: wall plane has one shade; floor and ceiling are one grey each, and a column whose wall lies
#: beyond the depth range (10 m) shows FAR_RGB. Enough for a policy to tell walls apart.
WALL_COLOURS = np.array([[196, 78, 82], [85, 168, 104], [76, 114, 176], [221, 132, 82],
                         [129, 114, 179], [204, 185, 116], [100, 181, 205], [147, 120, 96]],
                        dtype=np.uint8)
FLOOR_RGB = np.array([110, 110, 110], dtype=np.uint8)
CEILING_RGB = np.array([200, 200, 200], dtype=np.uint8)
FAR_RGB = np.array([0, 0, 0], dtype=np.uint8)
# The camera's palette: the shades, at 80% (a wall along y), then far, ceiling and floor.
_PALETTE = np.concatenate([WALL_COLOURS, (WALL_COLOURS * 0.8).astype(np.uint8),
                           [FAR_RGB, CEILING_RGB, FLOOR_RGB]]).astype(np.uint8)
_FAR, _CEILING, _FLOOR = 2 * len(WALL_COLOURS), 2 * len(WALL_COLOURS) + 1, 2 * len(WALL_COLOURS) + 2

_EPS = 1e-5  # cells: pushes a boundary step just inside the next cell


def _free_squares(blocked):
    """Side of the largest free square whose corner cell is each cell, growing to +row, +col.

    Row by row from the bottom, ``q[r, c] = 1 + min(q[r, c+1], q[r+1, c], q[r+1, c+1])``; the
    recurrence along a row is a reversed running minimum, so each row is a few vector calls.
    """
    rows, cols = blocked.shape
    k = np.arange(cols, dtype=np.int64)
    q = np.zeros((rows, cols), dtype=np.int64)
    below = np.zeros(cols, dtype=np.int64)
    for r in range(rows - 1, -1, -1):
        a = np.minimum(below, np.append(below[1:], 0))
        b = np.where(blocked[r], k, a + k + 1)
        row = np.minimum.accumulate(b[::-1])[::-1] - k
        row[blocked[r]] = 0
        q[r] = row
        below = row
    return q


def skip_table(blocked):
    """Ray-caster tables for one grid: flat float32 ``(4 * cells,)``, one table per quadrant.

    Quadrant ``q = 2 * (dx < 0) + (dy < 0)`` of a ray's direction selects the table. A cell
    holds -1 if blocked, else the L-infinity distance in cells a ray heading into that
    quadrant may jump from anywhere in the cell without entering a blocked cell.
    """
    tables = []
    for flip_x in (False, True):
        for flip_y in (False, True):
            grid = blocked[::-1 if flip_y else 1, ::-1 if flip_x else 1]
            q = _free_squares(grid)[::-1 if flip_y else 1, ::-1 if flip_x else 1]
            tables.append((q - 1).astype(np.float32))
    return np.stack(tables).ravel()


def cast_rays(table, offset, cols, cells, origins, directions, t_max):
    """Distance along each ray to the first blocked cell, capped at ``t_max``, in cell units.

    ``table``: flat skip tables of several grids (see :func:`skip_table`); ray ``i`` reads the
    grid whose tables start at ``offset[i]``, with ``cols[i]`` columns and ``cells[i]`` cells.
    ``origins`` ``(R, 2)``: ``(x, y)`` in cells (metres / resolution), in free cells;
    ``directions`` ``(R, 2)``: unit vectors. Returns ``(R,)`` float64 distances in cells.
    """
    origins = np.asarray(origins, dtype=np.float64)
    directions = np.asarray(directions, dtype=np.float64)
    dx = directions[:, 0]
    dy = directions[:, 1]
    # Tiny components become +-1e-12 so that boundary distances stay finite.
    dx = np.where(np.abs(dx) < 1e-12, np.copysign(1e-12, dx), dx)
    dy = np.where(np.abs(dy) < 1e-12, np.copysign(1e-12, dy), dy)
    # Per-ray state as rows of one array, so dropping finished rays is a single gather.
    state = np.empty((14, len(dx)))
    state[0] = 0.0                                           # t
    state[1], state[2], state[3], state[4] = origins[:, 0], origins[:, 1], dx, dy
    np.divide(1.0, dx, out=state[5])
    np.divide(1.0, dy, out=state[6])
    np.divide(1.0, np.maximum(np.abs(dx), np.abs(dy)), out=state[7])  # L-inf per unit length
    # 8-9: the next cell boundary ahead is at cell index + this (a hair past it)
    state[8] = np.where(dx > 0, 1.0 + _EPS, -_EPS)
    state[9] = np.where(dy > 0, 1.0 + _EPS, -_EPS)
    # 10: where this ray's quadrant table starts; 11: columns of its grid
    state[10] = offset + cells * (2 * (dx < 0) + (dy < 0))
    state[11] = cols
    state[12] = t_max
    state[13] = np.arange(len(dx))                           # ray index
    rays = state[1:12].copy()  # kept for the exact hit times at the end
    out = state[12].copy()
    for _ in range(_SKIP_ROUNDS):
        _skip_block(table, state)
        state = _retire(table, state, out)
        if state.shape[1] <= _TAIL_RAYS:
            break
    while state.shape[1]:
        state = _dda_chunk(table, state, out)
    # A ray that hit stopped a hair inside the first blocked cell: report the exact time it
    # entered that cell. The others ran past their range.
    ox, oy, dx, dy = rays[:4]
    flat = (rays[9] + np.floor(oy + out * dy) * rays[10] + np.floor(ox + out * dx))
    hit = table[np.maximum(np.minimum(flat, len(table) - 1), 0).astype(np.int64)] < 0
    return np.where(hit, np.minimum(_entry_time(rays[:6], out), t_max), t_max)


# Quadrant free-space jumps converge fast except for rays grazing a wall; those few finish with
# exact cell-by-cell chunks, which cost less than many more rounds over every ray.
_SKIP_ROUNDS = 2
_SKIP_ITERS = 5
_TAIL_RAYS = 24
_CHUNK = 48
_K = np.arange(_CHUNK, dtype=np.float64)


def _skip_block(table, state):
    """Advance every ray ``_SKIP_ITERS`` times; a ray in a blocked cell stays where it is."""
    t, ox, oy, dx, dy, idx_, idy, linf, sx, sy = state[:10]
    base = state[10].astype(np.int64)
    cols = state[11].astype(np.int64)
    for _ in range(_SKIP_ITERS):
        px = ox + t * dx
        py = oy + t * dy
        ix = px.astype(np.int64)  # positions are positive: truncation is floor
        iy = py.astype(np.int64)
        val = table[base + iy * cols + ix]
        adv = np.maximum(val * linf, np.minimum((ix + sx - px) * idx_, (iy + sy - py) * idy))
        adv[val < 0] = 0.0
        t += adv


def _entry_time(rows, t):
    """Exact time each ray entered the cell it is in at ``t`` (never later than ``t``): the
    later of its x and y slab entries. ``rows``: state rows 1-6 (origin, direction, inverses)."""
    ox, oy, dx, dy, idx_, idy = rows
    tx = (np.floor(ox + t * dx) + (dx < 0) - ox) * idx_
    ty = (np.floor(oy + t * dy) + (dy < 0) - oy) * idy
    return np.minimum(np.maximum(tx, ty), t)


def _retire(table, state, out):
    """Record rays that hit a wall or passed their range; return the state of the others."""
    t, ox, oy, dx, dy = state[:5]
    flat = (state[10] + (oy + t * dy).astype(np.int64) * state[11]
            + (ox + t * dx).astype(np.int64)).astype(np.int64)
    done = (table[flat] < 0) | (t >= state[12])
    out[state[13, done].astype(np.int64)] = t[done]
    return state[:, ~done]


def _dda_chunk(table, state, out):
    """Check the next ``_CHUNK`` cell boundaries of each ray along x and along y at once."""
    t, ox, oy, dx, dy, idx_, idy, _, sx, sy, base, cols, tmax, ray = state
    px = ox + t * dx
    py = oy + t * dy
    cx = np.floor(px)
    cy = np.floor(py)
    k = _K[None, :]
    last = len(table) - 1
    # Crossing j of the x boundaries happens at tx[:, j] (a hair past it) and enters column
    # cx + step * (j + 1); its row is read from the ray. Likewise for y.
    tx = (t + (cx + sx - px) * idx_)[:, None] + k * np.abs(idx_)[:, None]
    ty = (t + (cy + sy - py) * idy)[:, None] + k * np.abs(idy)[:, None]
    stepx, stepy = np.sign(dx), np.sign(dy)
    flat_x = ((base + cx + stepx)[:, None] + k * stepx[:, None]
              + np.floor(oy[:, None] + tx * dy[:, None]) * cols[:, None])
    flat_y = ((base + (cy + stepy) * cols)[:, None] + k * (stepy * cols)[:, None]
              + np.floor(ox[:, None] + ty * dx[:, None]))
    # Past a map's border wall indices may leave the map; the border hit comes first anyway.
    hit_x = table[np.maximum(np.minimum(flat_x, last), 0).astype(np.int64)] < 0
    hit_y = table[np.maximum(np.minimum(flat_y, last), 0).astype(np.int64)] < 0
    t_end = np.minimum(tx[:, -1], ty[:, -1])
    hit = np.minimum(np.where(hit_x, tx, np.inf).min(axis=1),
                     np.where(hit_y, ty, np.inf).min(axis=1))
    done = (hit <= t_end) | (t_end >= tmax)  # hit is inf where no crossing entered a wall
    out[ray[done].astype(np.int64)] = np.minimum(hit[done], t_end[done])
    state = state[:, ~done]
    state[0] = t_end[~done]
    return state


class DepthCamera:
    """A square pinhole depth camera (``size`` x ``size``, 90 deg FOV) at Habitat's height.

    ``render`` returns depth normalised over 0-10 m as float32 ``(N, size, size, 1)`` (planar
    depth along the optical axis, as Habitat's depth sensor reports it).
    """

    def __init__(self, *, size=64, hfov_deg=HFOV_DEG, max_depth=MAX_DEPTH_M):
        if int(size) < 1:
            raise ValueError(f"depth size must be a positive number of pixels, got {size!r}")
        self.size = int(size)
        self.max_depth = float(max_depth)
        focal = (self.size / 2.0) / np.tan(np.deg2rad(hfov_deg) / 2.0)
        offsets = (np.arange(self.size) + 0.5 - self.size / 2.0) / focal  # image-plane x/z
        self._col_right = offsets  # column u looks right by atan(offsets[u])
        self._col_cos = 1.0 / np.sqrt(1.0 + offsets ** 2)
        self._col_sin = offsets * self._col_cos
        # Row v looks up by atan(-offsets[v]): planar depth where its ray meets floor/ceiling.
        up = -offsets
        with np.errstate(divide="ignore"):
            plane = np.where(up > 0, (CEILING_HEIGHT_M - CAMERA_HEIGHT_M) / up,
                             CAMERA_HEIGHT_M / -up)
        self._plane = (np.minimum(plane, self.max_depth) / self.max_depth).astype(np.float32)
        self._col_angle = np.arctan(offsets)
        # Beyond this distance along a ray its planar depth exceeds the maximum anyway.
        self._t_max = self.max_depth / self._col_cos

    def render(self, table, offset, cols, cells, positions, headings, *, resolution, rgb=False):
        """Depth images for agents at ``positions`` ``(N, 2)`` facing ``headings`` ``(N,)``.

        ``table``/``offset``/``cols``/``cells`` locate each agent's grid as in
        :func:`cast_rays`. Returns float32 ``(N, size, size, 1)`` in [0, 1]; with ``rgb``,
        ``(depth, rgb)``, the second uint8 ``(N, size, size, 3)`` from the same rays, each wall
        face flat-shaded (:data:`WALL_COLOURS`) as Habitat's RGB sensor would see it.
        """
        n, w = len(positions), self.size
        # Column u looks atan(offset_u) right of the heading; at yaw h a ray at angle a - h
        # points along (sin(a - h), -cos(a - h)) in the (x, y) plane.
        phi = (self._col_angle[None, :] - np.asarray(headings)[:, None]).ravel()
        dirs = np.stack([np.sin(phi), -np.cos(phi)], axis=1)
        origins = np.repeat(np.asarray(positions) / resolution, w, axis=0)
        t = cast_rays(table, np.repeat(offset, w), np.repeat(cols, w), np.repeat(cells, w),
                      origins, dirs, np.tile(self._t_max / resolution, n))
        wall = np.minimum(t.reshape(n, w) * (self._col_cos * (resolution / self.max_depth)),
                          1.0).astype(np.float32)
        depth = np.minimum(wall[:, None, :], self._plane[None, :, None])
        if not rgb:
            return depth[..., None]
        return depth[..., None], self._colours(origins, dirs, t, wall, n)

    def _colours(self, origins, dirs, t, wall, n):
        """The RGB image of rays ``t`` (cells) from ``origins`` along ``dirs``: a palette index
        per pixel (wall shade, far, ceiling or floor), then one lookup."""
        w = self.size
        hit = origins + t[:, None] * dirs
        frac = np.abs(hit - np.round(hit))
        face = (frac[:, 1] < frac[:, 0]).astype(np.int64)  # on a y boundary: crossed along y
        line = np.round(hit[np.arange(len(hit)), face]).astype(np.int64)  # the wall's plane
        column = (5 * line + 3 * face) % len(WALL_COLOURS) + len(WALL_COLOURS) * face
        column = np.where(wall.reshape(-1) >= 1.0, _FAR, column).astype(np.uint8).reshape(n, 1, w)
        row = np.where(np.arange(w) < w / 2, _CEILING, _FLOOR).astype(np.uint8)[None, :, None]
        in_wall = wall[:, None, :] <= self._plane[None, :, None]
        return np.take(_PALETTE, np.where(in_wall, column, row), axis=0)
