"""The exported GLB read by an independent glTF loader (trimesh): the file parses, the wall
solids are watertight with consistent winding and the blocked volume, the floor has the free area."""

import numpy as np
import pytest
import trimesh

from envs.pointnav.export import glb_name
from envs.pointnav.episodes import load_episodes
from envs.pointnav.scenes import load_scene
from envs.pointnav.spec import CEILING_HEIGHT_M


def test_trimesh_reads_the_exported_scene_as_the_grid_describes(exported):
    scene_id = load_episodes(exported["embedded"]["val"])[0].scene_id
    grid = load_scene(scene_id).grid
    loaded = trimesh.load(f"{exported['scenes_dir']}/{glb_name(scene_id)}", process=False)
    geometry = {name: loaded.geometry[name] for name in loaded.geometry}
    assert set(geometry) == {"floor", "ceiling", "walls"}
    walls, floor = geometry["walls"], geometry["floor"]
    assert walls.is_watertight and walls.is_winding_consistent
    cell = grid.resolution ** 2
    assert walls.volume == pytest.approx(grid.blocked.sum() * cell * CEILING_HEIGHT_M, rel=1e-6)
    assert floor.area == pytest.approx((~grid.blocked).sum() * cell, rel=1e-6)
    np.testing.assert_allclose(loaded.bounds, [[0.0, 0.0, 0.0], [grid.size_m[0], CEILING_HEIGHT_M,
                                                                 grid.size_m[1]]], atol=1e-6)
