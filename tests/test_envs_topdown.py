"""envs.pointnav.topdown.top_down_map: the grid, the path walked, start, end and goal."""
import numpy as np

from envs.pointnav.topdown import (FREE_RGB, GOAL_RGB, PATH_RGB, START_RGB, WALL_RGB,
                                   top_down_map)


def test_the_map_draws_grid_path_and_markers_where_they_are():
    blocked = np.zeros((10, 12), dtype=bool)
    blocked[0, :] = True
    # 1 m cells: start (1.5, 5.5) -> (6.5, 5.5) along row 5, goal at (10.5, 8.5)
    img = top_down_map(blocked, 1.0, [(1.5, 5.5), (4.0, 5.5), (6.5, 5.5)], (10.5, 8.5), marker=0)
    assert img.shape == (10, 12, 3) and img.dtype == np.uint8
    assert (img[0] == WALL_RGB).all() and (img[9, 0] == FREE_RGB).all()
    assert (img[5, 1] == START_RGB).all() and (img[5, 6] == PATH_RGB).all()
    assert all((img[5, c] == PATH_RGB).all() for c in range(2, 7))  # every cell between
    assert (img[8, 10] == GOAL_RGB).all()
    assert (img[4, 2:7] == FREE_RGB).all()  # nothing off the path


def test_markers_are_squares_clipped_at_the_edge():
    img = top_down_map(np.zeros((6, 6), bool), 0.5, [(0.1, 0.1)], (2.9, 2.9), marker=1)
    assert (img[0:2, 0:2] == PATH_RGB).all()  # a one-point path: the agent where it is
    assert (img[4:6, 4:6] == GOAL_RGB).all() and (img[3, 3] == FREE_RGB).all()
