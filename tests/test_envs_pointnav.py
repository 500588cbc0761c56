"""The embedded PointNav simulator implements Habitat's PointNav task spec (docs/embedded_env.md)."""

import gzip
import json

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs.pointnav import spec
from envs.pointnav.episodes import (Episode, EpisodeFileError, load_episodes, save_episodes)
from envs.pointnav.grid import OccupancyGrid, load_occupancy_png, save_occupancy_png

RES = 0.05


def room_png(path, *, width_m=4.0, height_m=4.0, wall_cells=2, inner_wall=None):
    """Write an open rectangular room (walls ``wall_cells`` thick) as a PNG map; return path.

    ``inner_wall``: optional ``(row0, row1, col0, col1)`` block of extra blocked cells.
    """
    rows, cols = int(round(height_m / RES)), int(round(width_m / RES))
    blocked = np.zeros((rows, cols), dtype=bool)
    blocked[:wall_cells] = blocked[-wall_cells:] = True
    blocked[:, :wall_cells] = blocked[:, -wall_cells:] = True
    if inner_wall is not None:
        r0, r1, c0, c1 = inner_wall
        blocked[r0:r1, c0:c1] = True
    save_occupancy_png(OccupancyGrid(blocked, RES), str(path))
    return str(path)


@pytest.fixture
def room(tmp_path):
    """A 4 m x 4 m empty room; its walls' inner faces are at 0.1 m and 3.9 m."""
    return room_png(tmp_path / "room.png")


def make_env(scenes, **kwargs):
    env = gym.make("PointNav-v0", scenes=scenes, **kwargs)
    env.reset(seed=kwargs.pop("seed", 0))
    return env


def test_import_registers_pointnav_v0_with_the_documented_spaces():
    env = gym.make("PointNav-v0", scenes="trivial")
    assert env.action_space == gym.spaces.Discrete(4)
    assert set(env.observation_space.spaces) == {"depth", "pointgoal_with_gps_compass"}
    obs, info = env.reset(seed=1)
    assert obs["depth"].shape == (64, 64, 1) and obs["depth"].dtype == np.float32
    assert obs["pointgoal_with_gps_compass"].shape == (2,)
    assert {"distance_to_goal", "success", "spl", "episode_id"} <= set(info)
    assert [a.name for a in spec.Action] == ["STOP", "MOVE_FORWARD", "TURN_LEFT", "TURN_RIGHT"]


def test_forward_moves_exactly_a_quarter_metre_along_the_heading_in_free_space(room):
    env = make_env(room).unwrapped
    env.set_agent_state((2.0, 2.0), 0.7)
    env.step(spec.Action.MOVE_FORWARD)
    expected = np.array([2.0, 2.0]) + 0.25 * np.array([-np.sin(0.7), -np.cos(0.7)])
    np.testing.assert_allclose(env.agent_position, expected, atol=1e-12)


def test_turns_are_ten_degrees_left_positive_and_do_not_move_the_agent(room):
    env = make_env(room).unwrapped
    env.set_agent_state((2.0, 2.0), 0.0)
    env.step(spec.Action.TURN_LEFT)
    assert env.agent_heading == pytest.approx(np.deg2rad(10.0), abs=1e-12)
    env.step(spec.Action.TURN_RIGHT)
    env.step(spec.Action.TURN_RIGHT)
    assert env.agent_heading == pytest.approx(np.deg2rad(-10.0), abs=1e-12)
    np.testing.assert_allclose(env.agent_position, [2.0, 2.0])


def test_a_wall_stops_the_agent_at_its_radius(room):
    env = make_env(room).unwrapped
    env.set_agent_state((2.0, 2.0), 0.0)  # looking along -y, at the wall whose face is y = 0.1
    infos = [env.step(spec.Action.MOVE_FORWARD)[4] for _ in range(12)]
    x, y = env.agent_position
    assert 0.1 + spec.AGENT_RADIUS_M <= y < 0.1 + spec.AGENT_RADIUS_M + RES
    assert x == pytest.approx(2.0)
    assert infos[-1]["collided"] and not infos[0]["collided"]


