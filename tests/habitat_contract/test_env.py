"""The adapter on habitat's real Env, RLEnv (RLTaskEnv) and gym wrappers (HabGymWrapper,
GymHabitatEnv), with only the simulator stood in: the same episodes and actions give the same
observations, rewards, terminated/truncated flags and metrics as the embedded simulator.

The stand-in simulator renders with the embedded ray caster and measures with its distance
fields, so what is compared is everything habitat-lab does on top: sensor post-processing
(depth clipping and normalisation, pointgoal_with_gps_compass from quaternions), the reward
(distance_to_goal_reward + slack + success), success and SPL, the episode iterator and step
limit, and the adapter's translation of all that.
"""

import numpy as np
import pytest

import envs
from envs.pointnav.spec import SUCCESS_DISTANCE_M, TURN_ANGLE_RAD, Action

SIZE = 16
IN_FILE_ORDER = ["habitat.environment.iterator_options.group_by_scene=False"]


def _pair(exported, max_steps):
    emb = envs.make_eval_env("pointnav", 1, split="val", episodes=exported["embedded"]["val"],
                             depth_size=SIZE, max_episode_steps=max_steps, seed=0)
    hab = envs.make_eval_env("habitat", 1, split="val", episodes=exported["data_path"],
                             scenes_dir=exported["scenes_dir"], depth_size=SIZE,
                             max_episode_steps=max_steps, seed=0, overrides=IN_FILE_ORDER)
    assert emb.episode_ids == hab.episode_ids
    return emb.env, hab.env


def _toward_goal(obs):
    """Turn toward the goal, walk to it, stop within the success distance."""
    dist, angle = obs["pointgoal_with_gps_compass"][0]
    if dist < SUCCESS_DISTANCE_M - 0.05:
        return Action.STOP
    if abs(angle) > TURN_ANGLE_RAD / 2:
        return Action.TURN_LEFT if angle > 0 else Action.TURN_RIGHT
    return Action.MOVE_FORWARD


def _assert_same_obs(a, b):
    assert set(a) == set(b) == {"depth", "pointgoal_with_gps_compass"}
    assert a["depth"].dtype == b["depth"].dtype == np.float32
    assert a["depth"].shape == b["depth"].shape == (1, SIZE, SIZE, 1)
    np.testing.assert_allclose(b["depth"], a["depth"], atol=1e-6)
    np.testing.assert_allclose(b["pointgoal_with_gps_compass"], a["pointgoal_with_gps_compass"],
                               atol=1e-4)


def _run(exported, policy, max_steps, episodes):
    emb, hab = _pair(exported, max_steps)
    obs_e, info_e = emb.reset(seed=0)
    obs_h, info_h = hab.reset(seed=0)
    _assert_same_obs(obs_e, obs_h)
    np.testing.assert_allclose(info_h["distance_to_goal"], info_e["distance_to_goal"], atol=1e-4)
    ended = []
    while len(ended) < episodes:
        action = np.array([policy(obs_e)])
        obs_e, r_e, term_e, trunc_e, info_e = emb.step(action)
        obs_h, r_h, term_h, trunc_h, info_h = hab.step(action)
        if term_e[0] or trunc_e[0]:
            ended.append((info_e["episode_id"][0], bool(term_e[0]), bool(info_e["success"][0]),
                          float(info_e["spl"][0])))
        if len(ended) < episodes:
            # (Past the set both replay an uncounted episode: the embedded simulator its last,
            # habitat's iterator its first; those need not agree.)
            _assert_same_obs(obs_e, obs_h)
        np.testing.assert_allclose(r_h, r_e, atol=1e-4)
        assert (term_h[0], trunc_h[0]) == (term_e[0], trunc_e[0])
        for key in ("distance_to_goal", "spl"):
            np.testing.assert_allclose(info_h[key], info_e[key], atol=1e-4)
        for key in ("success", "episode_id", "elapsed_steps", "counted"):
            assert info_h[key][0] == info_e[key][0], key
    emb.close()
    hab.close()
    return ended


def test_walking_to_the_goal_and_stopping_gives_the_same_episode_in_both(exported):
    ended = _run(exported, _toward_goal, max_steps=200, episodes=3)
    assert [e[0] for e in ended] == ["val-0", "val-1", "val-2"]
    assert all(term and success and spl > 0.5 for _, term, success, spl in ended), ended


def test_the_step_limit_ends_episodes_as_truncated_in_both(exported):
    ended = _run(exported, lambda obs: Action.TURN_LEFT, max_steps=7, episodes=3)
    assert ended == [("val-0", False, False, 0.0), ("val-1", False, False, 0.0),
                     ("val-2", False, False, 0.0)]


