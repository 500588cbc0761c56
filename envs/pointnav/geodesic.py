"""Geodesic distance fields over the navigable grid and cheap per-position lookups.

A field holds, for every navigable cell centre, the shortest-path length in metres to a goal
through navigable cells, moving between cell centres in 32 directions (which keeps it within
1.3 % of the true any-angle distance in open space; cells in sight of the goal are exact). It is
computed once per goal, for a batch of goals at a time, by a vectorised bucketed Dijkstra; a
lookup is then a gather.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["distance_fields", "lookup_distance", "UNREACHABLE"]

UNREACHABLE = np.inf
SEED_RADIUS_M = 0.5
_DC = np.array([0.0, 1.0, 0.0, 1.0])  # column / row offsets of the four cell centres
_DR = np.array([0.0, 0.0, 1.0, 1.0])  # around a position, in lookup_distance
_DC_INT, _DR_INT = _DC.astype(np.int64), _DR.astype(np.int64)

def _primitive_moves(reach):
    """Moves ``(drow, dcol)`` within ``reach`` cells whose direction no shorter move has."""
    return [(dr, dc) for dr in range(-reach, reach + 1) for dc in range(-reach, reach + 1)
            if (dr or dc) and np.gcd(dr, dc) == 1]


# 32 directions (up to 3 cells away): paths bend at most 9.2 deg off any heading, so grid
# distances exceed true straight-line ones by at most 1.3 %.
_MOVES = _primitive_moves(3)


@functools.lru_cache(maxsize=None)
def _crossed_cells(dr, dc):
    """Cells, other than its ends, that the segment between two cell centres passes through or
    touches (a corner counts: no squeezing between two diagonal obstacles)."""
    t = np.linspace(0.0, 1.0, 1025)
    perp = np.array([-dc, dr]) / np.hypot(dr, dc)
    cells = set()
    for side in (-0.01, 0.0, 0.01):
        r = np.floor(t * dr + side * perp[0] + 0.5).astype(int)
        c = np.floor(t * dc + side * perp[1] + 0.5).astype(int)
        cells.update(zip(r.tolist(), c.tolist()))
    return sorted(cells - {(0, 0), (dr, dc)})


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
    shifted = {}

    def nav_at(dr, dc):
        if (dr, dc) not in shifted:
            shifted[dr, dc] = _shifted(navigable, dr, dc)
        return shifted[dr, dc]

    offsets, lengths, valid = [], [], []
    for dr, dc in _MOVES:
        ok = navigable & nav_at(dr, dc)
        for cr, cc in _crossed_cells(dr, dc):
            ok &= nav_at(cr, cc)
        offsets.append(dr * cols + dc)
        lengths.append(np.hypot(dr, dc))
        valid.append(ok.ravel())
    return np.asarray(offsets, np.int64), np.asarray(lengths, np.float32), np.stack(valid)


def _in_sight(navigable, gx, gy, rows, cols, resolution):
    """Whether the straight segment from the goal to each cell centre stays navigable."""
    frac = np.linspace(0.0, 1.0, 2 * int(np.ceil(SEED_RADIUS_M / resolution)) + 1)
    px = gx + frac[None, :] * ((cols + 0.5) * resolution - gx)[:, None]
    py = gy + frac[None, :] * ((rows + 0.5) * resolution - gy)[:, None]
    r = np.clip(np.floor(py / resolution).astype(np.int64), 0, navigable.shape[0] - 1)
    c = np.clip(np.floor(px / resolution).astype(np.int64), 0, navigable.shape[1] - 1)
    return navigable[r, c].all(axis=1)


def distance_fields(navigable, goals, *, resolution):
    """Geodesic distance fields ``(G, rows, cols)`` float32 (metres) to each goal in ``goals``.

    ``navigable``: 2-D bool mask (its border must be non-navigable). ``goals``: ``(G, 2)``
    positions in metres. Cells that cannot reach a goal hold ``inf``. Navigable cells within
    ``SEED_RADIUS_M`` of a goal and in sight of it hold their exact straight-line distance.
    """
    navigable = np.asarray(navigable, dtype=bool)
    goals = np.asarray(goals, dtype=np.float64).reshape(-1, 2)
    rows, cols = navigable.shape
    n = rows * cols
    offsets, lengths, valid = _move_table(navigable)
    lengths = lengths * np.float32(resolution)
    dist = np.full(len(goals) * n, np.inf, dtype=np.float32)

    seeds, seed_d = [], []
    reach = int(np.ceil(SEED_RADIUS_M / resolution))
    dr, dc = np.mgrid[-reach:reach + 1, -reach:reach + 1]
    for g, (gx, gy) in enumerate(goals):
        # Cells in sight of the goal within SEED_RADIUS_M start from their exact straight-line
        # distance, so near the goal (where success is decided) the field has no grid error.
        r = int(np.floor(gy / resolution)) + dr.ravel()
        c = int(np.floor(gx / resolution)) + dc.ravel()
        d = np.hypot((c + 0.5) * resolution - gx, (r + 0.5) * resolution - gy)
        ok = (r >= 0) & (r < rows) & (c >= 0) & (c < cols) & (d <= SEED_RADIUS_M)
        r, c, d = r[ok], c[ok], d[ok]
        ok = navigable[r, c] & _in_sight(navigable, gx, gy, r, c, resolution)
        seeds.extend((g * n + r[ok] * cols + c[ok]).tolist())
        seed_d.extend(d[ok].tolist())
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


def lookup_distance(flat, offset, cols, positions, goals, *, resolution):
    """Geodesic distance from ``positions`` ``(N, 2)`` to ``goals`` ``(N, 2)`` using fields
    packed in ``flat``: position ``i`` reads the field starting at ``flat[offset[i]]`` with
    ``cols[i]`` columns.

    In a cell that sees the goal directly (its field value is its straight-line distance) the
    answer is the straight-line distance itself; elsewhere it is the best over the four cell
    centres around the position of (their field value + straight-line distance to them),
    which is continuous as the agent moves within a cell.
    """
    positions = np.asarray(positions, dtype=np.float64)
    u = positions[:, 0] / resolution - 0.5
    v = positions[:, 1] / resolution - 0.5
    c0 = np.floor(u)
    r0 = np.floor(v)
    base = offset + r0.astype(np.int64) * cols + c0.astype(np.int64)
    # The four surrounding cell centres at once: (N, 4).
    corner = base[:, None] + _DC_INT + _DR_INT * np.asarray(cols)[:, None]
    du = (u - c0)[:, None] - _DC
    dv = (v - r0)[:, None] - _DR
    best = (flat[corner] + resolution * np.sqrt(du * du + dv * dv)).min(axis=1)
    goals = np.asarray(goals, dtype=np.float64)
    own_c = np.floor(positions[:, 0] / resolution)
    own_r = np.floor(positions[:, 1] / resolution)
    own = flat[offset + own_r.astype(np.int64) * cols + own_c.astype(np.int64)]
    centre_d = resolution * np.hypot(own_c + 0.5 - goals[:, 0] / resolution,
                                     own_r + 0.5 - goals[:, 1] / resolution)
    direct = np.abs(own - centre_d) < 1e-4
    if direct.any():
        best[direct] = np.hypot(*(positions[direct] - goals[direct]).T)
    return best