def test_the_agent_slides_along_a_wall_it_hits_at_an_angle(room):
    env = make_env(room).unwrapped
    heading = np.deg2rad(-30.0)  # forward = (0.5, -0.866): into the y = 0.1 wall, drifting +x
    env.set_agent_state((1.0, 0.6), heading)
    for _ in range(3):
        env.step(spec.Action.MOVE_FORWARD)
    x0, y0 = env.agent_position
    assert y0 < 0.1 + spec.AGENT_RADIUS_M + RES  # in contact
    for _ in range(4):
        env.step(spec.Action.MOVE_FORWARD)
    x1, y1 = env.agent_position
    assert y1 == pytest.approx(y0)                            # never into the wall
    assert x1 - x0 == pytest.approx(4 * 0.25 * 0.5, abs=2 * RES)  # tangential part survives


def _disc_overlaps_blocked(blocked, pos, radius):
    r0, c0 = int(pos[1] / RES), int(pos[0] / RES)
    reach = int(np.ceil(radius / RES)) + 1
    rr, cc = np.mgrid[r0 - reach:r0 + reach + 1, c0 - reach:c0 + reach + 1]
    inside = (rr >= 0) & (rr < blocked.shape[0]) & (cc >= 0) & (cc < blocked.shape[1])
    rr, cc = rr[inside], cc[inside]
    hit = blocked[rr, cc]
    # Distance from the agent's centre to each blocked cell's square.
    dx = np.maximum(np.maximum(cc * RES - pos[0], pos[0] - (cc + 1) * RES), 0.0)
    dy = np.maximum(np.maximum(rr * RES - pos[1], pos[1] - (rr + 1) * RES), 0.0)
    return bool(np.any(hit & (np.hypot(dx, dy) < radius - 1e-9)))


def test_the_agent_never_overlaps_a_wall_or_obstacle_over_thousands_of_random_steps():
    venv = envs.PointNavVectorEnv(8, scenes="default", seed=3, depth_size=8)
    venv.reset()
    sim = venv.sim
    rng = np.random.default_rng(0)
    for _ in range(400):
        venv.step(rng.choice(4, 8, p=[0.02, 0.7, 0.14, 0.14]))
        for i in range(8):
            assert not _disc_overlaps_blocked(sim.scene[i].grid.blocked, sim.pos[i],
                                              spec.AGENT_RADIUS_M)


def test_stop_terminates_the_episode_and_the_step_limit_truncates_it(room):
    env = make_env(room)
    _, _, terminated, truncated, _ = env.step(spec.Action.STOP)
    assert terminated and not truncated
    env = make_env(room, max_episode_steps=5)
    flags = [env.step(spec.Action.TURN_LEFT)[2:4] for _ in range(5)]
    assert flags == [(False, False)] * 4 + [(False, True)]


def test_a_step_after_the_episode_ended_asks_for_reset(room):
    env = make_env(room)
    env.step(spec.Action.STOP)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(spec.Action.TURN_LEFT)


def _place_near_goal(env, distance):
    goal = env.goal_position
    toward_centre = np.array([2.0, 2.0]) - goal
    toward_centre /= np.linalg.norm(toward_centre)
    env.set_agent_state(goal + distance * toward_centre, 0.0)


@pytest.mark.parametrize("distance, success", [(0.15, True), (0.19, True), (0.25, False)])
def test_success_iff_geodesic_distance_is_under_0_2_m_at_stop(room, distance, success):
    env = make_env(room).unwrapped
    _place_near_goal(env, distance)
    _, reward, _, _, info = env.step(spec.Action.STOP)
    assert info["success"] is success
    assert info["distance_to_goal"] == pytest.approx(distance, abs=1e-6)
    assert reward == pytest.approx(-0.01 + 2.5 * success, abs=1e-6)


def test_being_near_the_goal_without_stop_is_not_success(room):
    env = make_env(room).unwrapped
    _place_near_goal(env, 0.3)
    _, _, terminated, _, info = env.step(spec.Action.TURN_LEFT)
    assert not terminated and not info["success"] and info["spl"] == 0.0


