"""The batched PointNav environment: gymnasium vector API, SAME_STEP autoreset and evaluation
episode files (the interface the trainer relies on; emulated heterogeneity is wagma_rl's,
tests/test_heterogeneity.py)."""

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs.pointnav import make_episodes as make_episodes_cli
from envs.pointnav.episodes import load_episodes


def test_make_vector_env_builds_the_embedded_simulator_with_batched_spaces():
    venv = envs.make_vector_env("pointnav", 3, scenes="trivial", depth_size=16)
    assert isinstance(venv, envs.PointNavVectorEnv)
    assert venv.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    obs, infos = venv.reset(seed=0)
    assert obs["depth"].shape == (3, 16, 16, 1) and obs["depth"].dtype == np.float32
    assert obs["pointgoal_with_gps_compass"].shape == (3, 2)
    assert obs["pointgoal_with_gps_compass"].dtype == np.float32
    assert 0.0 <= obs["depth"].min() and obs["depth"].max() <= 1.0
    assert venv.observation_space["depth"].shape == (3, 16, 16, 1)
    for key in ("distance_to_goal", "success", "spl", "episode_id"):
        assert len(infos[key]) == 3


@pytest.mark.parametrize("mode", ["vector_entry_point", None])
def test_gymnasium_make_vec_returns_the_batched_simulator(mode):
    venv = gym.make_vec("PointNav-v0", num_envs=3, vectorization_mode=mode, scenes="trivial",
                        seed=4, depth_size=16)
    assert isinstance(venv, envs.PointNavVectorEnv) and venv.num_envs == 3
    same = envs.make_vector_env("pointnav", 3, scenes="trivial", seed=4, depth_size=16)
    obs, _ = venv.reset()
    ref, _ = same.reset()
    actions = np.array([1, 2, 3])
    for _ in range(5):
        obs, rew, *_ = venv.step(actions)
        ref, ref_rew, *_ = same.step(actions)
    np.testing.assert_array_equal(obs["depth"], ref["depth"])
    np.testing.assert_array_equal(rew, ref_rew)


def test_the_single_env_declares_its_render_rate():
    env = gym.make("PointNav-v0", scenes="trivial", depth_size=16, render_mode="rgb_array")
    assert env.metadata["render_fps"] == 10
    env.reset(seed=0)
    assert env.render().ndim == 3


def test_an_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="unknown environment backend 'gym'"):
        envs.make_vector_env("gym", 2)


def test_the_vector_env_matches_single_envs_step_for_step():
    n, seed = 3, 5
    venv = envs.PointNavVectorEnv(n, scenes="trivial", seed=seed, depth_size=16)
    singles = [gym.make("PointNav-v0", scenes="trivial", seed=seed + i, depth_size=16)
               for i in range(n)]
    vobs, _ = venv.reset()
    for env in singles:
        env.reset()
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(120):
        actions = rng.choice(4, n, p=[0.1, 0.5, 0.2, 0.2])
        vobs, vrew, vterm, vtrunc, vinfo = venv.step(actions)
        for i, env in enumerate(singles):
            obs, rew, term, trunc, info = env.step(int(actions[i]))
            assert (rew, term, trunc) == (pytest.approx(vrew[i]), vterm[i], vtrunc[i])
            for key in ("distance_to_goal", "success", "spl", "episode_id"):
                assert info[key] == pytest.approx(vinfo[key][i]) if key != "episode_id" \
                    else info[key] == vinfo[key][i]
            if term or trunc:
                obs, _ = env.reset()
                ended += 1
            np.testing.assert_array_equal(obs["depth"], vobs["depth"][i])
            np.testing.assert_array_equal(obs["pointgoal_with_gps_compass"],
                                          vobs["pointgoal_with_gps_compass"][i])
    assert ended >= 5  # the comparison covered auto-resets


def test_a_finished_env_returns_the_next_episodes_first_observation_and_the_ended_metrics():
    venv = envs.PointNavVectorEnv(2, scenes="trivial", seed=1, depth_size=8)
    _, infos = venv.reset()
    first_ids = list(infos["episode_id"])
    obs, _, terminated, truncated, infos = venv.step(np.array([0, 2]))
    assert terminated.tolist() == [True, False] and not truncated.any()
    assert infos["episode_id"][0] == first_ids[0]          # metrics of the ended episode
    assert infos["spl"][0] == 0.0 and not infos["success"][0]
    sim = venv.sim
    assert sim.episode[0].episode_id != first_ids[0]        # env 0 already runs the next one
    assert sim.steps[0] == 0
    from envs.pointnav.spec import pointgoal_polar

    np.testing.assert_allclose(obs["pointgoal_with_gps_compass"][0],
                               pointgoal_polar(sim.pos[0], sim.heading[0], sim.goal[0]),
                               atol=1e-6)


def test_truncation_at_max_episode_steps_auto_resets():
    venv = envs.PointNavVectorEnv(2, scenes="trivial", seed=0, depth_size=8, max_episode_steps=4)
    venv.reset()
    flags = [venv.step(np.array([2, 3]))[3].tolist() for _ in range(5)]
    assert flags == [[False, False]] * 3 + [[True, True], [False, False]]


def test_wrong_actions_are_rejected_with_the_action_meanings():
    venv = envs.PointNavVectorEnv(2, scenes="trivial", depth_size=8)
    venv.reset()
    with pytest.raises(ValueError, match="2 integers .*STOP"):
        venv.step(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"in \[0, 4\)"):
        venv.step(np.array([1, 7]))


