"""The embedded simulator's RGB camera (``sensors=["depth", "rgb"]``): the depth camera's rays,
each wall plane one flat shade, floor and ceiling grey; depth unchanged beside it."""
import numpy as np
import pytest

import envs
from envs.pointnav.raycast import (CEILING_RGB, FAR_RGB, FLOOR_RGB, WALL_COLOURS, DepthCamera)

OPTS = dict(scenes="trivial", depth_size=16, seed=3)
RGB = ["depth", "rgb"]


def _walk(venv, steps=12):
    obs, _ = venv.reset(seed=3)
    frames = [obs]
    for k in range(steps):
        frames.append(venv.step(np.full(venv.num_envs, 1 + k % 3))[0])
    return frames


def test_rgb_comes_beside_an_unchanged_depth_image():
    plain = _walk(envs.make_vector_env("pointnav", 2, **OPTS))
    both = _walk(envs.make_vector_env("pointnav", 2, sensors=RGB, **OPTS))
    for a, b in zip(plain, both):
        np.testing.assert_array_equal(a["depth"], b["depth"])
        assert "rgb" not in a and b["rgb"].dtype == np.uint8 and b["rgb"].shape == (2, 16, 16, 3)
    space = envs.make_vector_env("pointnav", 1, sensors=RGB, **OPTS).single_observation_space
    assert space["rgb"].dtype == np.uint8 and space["rgb"].shape == (16, 16, 3)


def test_a_pixel_is_floor_or_ceiling_exactly_where_the_depth_is_not_the_walls():
    shades = {tuple(c) for c in WALL_COLOURS} | {tuple((c * 0.8).astype(np.uint8))
                                                for c in WALL_COLOURS} | {tuple(FAR_RGB)}
    for obs in _walk(envs.make_vector_env("pointnav", 2, sensors=RGB, **OPTS)):
        depth, rgb = obs["depth"][..., 0], obs["rgb"]
        wall = depth >= depth.max(axis=1, keepdims=True)  # the wall's depth is the column's most
        grey = (rgb == FLOOR_RGB).all(-1) | (rgb == CEILING_RGB).all(-1)
        np.testing.assert_array_equal(grey, ~wall)
        assert {tuple(p) for p in rgb[wall]} <= shades
        assert (rgb[:, :8][~wall[:, :8]] == CEILING_RGB).all()  # above the horizon


def test_a_wall_plane_has_one_shade_and_the_next_plane_another():
    cam = DepthCamera(size=4)
    origins = np.array([[0.5, 0.2], [0.5, 1.7], [0.5, 2.9], [0.5, 0.5]])
    dirs = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    t = np.array([2.5, 2.5, 2.5, 3.5])  # three rays end on the plane x = 3, one on x = 4
    rgb = cam._colours(origins, dirs, t, np.full((1, 4), 0.1, np.float32), 1)
    mid = rgb[0, 2]
    assert (mid[:3] == WALL_COLOURS[15 % 8]).all() and (mid[3] == WALL_COLOURS[20 % 8]).all()


def test_worker_processes_carry_the_rgb_image_unchanged():
    inproc = envs.make_vector_env("pointnav", 1, sensors=RGB, **OPTS)
    with envs.make_vector_env("pointnav", 1, workers="process", sensors=RGB, **OPTS) as pool:
        for a, b in zip(_walk(inproc, 5), _walk(pool, 5)):
            np.testing.assert_array_equal(a["rgb"], b["rgb"])


def test_bad_sensors_and_rgb_on_the_device_simulator_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"sensors must be \['depth'\] or \['depth', 'rgb'\]"):
        envs.make_vector_env("pointnav", 1, sensors=["rgb"], **OPTS)
    with pytest.raises(ValueError, match=r"device simulator renders depth only.*env.device=numpy"):
        envs.make_vector_env("pointnav", 1, device="cpu", sensors=RGB, **OPTS)


def test_the_benchmark_times_depth_alone_and_with_rgb_and_writes_its_runs(tmp_path, capsys):
    import json

    from envs.bench import main

    main(["--scenes", "trivial", "--envs", "2", "--sizes", "8", "--seconds", "0.1", "--rgb",
          "--json", str(tmp_path / "runs.json")])
    table = capsys.readouterr().out
    assert "| 2 | 8x8 | inprocess | depth |" in table
    assert "| 2 | 8x8 | inprocess | depth+rgb |" in table
    raw = json.loads((tmp_path / "runs.json").read_text())
    assert [r["sensors"] for r in raw["runs"]] == [["depth"], ["depth", "rgb"]]
    facts = raw["facts"]
    assert facts["command"].startswith("python -m envs.bench") and len(facts["load_end"]) == 3