def test_spl_formula():
    assert spec.spl(1, 4.0, 5.0) == pytest.approx(0.8)
    assert spec.spl(1, 4.0, 3.0) == pytest.approx(1.0)
    assert spec.spl(0, 4.0, 4.0) == 0.0


def test_spl_at_episode_end_is_shortest_over_path_length(room):
    env = make_env(room).unwrapped
    # Walk straight towards the goal, then STOP: SPL = d / max(d, path length).
    for _ in range(60):
        d, angle = env._sim.observe()["pointgoal_with_gps_compass"][0]
        if d < 0.15:
            break
        if abs(angle) > np.deg2rad(6):
            action = spec.Action.TURN_LEFT if angle > 0 else spec.Action.TURN_RIGHT
        else:
            action = spec.Action.MOVE_FORWARD
        _, _, _, _, info = env.step(action)
    shortest, path = env.episode_geodesic_distance, info["path_length"]
    _, _, _, _, info = env.step(spec.Action.STOP)
    assert info["success"]
    assert info["spl"] == pytest.approx(shortest / max(shortest, path), rel=1e-5)


def test_spl_after_a_detour_is_the_shortest_path_over_the_path_walked(room, tmp_path):
    # Start 2 m from the goal in an empty room; face it, turn 90 degrees away, walk 1 m, then go
    # to the goal and STOP. Free space: every MOVE_FORWARD moves 0.25 m, nothing slides.
    path = tmp_path / "detour.json.gz"
    save_episodes(path, [Episode(episode_id="detour", scene_id=room, start_position=(1.0, 2.0),
                                 start_heading=0.0, goal_position=(3.0, 2.0),
                                 geodesic_distance=2.0)])
    env = gym.make("PointNav-v0", episodes=str(path), depth_size=8).unwrapped
    obs, info = env.reset(seed=0)
    shortest = float(info["distance_to_goal"])
    walked, pos, plan, actions = 0.0, env.agent_position, [], 0
    while True:
        d, angle = obs["pointgoal_with_gps_compass"]
        if plan:
            action = plan.pop(0)
        elif actions == 0 and abs(angle) > np.deg2rad(6):
            action = spec.Action.TURN_LEFT if angle > 0 else spec.Action.TURN_RIGHT
        elif actions == 0:
            actions, plan = 1, [spec.Action.TURN_LEFT] * 9 + [spec.Action.MOVE_FORWARD] * 4
            continue
        elif d < 0.15:
            break
        elif abs(angle) > np.deg2rad(6):
            action = spec.Action.TURN_LEFT if angle > 0 else spec.Action.TURN_RIGHT
        else:
            action = spec.Action.MOVE_FORWARD
        obs, _, _, _, info = env.step(action)
        step = float(np.linalg.norm(env.agent_position - pos))
        assert step in (0.0, pytest.approx(spec.FORWARD_STEP_M, abs=1e-9))  # no sliding
        walked, pos = walked + step, env.agent_position
    _, _, terminated, _, info = env.step(spec.Action.STOP)
    assert terminated and info["success"]
    assert walked > 1.4 * shortest  # the detour counts
    assert info["spl"] == pytest.approx(shortest / max(shortest, walked), rel=1e-6)


def test_reward_is_slack_plus_geodesic_progress_plus_success_bonus():
    env = make_env("trivial", seed=4).unwrapped
    rng = np.random.default_rng(1)
    prev = env.geodesic_distance(env.agent_position, env.goal_position)
    for _ in range(60):
        _, reward, _, _, info = env.step(int(rng.choice([1, 2, 3])))
        expected = -0.01 + (prev - info["distance_to_goal"]) + 2.5 * info["success"]
        assert reward == pytest.approx(expected, abs=1e-5)
        prev = info["distance_to_goal"]
    assert prev == pytest.approx(env.geodesic_distance(env.agent_position, env.goal_position),
                                 abs=1e-5)