def test_stopping_away_from_the_goal_terminates_without_success_in_both(exported):
    ended = _run(exported, lambda obs: Action.STOP, max_steps=50, episodes=3)
    assert [(term, success) for _, term, success, _ in ended] == [(True, False)] * 3


def test_an_env_past_its_share_of_the_set_replays_uncounted(exported):
    hab = envs.make_eval_env("habitat", 2, split="val", episodes=exported["data_path"],
                             scenes_dir=exported["scenes_dir"], depth_size=SIZE,
                             max_episode_steps=5, seed=0, workers="process", timeout=120)
    assert hab.env.num_envs == 2 and hab.episode_ids == ["val-0", "val-1", "val-2"]
    assert len(set(hab.env.pids)) == 2  # one simulator per process
    hab.env.reset(seed=0)
    seen = []
    for _ in range(3 * 5):
        _, _, term, trunc, info = hab.env.step(np.array([2, 2]))
        seen += [(str(i), bool(c)) for i, c, d in zip(info["episode_id"], info["counted"],
                                                      term | trunc) if d]
    hab.env.close()
    counted = sorted(i for i, c in seen if c)
    assert counted == ["val-0", "val-1", "val-2"]      # each episode of the set once
    assert len(seen) == 6 and sum(not c for _, c in seen) == 3


def test_the_stand_in_runs_one_open_simulator_per_process(exported):
    def one():
        return envs.make_eval_env("habitat", 1, split="val", episodes=exported["data_path"],
                                  scenes_dir=exported["scenes_dir"], depth_size=SIZE).env

    first = one()
    with pytest.raises(RuntimeError, match="second Simulator in this process"):
        one()
    first.close()
    one().close()  # closing the first frees the process for another


def test_several_simulators_in_one_process_are_refused_with_the_fix():
    from envs.habitat.vector_env import HabitatVectorEnv

    with pytest.raises(ValueError, match="one simulator per process.*workers='process'"):
        HabitatVectorEnv(2, env_fn=lambda i: pytest.fail("no env may be built"))


def _episodes_per_env(venv, steps):
    """The episode ids each env of ``venv`` ran in ``steps`` steps of STOP."""
    _, info = venv.reset(seed=0)
    seen = [{str(e)} for e in info["episode_id"]]
    for _ in range(steps):
        _, _, _, _, info = venv.step(np.full(venv.num_envs, Action.STOP))
        for i, e in enumerate(info["episode_id"]):
            seen[i].add(str(e))
    return seen


def test_training_envs_in_worker_processes_deal_the_scenes_within_their_rank(exported):
    # 4 train scenes, one episode each (train-k in scene train_k); rank 1 of 2, 2 envs each:
    # habitat-baselines' rule, the rank's seeded shuffle of all 4 dealt over its 2 envs.
    from envs.habitat.placement import scene_split

    venv = envs.make_vector_env("habitat", 2, workers="process", timeout=120, split="train",
                                episodes=exported["data_path"],
                                scenes_dir=exported["scenes_dir"], depth_size=SIZE,
                                max_episode_steps=5, seed=3, shard_index=1, num_shards=2,
                                gpu_device_id=[0, 1])
    scenes = [f"train_{k}" for k in range(4)]
    want = [{f"train-{s[-1]}" for s in scene_split(scenes, i, 2, rank=1, world_size=2, seed=3)}
            for i in range(2)]
    with venv:
        assert len(set(venv.pids)) == 2
        assert _episodes_per_env(venv, 8) == want
    assert sorted(want[0] | want[1]) == ["train-0", "train-1", "train-2", "train-3"]


def test_one_env_under_the_global_deal_takes_its_share_of_the_jobs_scenes_and_its_gpu(exported):
    from envs.habitat import HabitatVectorEnv

    venv = HabitatVectorEnv(1, split="train", episodes=exported["data_path"],
                            scenes_dir=exported["scenes_dir"], depth_size=SIZE,
                            max_episode_steps=5, shard_index=0, num_shards=2, gpu_device_id=3,
                            scene_split="global")
    sim = venv.envs[0].habitat_env.habitat_env.sim
    assert sim.habitat_config.habitat_sim_v0.gpu_device_id == 3
    assert sim.config.sim_cfg.gpu_device_id == 3
    assert _episodes_per_env(venv, 8) == [{"train-0", "train-2"}]
    venv.close()


RGB_CAMERA = ("+habitat/simulator/sim_sensors@habitat.simulator.agents.main_agent.sim_sensors."
              "rgb_sensor=rgb_sensor")


def test_a_camera_the_policy_does_not_read_is_refused_naming_it(exported):
    # habitat's benchmark configs render an RGB camera too: rendered every step, never read.
    with pytest.raises(ValueError, match=r"rgb_sensor.*depth \+ pointgoal_with_gps_compass only"):
        envs.make_eval_env("habitat", 1, split="val", episodes=exported["data_path"],
                           scenes_dir=exported["scenes_dir"], depth_size=SIZE,
                           max_episode_steps=50, seed=0, overrides=[RGB_CAMERA])