@pytest.fixture(scope="module")
def episode_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("eps") / "trivial_val.json.gz"
    make_episodes_cli.main(["--scenes", "trivial", "--split", "val", "--count", "7",
                            "--seed", "3", "--out", str(path)])
    return str(path)


def test_make_episodes_writes_a_reproducible_habitat_file_following_the_set_rules(episode_file,
                                                                                   tmp_path):
    eps = load_episodes(episode_file)
    assert [e.episode_id for e in eps] == [str(i) for i in range(7)]
    assert {e.scene_id for e in eps} == {"pointnav://trivial/val/0", "pointnav://trivial/val/1"}
    assert all(1.0 <= e.geodesic_distance <= 2.5 for e in eps)
    again = make_episodes_cli.make_episodes(scenes="trivial", split="val", count=7, seed=3)
    assert [(e.start_position, e.goal_position) for e in again] == \
        [(e.start_position, e.goal_position) for e in eps]


def _run_file(venv, max_steps=4000):
    """Step with a STOP-happy random policy; return the counted ended episode ids in order."""
    rng = np.random.default_rng(0)
    seen = []
    for _ in range(max_steps):
        _, _, term, trunc, infos = venv.step(rng.choice(4, venv.num_envs, p=[0.2, 0.4, 0.2, 0.2]))
        for i in np.flatnonzero((term | trunc) & infos["counted"]):
            seen.append(infos["episode_id"][i])
        if venv.exhausted:
            break
    return seen


def test_an_episode_file_runs_each_episode_exactly_once_across_envs(episode_file):
    venv = envs.PointNavVectorEnv(3, episodes=episode_file, repeat_episodes=False, depth_size=8)
    _, infos = venv.reset()
    assert list(infos["episode_id"]) == ["0", "1", "2"]  # dealt in file order
    seen = _run_file(venv)
    assert venv.exhausted
    assert sorted(seen, key=int) == [str(i) for i in range(7)]


def test_an_episode_file_repeats_by_default(episode_file):
    venv = envs.PointNavVectorEnv(2, episodes=episode_file, depth_size=8)
    venv.reset()
    seen = _run_file(venv, max_steps=300)
    assert len(seen) > 7 and set(seen) == {str(i) for i in range(7)} and not venv.exhausted


def test_shards_split_an_episode_file_between_workers(episode_file):
    shards = [envs.PointNavVectorEnv(1, episodes=episode_file, shard_index=k, num_shards=2,
                                     depth_size=8) for k in range(2)]
    assert [s.num_file_episodes for s in shards] == [4, 3]


def test_episode_starts_are_placed_exactly_as_in_the_file(episode_file):
    venv = envs.PointNavVectorEnv(1, episodes=episode_file, depth_size=8)
    venv.reset()
    ep = load_episodes(episode_file)[0]
    np.testing.assert_allclose(venv.sim.pos[0], ep.start_position)
    np.testing.assert_allclose(venv.sim.goal[0], ep.goal_position)
    assert venv.sim.shortest[0] == pytest.approx(ep.geodesic_distance, abs=1e-5)


def test_reset_with_a_seed_repeats_episodes_and_without_one_continues():
    venv = envs.PointNavVectorEnv(2, scenes="trivial", seed=4, depth_size=8)
    first = list(venv.reset()[1]["episode_id"]), venv.sim.pos.copy()
    second = list(venv.reset()[1]["episode_id"])
    again = list(venv.reset(seed=4)[1]["episode_id"]), venv.sim.pos.copy()
    assert second != first[0]
    assert again[0] == first[0]
    np.testing.assert_array_equal(again[1], first[1])


def test_unknown_options_are_named_in_the_error():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['scene'\].*'scenes'"):
        envs.PointNavVectorEnv(1, scene="trivial")
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['fov'\]"):
        gym.make("PointNav-v0", fov=70)


def test_episode_rules_can_be_overridden_for_a_curriculum():
    venv = envs.PointNavVectorEnv(4, scenes="default", geodesic_range=(1.0, 2.0), min_ratio=1.0,
                                  depth_size=8)
    venv.reset()
    assert all(1.0 <= venv.sim.shortest[i] <= 2.0 + 1e-6 for i in range(4))
    with pytest.raises(ValueError, match="geodesic_range"):
        envs.PointNavVectorEnv(1, scenes="trivial", geodesic_range=(3.0, 1.0))


def test_an_episode_file_that_does_not_fit_its_scenes_is_rejected_with_the_reason(tmp_path):
    from envs.pointnav.episodes import Episode, save_episodes

    def write(name, **fields):
        ep = dict(episode_id="e1", scene_id="pointnav://trivial/val/0", start_position=(1.5, 1.5),
                  start_heading=0.0, goal_position=(2.0, 2.0), geodesic_distance=1.0)
        ep.update(fields)
        path = tmp_path / name
        save_episodes(path, [Episode(**ep)])
        return str(path)

    with pytest.raises(ValueError, match="unknown scene set 'nowhere'"):
        envs.PointNavVectorEnv(1, episodes=write("a.json.gz", scene_id="pointnav://nowhere/val/0"),
                               depth_size=8)  # at construction, before any scene loads
    with pytest.raises(ValueError, match="does not exist: split 'val' of 'trivial' has 2"):
        envs.PointNavVectorEnv(1, episodes=write("c.json.gz", scene_id="pointnav://trivial/val/9"),
                               depth_size=8)
    with pytest.raises(ValueError, match="'e1': start .* is not navigable"):
        envs.PointNavVectorEnv(1, episodes=write("b.json.gz", start_position=(0.02, 0.02)),
                               depth_size=8).reset()
