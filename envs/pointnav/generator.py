"""Seeded procedural indoor floor plans: rooms split by walls with doors, plus furniture."""

from __future__ import annotations

import numpy as np

from .grid import OccupancyGrid

__all__ = ["generate_floor_plan"]


def generate_floor_plan(*, seed, width_m=8.0, height_m=8.0, resolution=0.05, min_room_m=2.0,
                        max_rooms=4, clutter=0.05, wall_m=0.1, door_m=0.9):
    """Generate an indoor floor plan, reproducible from ``seed``.

    The outline is a ``width_m`` x ``height_m`` box with ``wall_m`` thick walls. It is split
    recursively (binary space partition) into at most ``max_rooms`` rooms no narrower than
    ``min_room_m``; every dividing wall gets one ``door_m`` wide door, so all rooms connect.
    ``clutter`` is the fraction of floor area covered by box-shaped furniture (0 = empty rooms);
    furniture keeps clear of doors. Returns an :class:`OccupancyGrid`.
    """
    if width_m <= 2 * wall_m + 1.0 or height_m <= 2 * wall_m + 1.0:
        raise ValueError(f"map of {width_m} x {height_m} m is too small (need > 1 m of floor)")
    if not 0.0 <= clutter < 0.5:
        raise ValueError(f"clutter is a floor-area fraction in [0, 0.5), got {clutter!r}")
    rng = np.random.default_rng(seed)
    res = float(resolution)
    cols = int(round(width_m / res))
    rows = int(round(height_m / res))
    wall = max(1, int(round(wall_m / res)))
    door = max(1, int(round(door_m / res)))
    min_room = max(door + 2, int(round(min_room_m / res)))
    blocked = np.zeros((rows, cols), dtype=bool)
    blocked[:wall, :] = blocked[-wall:, :] = True
    blocked[:, :wall] = blocked[:, -wall:] = True

    doors = []  # (row, col) centres of door openings; furniture keeps away from them
    rooms = [(wall, wall, rows - wall, cols - wall)]  # (r0, c0, r1, c1), half-open
    done = []
    while rooms and len(rooms) + len(done) < max_rooms:
        rooms.sort(key=lambda r: (r[2] - r[0]) * (r[3] - r[1]))
        r0, c0, r1, c1 = rooms.pop()  # split the largest room first: balanced plans
        h, w = r1 - r0, c1 - c0
        split_rows = h >= w if (h >= 2 * min_room + wall) == (w >= 2 * min_room + wall) \
            else h >= 2 * min_room + wall
        span = h if split_rows else w
        if span < 2 * min_room + wall:
            done.append((r0, c0, r1, c1))
            continue
        cut = int(rng.integers(min_room, span - min_room - wall + 1))
        if split_rows:
            wr = r0 + cut
            blocked[wr:wr + wall, c0:c1] = True
            d0 = int(rng.integers(c0 + 1, max(c0 + 2, c1 - door - 1)))
            blocked[wr:wr + wall, d0:d0 + door] = False
            doors.append((wr + wall // 2, d0 + door // 2))
            rooms += [(r0, c0, wr, c1), (wr + wall, c0, r1, c1)]
        else:
            wc = c0 + cut
            blocked[r0:r1, wc:wc + wall] = True
            d0 = int(rng.integers(r0 + 1, max(r0 + 2, r1 - door - 1)))
            blocked[d0:d0 + door, wc:wc + wall] = False
            doors.append((d0 + door // 2, wc + wall // 2))
            rooms += [(r0, c0, r1, wc), (r0, wc + wall, r1, c1)]
    done += rooms

    floor = int((~blocked).sum())
    target = clutter * floor
    covered = 0
    clear = int(round(1.0 / res))  # keep a 1 m radius around each door free
    attempts = 0
    while covered < target and attempts < 200:
        attempts += 1
        r0, c0, r1, c1 = done[int(rng.integers(len(done)))]
        fh = int(rng.integers(max(2, int(0.3 / res)), max(3, int(1.2 / res))))
        fw = int(rng.integers(max(2, int(0.3 / res)), max(3, int(1.2 / res))))
        if r1 - r0 <= fh + 2 or c1 - c0 <= fw + 2:
            continue
        fr = int(rng.integers(r0 + 1, r1 - fh - 1))
        fc = int(rng.integers(c0 + 1, c1 - fw - 1))
        if any(abs(dr - (fr + fh / 2)) < clear + fh / 2 and abs(dc - (fc + fw / 2)) < clear + fw / 2
               for dr, dc in doors):
            continue
        patch = blocked[fr:fr + fh, fc:fc + fw]
        covered += int((~patch).sum())
        patch[...] = True
    return OccupancyGrid(blocked, res)