def test_depth_reads_the_planar_distance_to_a_wall_and_the_floor_and_ceiling(room):
    env = make_env(room, depth_size=64).unwrapped
    env.set_agent_state((2.0, 2.0), 0.0)  # facing the wall whose face is at y = 0.1
    depth = env._sim.observe()["depth"][0, :, :, 0]
    # A flat wall square to the view has the same planar depth in every column.
    np.testing.assert_allclose(depth[31:33, :], 1.9 / 10.0, atol=1e-5)
    focal = 32.0  # 90 degree field of view over 64 pixels
    floor = spec.CAMERA_HEIGHT_M / ((63.5 - 32.0) / focal) / 10.0
    ceiling = (spec.CEILING_HEIGHT_M - spec.CAMERA_HEIGHT_M) / ((32.0 - 0.5) / focal) / 10.0
    assert depth[63, 10] == pytest.approx(floor, abs=1e-6)
    assert depth[0, 40] == pytest.approx(ceiling, abs=1e-6)


def test_depth_sees_an_obstacle_in_front_of_the_far_wall(tmp_path):
    # A 0.5 m block whose near face is at y = 1.0 m, straight ahead of an agent at y = 2.5.
    png = room_png(tmp_path / "block.png", inner_wall=(10, 20, 35, 45))
    env = make_env(png, depth_size=32).unwrapped
    env.set_agent_state((2.0, 2.5), 0.0)
    depth = env._sim.observe()["depth"][0, 16, :, 0]
    assert depth[15] == pytest.approx(0.15, abs=1e-5)   # the block: 2.5 - 1.0 m
    # Column 8 looks 25 deg left: it passes the block and meets the far wall (2.5 - 0.1 m).
    assert depth[8] == pytest.approx(0.24, abs=1e-5)
    # Column 0 looks 44 deg left and meets the side wall at x = 0.1 first: 1.9 m / tan(44 deg).
    assert depth[0] == pytest.approx(1.9 / (15.5 / 16.0) / 10.0, abs=1e-5)


def test_pointgoal_sensor_gives_distance_and_left_positive_angle(room):
    env = make_env(room).unwrapped
    goal = env.goal_position
    env.set_agent_state(goal + np.array([0.0, 1.0]), 0.0)  # goal 1 m straight ahead (-y)
    d, angle = env._sim.observe()["pointgoal_with_gps_compass"][0]
    assert d == pytest.approx(1.0, abs=1e-6) and angle == pytest.approx(0.0, abs=1e-6)
    env.set_agent_state(goal + np.array([0.0, 1.0]), -np.pi / 2)  # now facing +x: goal on the left
    d, angle = env._sim.observe()["pointgoal_with_gps_compass"][0]
    assert angle == pytest.approx(np.pi / 2, abs=1e-6)


def test_geodesic_distance_is_euclidean_in_open_space_and_longer_around_a_wall(tmp_path):
    png = room_png(tmp_path / "wall.png", width_m=6.0, height_m=6.0,
                   inner_wall=(58, 62, 0, 100))  # a wall across y = 2.9-3.1, gap at x > 5 m
    env = make_env(png).unwrapped
    # 32 grid directions: within 1.3 % of the straight line at any angle.
    for end in [(4.0, 2.0), (4.0, 2.5), (2.0, 2.6), (5.0, 1.2), (1.3, 2.5)]:
        straight = np.hypot(end[0] - 1.0, end[1] - 1.0)
        assert straight <= env.geodesic_distance((1.0, 1.0), end) <= 1.013 * straight
    around = env.geodesic_distance((1.0, 2.0), (1.0, 4.0))
    assert around > 2 * 4.0  # must go around the end of the wall at x = 5 m
    assert env.geodesic_distance((1.0, 2.0), (1.0, 2.0)) == pytest.approx(0.0, abs=1e-6)


def test_png_maps_round_trip(tmp_path):
    grid = OccupancyGrid(np.random.default_rng(0).random((30, 40)) < 0.3, RES)
    save_occupancy_png(grid, tmp_path / "m.png")
    back = load_occupancy_png(tmp_path / "m.png", resolution=RES)
    np.testing.assert_array_equal(back.blocked, grid.blocked)


