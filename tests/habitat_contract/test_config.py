"""The adapter's config and overrides, composed by habitat-lab's own ``habitat.get_config``."""

import habitat
import pytest
from hydra.errors import OverrideParseException

from envs.habitat.loader import DEFAULT_CONFIG, make_habitat_config, override
from envs.habitat.vector_env import config_overrides
from envs.pointnav import spec

AWKWARD = "/data/my runs,v2/it's {split}\\/{split}.json.gz"


def test_the_default_config_renders_only_the_depth_camera_the_policy_reads():
    cfg = make_habitat_config(DEFAULT_CONFIG, overrides=config_overrides(depth_size=32))
    agent = cfg.habitat.simulator.agents.main_agent
    assert list(agent.sim_sensors) == ["depth_sensor"]
    depth = agent.sim_sensors.depth_sensor
    assert (depth.width, depth.height, depth.hfov) == (32, 32, spec.HFOV_DEG)
    assert list(depth.position) == [0.0, spec.CAMERA_HEIGHT_M, 0.0]
    assert depth.normalize_depth and (depth.min_depth, depth.max_depth) == (0.0, spec.MAX_DEPTH_M)
    assert agent.radius == spec.AGENT_RADIUS_M


def test_the_default_config_is_the_embedded_simulators_pointnav_task():
    h = make_habitat_config().habitat
    assert list(h.task.actions) == ["stop", "move_forward", "turn_left", "turn_right"]
    assert list(h.task.lab_sensors) == ["pointgoal_with_gps_compass_sensor"]
    assert {"distance_to_goal", "success", "spl"} <= set(h.task.measurements)
    assert h.simulator.forward_step_size == spec.FORWARD_STEP_M
    assert h.simulator.turn_angle == 10
    assert h.task.measurements.success.success_distance == spec.SUCCESS_DISTANCE_M
    assert (h.task.slack_reward, h.task.success_reward) == (spec.SLACK_REWARD, spec.SUCCESS_REWARD)
    assert h.environment.max_episode_steps == spec.MAX_EPISODE_STEPS


def test_common_options_become_habitat_settings():
    h = make_habitat_config(overrides=config_overrides(
        split="val", max_episode_steps=77, episodes=AWKWARD, scenes_dir="/s d/{x}",
        shuffle=False)).habitat
    assert (h.dataset.split, h.environment.max_episode_steps) == ("val", 77)
    assert h.dataset.data_path == AWKWARD
    assert h.dataset.scenes_dir == "/s d/{x}"
    assert h.environment.iterator_options.shuffle is False


@pytest.mark.parametrize("value", [AWKWARD, "a=b", "plain", "back\\slash\\", "${oc.env:HOME}",
                                   "quote'at'end'"])
def test_quoted_values_reach_the_config_unchanged(value):
    cfg = habitat.get_config(DEFAULT_CONFIG, overrides=[override("habitat.dataset.data_path",
                                                                 value)])
    assert cfg.habitat.dataset.data_path == value


def test_an_unquoted_path_with_braces_and_a_comma_is_what_habitat_rejects():
    # The adapter used to pass data_path unquoted; this is the failure quoting avoids.
    with pytest.raises(OverrideParseException):
        habitat.get_config(DEFAULT_CONFIG, overrides=[f"habitat.dataset.data_path={AWKWARD}"])


def test_another_habitat_lab_release_is_refused_in_one_line_naming_it(monkeypatch):
    import habitat

    from envs.habitat.loader import require_habitat

    monkeypatch.setattr(habitat, "__version__", "0.3.2")
    with pytest.raises(ImportError) as err:
        require_habitat()
    assert str(err.value).startswith("habitat-lab 0.3.2 installed; the habitat backend supports "
                                     "habitat-lab and habitat-sim 0.3.3 only")
    assert "\n" not in str(err.value)
