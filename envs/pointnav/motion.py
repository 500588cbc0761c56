"""Agent motion on the grid: straight moves that stop at walls and slide along them."""

from __future__ import annotations

import numpy as np

__all__ = ["move"]


def _free_prefix(nav, offset, cols, start, disp, samples, resolution):
    """Fraction of ``disp`` each agent can travel from ``start`` before a non-navigable sample.

    Returns the index (0..samples) of the last navigable sample point along each segment.
    """
    frac = np.arange(1, samples + 1, dtype=np.float64) / (samples * resolution)
    px = start[:, 0:1] / resolution + frac * disp[:, 0:1]
    py = start[:, 1:2] / resolution + frac * disp[:, 1:2]
    flat = (offset[:, None] + np.floor(py).astype(np.int64) * cols[:, None]
            + np.floor(px).astype(np.int64))
    # Samples past a wall may leave the grid; the wall is met first, so clipping is harmless.
    ok = nav[np.maximum(np.minimum(flat, nav.size - 1), 0)]
    # Index of the first blocked sample (samples if none), i.e. the count of free ones before it.
    return np.where(ok.all(axis=1), samples, np.argmin(ok, axis=1))


def move(nav, offset, cols, positions, displacement, *, resolution):
    """Move agents by ``displacement`` ``(M, 2)``, stopping at walls and sliding along them.

    ``nav``: flat navigable masks (True = the agent's centre may be there); agent ``i`` reads
    the grid at ``offset[i]`` with ``cols[i]`` columns. The path is checked at least every half
    cell. If it is blocked, the agent advances to its last free point and then slides with the
    rest of the move along the x or the y axis, whichever gets further (along a wall, the
    tangential component survives). Returns ``(new_positions, collided)``.
    """
    positions = np.asarray(positions, dtype=np.float64)
    displacement = np.asarray(displacement, dtype=np.float64)
    offset = np.asarray(offset, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    # The sample count depends on the move length only (every PointNav move is 0.25 m), so an
    # agent's result never depends on which other agents share the batch.
    length = float(np.max(np.hypot(displacement[:, 0], displacement[:, 1]))) \
        if len(displacement) else 0.0
    samples = max(1, int(np.ceil(round(length / (0.5 * resolution), 9))))
    free = _free_prefix(nav, offset, cols, positions, displacement, samples, resolution)
    new = positions + displacement * (free / samples)[:, None]
    collided = free < samples
    if collided.any():
        idx = np.flatnonzero(collided)
        m = len(idx)
        rest = displacement[idx] * (1.0 - free[idx] / samples)[:, None]
        start = new[idx]
        # Both axis-aligned slides of every blocked agent, checked in one call.
        slides = np.zeros((2 * m, 2))
        slides[:m, 0] = rest[:, 0]
        slides[m:, 1] = rest[:, 1]
        both = np.concatenate((idx, idx))
        got = _free_prefix(nav, offset[both], cols[both], np.concatenate((start, start)),
                           slides, samples, resolution)
        steps = slides * (got / samples)[:, None]
        use_x = np.abs(steps[:m, 0]) >= np.abs(steps[m:, 1])
        new[idx] = start + np.where(use_x[:, None], steps[:m], steps[m:])
    return new, collided