def test_same_seed_gives_the_same_episodes_and_observations():
    def rollout():
        env = gym.make("PointNav-v0", scenes="trivial")
        obs, _ = env.reset(seed=7)
        out = [obs["depth"].sum(), *obs["pointgoal_with_gps_compass"]]
        for a in [1, 1, 2, 1, 3, 1, 1, 0, 1, 2]:
            obs, r, term, trunc, info = env.step(a)
            out += [obs["depth"].sum(), *obs["pointgoal_with_gps_compass"], r, info["episode_id"]]
            if term or trunc:
                obs, _ = env.reset()
        return out

    assert rollout() == rollout()


def test_episode_files_round_trip_in_the_habitat_format(tmp_path):
    eps = [Episode(episode_id=str(i), scene_id="pointnav://trivial/val/0",
                   start_position=(1.0 + i, 2.0), start_heading=0.3 * i - 1.0,
                   goal_position=(2.5, 1.5 + i), geodesic_distance=1.7 + i) for i in range(3)]
    path = tmp_path / "eps.json.gz"
    save_episodes(path, eps)
    with gzip.open(path, "rt") as fh:
        raw = json.load(fh)["episodes"][1]
    assert raw["start_position"] == [2.0, 0.0, 2.0] and len(raw["start_rotation"]) == 4
    assert raw["goals"][0]["position"] == [2.5, 0.0, 2.5]
    assert raw["info"]["geodesic_distance"] == pytest.approx(2.7)
    back = load_episodes(path)
    assert [e.episode_id for e in back] == ["0", "1", "2"]
    for a, b in zip(eps, back):
        assert b.start_position == a.start_position and b.goal_position == a.goal_position
        assert b.start_heading == pytest.approx(a.start_heading, abs=1e-12)


def test_a_broken_episode_file_is_reported_with_what_is_wrong(tmp_path):
    bad = tmp_path / "bad.json.gz"
    with gzip.open(bad, "wt") as fh:
        json.dump({"episodes": [{"episode_id": "3", "scene_id": "x"}]}, fh)
    with pytest.raises(EpisodeFileError, match="bad.json.gz: episode '3' .*start_position"):
        load_episodes(bad)
    (tmp_path / "junk.json.gz").write_bytes(b"not gzip or json")
    with pytest.raises(EpisodeFileError, match="cannot read"):
        load_episodes(tmp_path / "junk.json.gz")
    with pytest.raises(EpisodeFileError, match="does not exist"):
        load_episodes(tmp_path / "missing.json.gz")


def test_unknown_scene_sets_and_bad_actions_are_rejected_with_help():
    with pytest.raises(ValueError, match="unknown scene set 'nope'.*default"):
        gym.make("PointNav-v0", scenes="nope")
    with pytest.raises(ValueError, match="no split 'test'"):
        gym.make("PointNav-v0", scenes="trivial", split="test")
    env = gym.make("PointNav-v0", scenes="trivial")
    env.reset(seed=0)
    for bad in (4, -1, 1.5):
        with pytest.raises(ValueError, match="MOVE_FORWARD"):
            env.step(bad)


def test_generated_scene_sets_are_reproducible_from_their_seed():
    from envs.pointnav.scenes import clear_scene_cache, load_scene

    first = load_scene("pointnav://trivial/train/1").grid.blocked.copy()
    clear_scene_cache()
    np.testing.assert_array_equal(load_scene("pointnav://trivial/train/1").grid.blocked, first)


def test_generated_floor_plans_have_walls_doors_and_one_connected_floor():
    from envs.pointnav.generator import generate_floor_plan
    from envs.pointnav.grid import largest_component, navigable_mask

    grid = generate_floor_plan(seed=5, width_m=8.0, height_m=6.0, max_rooms=4, clutter=0.05)
    assert grid.blocked.mean() > 0.1
    nav = navigable_mask(grid)
    # Doors connect every room: at most small pockets behind furniture are cut off.
    assert largest_component(nav).sum() > 0.9 * nav.sum()