def test_spl_after_a_detour_is_the_shortest_path_over_the_path_walked_in_both(exported):
    # SPL = success * d_shortest / max(d_shortest, path length), d_shortest the start's geodesic
    # distance to the goal and the path length what the agent walked (positions from the
    # embedded simulator, which the habitat run follows step for step).
    emb, hab = _pair(exported, 300)
    obs, info_e = emb.reset(seed=0)
    _, info_h = hab.reset(seed=0)
    shortest_e = float(info_e["distance_to_goal"][0])
    shortest_h = float(info_h["distance_to_goal"][0])
    detour = [Action.TURN_LEFT] * 18 + [Action.MOVE_FORWARD] * 4  # turn round, walk away
    walked, pos = 0.0, emb.sim.pos[0].copy()
    for step in range(300):
        action = detour[step] if step < len(detour) else _toward_goal(obs)
        obs, _, term, trunc, info_e = emb.step(np.array([action]))
        _, _, _, _, info_h = hab.step(np.array([action]))
        if term[0] or trunc[0]:  # (the next episode has started: its start is not walked)
            break
        walked += float(np.linalg.norm(emb.sim.pos[0] - pos))
        pos = emb.sim.pos[0].copy()
    emb.close()
    hab.close()
    assert term[0] and info_e["success"][0] and info_h["success"][0]
    assert walked > 1.2 * shortest_e  # the detour counts
    np.testing.assert_allclose(info_e["spl"][0], shortest_e / max(shortest_e, walked), rtol=1e-5)
    np.testing.assert_allclose(info_h["spl"][0], shortest_h / max(shortest_h, walked), rtol=1e-4)


def test_the_evaluation_env_renders_on_the_gpu_it_is_given(exported):
    hab = envs.make_eval_env("habitat", 1, split="val", episodes=exported["data_path"],
                             scenes_dir=exported["scenes_dir"], depth_size=SIZE,
                             max_episode_steps=5, gpu_device_id=2)
    sim = hab.env.envs[0].habitat_env.habitat_env.sim
    assert sim.habitat_config.habitat_sim_v0.gpu_device_id == 2
    assert sim.config.sim_cfg.gpu_device_id == 2
    hab.env.close()


MORE_MEASURES = ["+habitat/task/measurements@habitat.task.measurements.soft_spl=soft_spl",
                 "+habitat/task/measurements@habitat.task.measurements.collisions=collisions"]


def test_habitats_other_measures_reach_the_infos_flattened(exported):
    hab = envs.make_eval_env("habitat", 1, split="val", episodes=exported["data_path"],
                             scenes_dir=exported["scenes_dir"], depth_size=SIZE,
                             max_episode_steps=5, overrides=MORE_MEASURES)
    _, start = hab.env.reset(seed=0)
    from wagma_rl.rl.metrics import measure_names

    assert {"soft_spl", "collisions.count"} <= set(measure_names(start))  # known from a reset
    infos = hab.env.step(np.array([Action.MOVE_FORWARD]))[4]
    assert 0.0 <= infos["soft_spl"][0] <= 1.0
    assert infos["collisions.count"][0] in (0.0, 1.0)
    assert {"distance_to_goal_reward", "collisions.is_collision"} <= set(infos)
    hab.env.close()


def test_an_rgb_camera_asked_for_renders_what_the_embedded_one_does(exported):
    both = dict(split="val", depth_size=SIZE, max_episode_steps=20, seed=0,
                sensors=["depth", "rgb"])
    emb = envs.make_eval_env("pointnav", 1, episodes=exported["embedded"]["val"], **both).env
    hab = envs.make_eval_env("habitat", 1, episodes=exported["data_path"],
                             scenes_dir=exported["scenes_dir"], overrides=IN_FILE_ORDER,
                             **both).env
    assert hab.single_observation_space == emb.single_observation_space
    obs_e, _ = emb.reset(seed=0)
    obs_h, _ = hab.reset(seed=0)
    for action in [Action.TURN_LEFT] * 9 + [Action.MOVE_FORWARD] * 2:
        assert obs_h["rgb"].dtype == np.uint8 and obs_h["rgb"].shape == (1, SIZE, SIZE, 3)
        # (a pixel exactly at a wall corner may take either face's shade)
        assert (obs_h["rgb"] == obs_e["rgb"]).all(axis=-1).mean() > 0.98
        obs_e = emb.step(np.array([action]))[0]
        obs_h = hab.step(np.array([action]))[0]
    emb.close()
    hab.close()
