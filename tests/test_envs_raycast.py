"""The batched ray caster agrees with a plain cell-by-cell ray walk (Amanatides & Woo)."""

import math

import numpy as np

from envs.pointnav.raycast import cast_rays, skip_table


def walk(blocked, x, y, dx, dy, t_max):
    """Reference: distance (in cells) to the first blocked cell, one boundary at a time."""
    cx, cy = math.floor(x), math.floor(y)
    step_x, step_y = (1 if dx > 0 else -1), (1 if dy > 0 else -1)
    t_x = ((cx + (dx > 0)) - x) / dx if dx else math.inf
    t_y = ((cy + (dy > 0)) - y) / dy if dy else math.inf
    dt_x, dt_y = (abs(1 / dx) if dx else math.inf), (abs(1 / dy) if dy else math.inf)
    while True:
        if t_x < t_y:
            t, cx, t_x = t_x, cx + step_x, t_x + dt_x
        else:
            t, cy, t_y = t_y, cy + step_y, t_y + dt_y
        if t >= t_max:
            return t_max
        if blocked[cy, cx]:
            return t


def test_cast_rays_matches_a_cell_by_cell_walk_on_cluttered_grids():
    rng = np.random.default_rng(0)
    grids = []
    for shape in [(60, 80), (45, 45)]:
        blocked = rng.random(shape) < 0.06
        blocked[0, :] = blocked[-1, :] = blocked[:, 0] = blocked[:, -1] = True
        grids.append(blocked)
    tables = [skip_table(b) for b in grids]
    offsets = np.cumsum([0] + [t.size for t in tables[:-1]])
    table = np.concatenate(tables)
    rays, expected = [], []
    for _ in range(400):
        g = int(rng.integers(len(grids)))
        blocked = grids[g]
        while True:
            x, y = rng.uniform(1, blocked.shape[1] - 1), rng.uniform(1, blocked.shape[0] - 1)
            if not blocked[int(y), int(x)]:
                break
        angle = rng.choice([rng.uniform(-np.pi, np.pi), rng.integers(-4, 4) * np.pi / 4])
        dx, dy = math.cos(angle), math.sin(angle)
        t_max = float(rng.uniform(5, 120))
        rays.append((g, x, y, dx, dy, t_max))
        expected.append(walk(blocked, x, y, dx, dy, t_max))
    g, x, y, dx, dy, t_max = map(np.array, zip(*rays))
    got = cast_rays(table, offsets[g], np.array([b.shape[1] for b in grids])[g],
                    np.array([b.size for b in grids])[g], np.stack([x, y], 1),
                    np.stack([dx, dy], 1), t_max)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)
