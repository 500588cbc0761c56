"""Geodesic distance fields over the navigable grid and cheap per-position lookups.

A field holds, for every navigable cell centre, the shortest-path length in metres to a goal
through navigable cells (16-connected: the 8 neighbours plus knight moves, which keeps the
error against the true any-angle distance under 4 %). It is computed once per goal, for a batch
of goals at a time, by a vectorised label-correcting wavefront; a lookup is then a gather.
"""

from __future__ import annotations

import numpy as np

__all__ = ["distance_fields", "lookup_distance", "UNREACHABLE"]

UNREACHABLE = np.inf

# (drow, dcol) moves; knight moves also need the two cells they cut through to be navigable.
_MOVES = [(0, 1), (0, -1), (1, 0), (-1, 0), (1, 1), (1, -1), (-1, 1), (-1, -1)]
_KNIGHTS = [(1, 2), (2, 1), (-1, 2), (-2, 1), (1, -2), (2, -1), (-1, -2), (-2, -1)]


def _shifted(mask, dr, dc):
    """``out[r, c] = mask[r + dr, c + dc]`` (False out of range)."""
    rows, cols = mask.shape
    out = np.zeros_like(mask)
    out[max(0, -dr):rows - max(0, dr), max(0, -dc):cols - max(0, dc)] = \
        mask[max(0, dr):rows - max(0, -dr), max(0, dc):cols - max(0, -dc)]
    return out


def _move_table(navigable):
    """Flat offsets, lengths (cells) and per-cell validity ``(K, cells)`` of each move."""
    cols = navigable.shape[1]
    offsets, lengths, valid = [], [], []
    for dr, dc in _MOVES + _KNIGHTS:
        ok = navigable & _shifted(navigable, dr, dc)
        if abs(dr) == 1 and abs(dc) == 1:
            # No corner cutting: both orthogonal neighbours must be free as well.
            ok &= _shifted(navigable, dr, 0) & _shifted(navigable, 0, dc)
        elif abs(dr) == 2:
            # A knight move's segment crosses the two cells beside its midpoint.
            ok &= _shifted(navigable, dr // 2, 0) & _shifted(navigable, dr // 2, dc)
        elif abs(dc) == 2:
            ok &= _shifted(navigable, 0, dc // 2) & _shifted(navigable, dr, dc // 2)
        offsets.append(dr * cols + dc)
        lengths.append(np.hypot(dr, dc))
        valid.append(ok.ravel())
    return np.asarray(offsets, np.int64), np.asarray(lengths, np.float32), np.stack(valid)


def distance_fields(navigable, goals, *, resolution):
    """Geodesic distance fields ``(G, rows, cols)`` float32 (metres) to each goal in ``goals``.

    ``navigable``: 2-D bool mask (its border must be non-navigable). ``goals``: ``(G, 2)``
    positions in metres. Cells that cannot reach a goal hold ``inf``. The goal's own cell and
    its navigable neighbours are seeded with their straight-line distance to the goal point.
    """
    navigable = np.asarray(navigable, dtype=bool)
    goals = np.asarray(goals, dtype=np.float64).reshape(-1, 2)
    rows, cols = navigable.shape
    n = rows * cols
    offsets, lengths, valid = _move_table(navigable)
    lengths = lengths * np.float32(resolution)
    dist = np.full(len(goals) * n, np.inf, dtype=np.float32)

    seeds, seed_d = [], []
    for g, (gx, gy) in enumerate(goals):
        gr, gc = int(np.floor(gy / resolution)), int(np.floor(gx / resolution))
        for dr in (-1, 0, 1):
            for dc in (-1, 0, 1):
                r, c = gr + dr, gc + dc
                if 0 <= r < rows and 0 <= c < cols and navigable[r, c]:
                    seeds.append(g * n + r * cols + c)
                    seed_d.append(np.hypot((c + 0.5) * resolution - gx,
                                           (r + 0.5) * resolution - gy))
    if not seeds:
        return dist.reshape(len(goals), rows, cols)
    pending = np.asarray(seeds, dtype=np.int64)  # distinct cells by construction
    dist[pending] = np.asarray(seed_d, dtype=np.float32)
    in_pending = np.zeros(dist.size, dtype=bool)
    in_pending[pending] = True
    step = np.float32(resolution)  # the shortest move: a bucket this wide is settled at once
    while pending.size:
        # Dial-style bucket: every pending cell within one shortest move of the minimum is
        # final (any other path to it is at least one move longer), so each cell is expanded
        # exactly once, as in Dijkstra, while a whole bucket is expanded in one vector call.
        pd = dist[pending]
        now = pd < pd.min() + step
        active, pending = pending[now], pending[~now]
        in_pending[active] = False
        ok = valid[:, active % n].T
        cand = (active[:, None] + offsets[None, :])[ok]
        cand_d = (dist[active][:, None] + lengths[None, :])[ok]
        better = cand_d < dist[cand]
        cand, cand_d = cand[better], cand_d[better]
        if cand.size:
            np.minimum.at(dist, cand, cand_d)
            cand = np.sort(cand[~in_pending[cand]])
            cand = cand[np.concatenate(([True], cand[1:] != cand[:-1]))] if cand.size else cand
            in_pending[cand] = True
            pending = np.concatenate([pending, cand])
    return dist.reshape(len(goals), rows, cols)


def lookup_distance(flat, offset, cols, positions, *, resolution):
    """Geodesic distance from ``positions`` ``(N, 2)`` read from fields packed in ``flat``.

    Position ``i`` reads the field starting at ``flat[offset[i]]`` with ``cols[i]`` columns.
    The distance is the best over the four cell centres around the position of (their field
    value + straight-line distance to them): exact near the goal and continuous as the agent
    moves within a cell.
    """
    positions = np.asarray(positions, dtype=np.float64)
    u = positions[:, 0] / resolution - 0.5
    v = positions[:, 1] / resolution - 0.5
    c0 = np.floor(u).astype(np.int64)
    r0 = np.floor(v).astype(np.int64)
    base = offset + r0 * cols + c0
    best = np.full(len(positions), np.inf)
    for dr in (0, 1):
        for dc in (0, 1):
            d = flat[base + dr * cols + dc] + resolution * np.hypot(u - (c0 + dc), v - (r0 + dr))
            np.minimum(best, d, out=best)
    return best
