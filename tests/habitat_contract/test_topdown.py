"""habitat-lab's own ``TopDownMap`` measure through the adapter (``top_down_map=N``): the map
habitat draws from the path finder (the stand-in's ``get_bounds``/``get_topdown_view`` give the
embedded scene's grid; a real habitat-sim gives its navmesh), the start, the goal and the path,
coloured in the embedded maps' palette, for every step, the ended episode's at its end and the
next one's first beside it."""

import numpy as np

import envs
from envs.pointnav.topdown import FREE_RGB, GOAL_RGB, PATH_RGB, WALL_RGB
from test_env import _toward_goal

SIZE = 16
PIXELS = 96


def _has(image, colour):
    return bool((image == np.uint8(colour)).all(axis=-1).any())


def test_habitats_top_down_map_reaches_infos_with_path_start_and_goal(exported):
    hab = envs.make_eval_env("habitat", 1, split="val", episodes=exported["data_path"],
                             scenes_dir=exported["scenes_dir"], depth_size=SIZE,
                             max_episode_steps=200, seed=0, top_down_map=PIXELS).env
    obs, infos = hab.reset(seed=0)
    start = infos["top_down_map"][0]
    assert start.dtype == np.uint8 and start.ndim == 3 and max(start.shape[:2]) <= PIXELS
    assert all(_has(start, c) for c in (FREE_RGB, WALL_RGB, GOAL_RGB, PATH_RGB))
    paths, steps = [int((start == np.uint8(PATH_RGB)).all(-1).sum())], 0
    while True:
        obs, _, term, trunc, infos = hab.step(np.array([_toward_goal(obs)]))
        steps += 1
        image = infos["top_down_map"][0]
        assert image.shape == start.shape
        paths.append(int((image == np.uint8(PATH_RGB)).all(-1).sum()))
        if term[0] or trunc[0]:
            break
        assert infos["next_top_down_map"][0] is None
    assert bool(infos["success"][0]) and steps > 3
    assert paths[-1] > paths[0]  # the walked path is drawn
    nxt = infos["next_top_down_map"][0]  # the next episode's first map, its path not walked
    assert nxt.shape == start.shape and _has(nxt, GOAL_RGB)
    assert int((nxt == np.uint8(PATH_RGB)).all(-1).sum()) < paths[-1]
    hab.close()