def test_sampled_episodes_follow_the_habitat_rules_of_their_scene_set():
    from envs.pointnav.episodes import sample_episode
    from envs.pointnav.scenes import get_scene_set, load_scene

    sset = get_scene_set("default")
    rng = np.random.default_rng(0)
    for sid in sset.scene_ids("val")[:4]:
        scene = load_scene(sid)
        for _ in range(10):
            ep = sample_episode(scene, rng, episode_id="e", geodesic_range=sset.geodesic_range,
                                min_ratio=sset.min_ratio)
            assert scene.is_navigable(ep.start_position) and scene.is_navigable(ep.goal_position)
            geo = scene.geodesic_distance(ep.start_position, ep.goal_position)
            assert geo == pytest.approx(ep.geodesic_distance, abs=1e-5)
            assert 1.0 <= geo <= 6.0
            assert geo >= 1.1 * np.hypot(*np.subtract(ep.start_position, ep.goal_position))


def test_a_directory_of_png_maps_with_train_and_val_subdirectories_is_a_scene_set(tmp_path):
    for split in ("train", "val"):
        (tmp_path / split).mkdir()
        room_png(tmp_path / split / "a.png", width_m=3.0 + (split == "val"))
    env = make_env(str(tmp_path), split="val").unwrapped
    assert env.occupancy.shape == (80, 80)
    assert env.resolution == RES
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no PNG maps"):
        gym.make("PointNav-v0", scenes=str(tmp_path / "empty"))


def test_sensor_noise_is_off_by_default_and_perturbs_observations_when_asked(room):
    clean = make_env(room, seed=2, depth_size=16).unwrapped
    noisy = make_env(room, seed=2, depth_size=16, depth_noise_std=0.05,
                     pointgoal_noise_std=0.1).unwrapped
    a, b = clean._sim.observe(), noisy._sim.observe()
    np.testing.assert_array_equal(clean._sim.observe()["depth"], a["depth"])
    assert not np.allclose(a["depth"], b["depth"])
    assert 0.0 <= b["depth"].min() and b["depth"].max() <= 1.0
    assert not np.allclose(a["pointgoal_with_gps_compass"], b["pointgoal_with_gps_compass"])
    np.testing.assert_array_equal(clean.agent_position, noisy.agent_position)  # same episode


def test_render_draws_the_map_with_agent_and_goal(room):
    env = make_env(room)
    img = env.unwrapped.render()
    assert img.shape == (80, 80, 3) and img.dtype == np.uint8
    assert (img == (30, 60, 220)).all(axis=2).any() and (img == (0, 170, 0)).all(axis=2).any()


def _oracle_action(env):
    """Greedy shortest-path follower: STOP when close, else turn towards the heading whose
    0.25 m step lowers the geodesic distance most, and step forward once facing it."""
    pos, heading, goal = env.agent_position, env.agent_heading, env.goal_position
    if env.geodesic_distance(pos, goal) < 0.15:
        return spec.Action.STOP
    turns = np.arange(-18, 18)
    best_k = min(turns, key=lambda k: env.geodesic_distance(
        pos + 0.25 * np.array([-np.sin(heading + k * spec.TURN_ANGLE_RAD),
                               -np.cos(heading + k * spec.TURN_ANGLE_RAD)]), goal))
    if best_k == 0:
        return spec.Action.MOVE_FORWARD
    return spec.Action.TURN_LEFT if best_k > 0 else spec.Action.TURN_RIGHT


def test_an_agent_following_the_shortest_path_succeeds_with_high_spl_on_default_scenes():
    env = gym.make("PointNav-v0", scenes="default", split="val", depth_size=8)
    env.reset(seed=0)
    results = []
    for _ in range(4):
        for _ in range(200):
            _, _, terminated, truncated, info = env.step(_oracle_action(env.unwrapped))
            if terminated or truncated:
                break
        results.append((info["success"], info["spl"]))
        env.reset()
    assert all(success for success, _ in results)
    assert np.mean([s for _, s in results]) > 0.8
