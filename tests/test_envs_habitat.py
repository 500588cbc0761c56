"""The Habitat adapter's translation, driven by a small fake of habitat-lab's gym environment.

These tests cover ONLY the adapter's translation (observation keys and dtypes, gymnasium's
terminated/truncated derived from the step count, info metrics, auto-reset, the vector API)
and the error raised when habitat is not installed. They do not run habitat-sim: the fake
implements just the documented interface of ``habitat.gym.make_gym_from_config``'s
``HabGymWrapper`` (habitat-lab 0.3): ``reset() -> obs``, ``step(int) -> (obs, reward, done,
info)``, ``observation_space``, ``action_space``, ``current_episode()``. The adapter on
habitat-lab's real environment, config and dataset code is tested in tests/habitat_contract/.
"""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs.habitat import HABITAT_LAB_VERSION, INSTALL_HELP, HabitatEnv, HabitatVectorEnv

REPO = pathlib.Path(__file__).resolve().parents[1]

HAVE_HABITAT = (importlib.util.find_spec("habitat") is not None
                and importlib.util.find_spec("habitat_sim") is not None)


class FakeHabGymEnv:
    """A corridor episode: MOVE_FORWARD brings the agent 0.25 m closer to a goal 1 m away;
    STOP or the step limit end it (``done`` only, like habitat). Metrics like habitat's."""

    def __init__(self, *, max_steps=6, size=8, depth_high=1.0, extra=()):
        self.observation_space = SimpleNamespace(spaces={
            "depth": gym.spaces.Box(0.0, depth_high, (size, size, 1), dtype=np.float32),
            "pointgoal_with_gps_compass": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            **{k: gym.spaces.Box(0, 255, (size, size, 3), dtype=np.uint8) for k in extra},
        })
        self.extra = extra
        self.action_space = gym.spaces.Discrete(4)
        self.max_steps, self.size = max_steps, size
        self.episodes = 0
        self.seeds = []

    def seed(self, seed):
        self.seeds.append(seed)

    def current_episode(self):
        return SimpleNamespace(episode_id=f"ep{self.episodes}")

    def _obs(self):
        return {"depth": np.full((self.size, self.size, 1), self.dist / 10.0, np.float64),
                "pointgoal_with_gps_compass": np.array([self.dist, 0.0]),
                **{k: np.zeros((self.size, self.size, 3), np.uint8) for k in self.extra}}

    def reset(self):
        self.episodes += 1
        self.dist, self.steps, self.path = 1.0, 0, 0.0
        return self._obs()

    def step(self, action):
        self.steps += 1
        prev = self.dist
        if action == 1:
            self.dist = max(self.dist - 0.25, 0.0)
            self.path += 0.25
        stop = action == 0
        success = float(stop and self.dist < 0.2)
        done = stop or self.steps >= self.max_steps
        info = {"distance_to_goal": self.dist, "success": success,
                "spl": success * 1.0 / max(1.0, self.path), "top_down_map": None,
                "soft_spl": 1.0 - self.dist, "collisions": {"count": self.steps,
                                                            "is_collision": action == 2}}
        reward = -0.01 + prev - self.dist + 2.5 * success
        return self._obs(), reward, done, info


def fake_vector(n=2, **kwargs):
    return HabitatVectorEnv(n, env_fn=lambda i: (FakeHabGymEnv(), 6), **kwargs)


def test_observations_are_translated_to_the_embedded_simulators_keys_and_dtypes():
    env = HabitatEnv(FakeHabGymEnv(), max_episode_steps=6)
    obs, info = env.reset()
    assert set(obs) == {"depth", "pointgoal_with_gps_compass"}
    assert obs["depth"].dtype == np.float32 and obs["depth"].shape == (8, 8, 1)
    assert obs["pointgoal_with_gps_compass"].dtype == np.float32
    assert env.observation_space == envs.PointNavVectorEnv(1, scenes="trivial",
                                                           depth_size=8).single_observation_space
    assert info["episode_id"] == "ep1"


def test_stop_ends_an_episode_as_terminated_with_habitats_metrics():
    env = HabitatEnv(FakeHabGymEnv(), max_episode_steps=6)
    env.reset()
    for _ in range(4):
        env.step(1)
    _, reward, terminated, truncated, info = env.step(0)
    assert terminated and not truncated
    assert info["success"] is True and info["spl"] == pytest.approx(1.0)
    assert info["distance_to_goal"] == pytest.approx(0.0)
    assert reward == pytest.approx(-0.01 + 2.5)
    assert "top_down_map" not in info


def test_the_step_limit_is_reported_as_truncation_not_termination():
    env = HabitatEnv(FakeHabGymEnv(max_steps=3), max_episode_steps=3)
    env.reset()
    flags = [env.step(2)[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]


def test_stop_on_the_last_allowed_step_is_still_termination():
    env = HabitatEnv(FakeHabGymEnv(max_steps=2), max_episode_steps=2)
    env.reset()
    env.step(2)
    assert env.step(0)[2:4] == (True, False)


def test_stepping_a_finished_episode_or_a_bad_action_is_an_error():
    env = HabitatEnv(FakeHabGymEnv(), max_episode_steps=6)
    env.reset()
    with pytest.raises(ValueError, match="MOVE_FORWARD"):
        env.step(5)
    env.step(0)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(1)


def test_a_config_without_normalised_depth_is_rejected_with_the_fix():
    with pytest.raises(ValueError, match="normalize_depth=True"):
        HabitatEnv(FakeHabGymEnv(depth_high=10.0), max_episode_steps=6)


def test_an_observation_the_policy_does_not_read_is_refused_naming_it():
    # An RGB camera would be rendered every step and dropped: refused instead.
    with pytest.raises(ValueError, match=r"'rgb'.*depth \+ pointgoal_with_gps_compass only"):
        HabitatEnv(FakeHabGymEnv(extra=("rgb",)), max_episode_steps=6)


def test_the_vector_env_auto_resets_in_the_same_step_with_the_ended_metrics():
    venv = fake_vector(2)
    assert venv.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    obs, infos = venv.reset(seed=3)
    assert obs["depth"].shape == (2, 8, 8, 1) and list(infos["episode_id"]) == ["ep1", "ep1"]
    assert [e.habitat_env.seeds for e in venv.envs] == [[3], [4]]
    for _ in range(4):
        venv.step(np.array([1, 2]))
    obs, _, terminated, truncated, infos = venv.step(np.array([0, 2]))
    assert terminated.tolist() == [True, False] and truncated.tolist() == [False, False]
    assert infos["success"].tolist() == [True, False] and infos["spl"][0] == pytest.approx(1.0)
    assert list(infos["episode_id"]) == ["ep1", "ep1"]           # the ended episode's id
    assert obs["pointgoal_with_gps_compass"][0, 0] == pytest.approx(1.0)  # next episode's start
    assert venv.envs[0].habitat_env.episodes == 2
    _, _, _, truncated, _ = venv.step(np.array([2, 2]))
    assert truncated.tolist() == [False, True]                   # env 1 hit 6 steps


def test_the_vector_env_checks_the_number_of_actions():
    venv = fake_vector(2)
    venv.reset()
    with pytest.raises(ValueError, match="2 integers"):
        venv.step(np.array([1, 1, 1]))


@pytest.mark.skipif(HAVE_HABITAT, reason="habitat is installed here")
def test_selecting_habitat_without_it_installed_fails_at_once_with_install_help():
    with pytest.raises(ImportError) as err:
        envs.make_vector_env("habitat", 2)
    msg = str(err.value)
    assert msg.endswith(INSTALL_HELP) and 'backend="pointnav" is the default' in msg


HABITAT_PYTHON = REPO / ".venv-habitat" / "bin" / "python"


def _installed_habitat_lab() -> dict:
    """habitat-lab's package metadata as pip installed it from PyPI into .venv-habitat."""
    code = ("import importlib.metadata as m, json; d = m.metadata('habitat-lab'); "
            "print(json.dumps({'version': d['Version'], 'requires_python': d['Requires-Python'], "
            "'classifiers': d.get_all('Classifier') or []}))")
    out = subprocess.run([str(HABITAT_PYTHON), "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return json.loads(out)


@pytest.mark.skipif(not HABITAT_PYTHON.exists(),
                    reason="no .venv-habitat (habitat-lab from PyPI): run `make install-habitat`")
def test_the_install_help_pins_the_habitat_lab_release_pypi_has():
    meta = _installed_habitat_lab()
    assert re.findall(r"pip install habitat-lab==(\S+)", INSTALL_HELP) == [meta["version"]]
    # habitat-lab's PyPI versions are the release and its date: 0.3.3 + 20250127.
    assert meta["version"].startswith(HABITAT_LAB_VERSION) and HABITAT_LAB_VERSION in \
        re.findall(r"habitat-sim\S* (?:v|==)?(\d+\.\d+\.\d+)", INSTALL_HELP)


@pytest.mark.skipif(not HABITAT_PYTHON.exists(),
                    reason="no .venv-habitat (habitat-lab from PyPI): run `make install-habitat`")
def test_the_install_help_names_a_python_both_this_project_and_habitat_lab_support():
    meta = _installed_habitat_lab()
    named = re.findall(r"with Python (3\.\d+)(?: or (3\.\d+))?", INSTALL_HELP)  # what to use
    named = [v for pair in named for v in pair if v]
    assert named, INSTALL_HELP
    floor = re.search(r'requires-python = ">=(3\.\d+)"', (REPO / "pyproject.toml").read_text())[1]
    listed = {c.rsplit(" :: ", 1)[1] for c in meta["classifiers"]
              if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    for version in named:
        assert tuple(map(int, version.split("."))) >= tuple(map(int, floor.split("."))), version
        assert version in listed, (version, listed)
    assert meta["requires_python"] is None or floor in meta["requires_python"]


def test_only_selecting_the_habitat_backend_imports_habitat():
    code = ("import sys, envs, envs.habitat, numpy as np; "
            "v = envs.make_vector_env('pointnav', 1, scenes='trivial', depth_size=8); v.reset(); "
            "v.step(np.array([1])); "
            "print('habitat' in sys.modules or 'habitat_sim' in sys.modules)")
    root = str(pathlib.Path(envs.__file__).parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert out.stdout.strip() == "False"


def test_a_shard_outside_the_shards_is_refused():
    with pytest.raises(ValueError, match=r"shard_index must be in \[0, num_shards\)"):
        HabitatVectorEnv(1, env_fn=lambda i: pytest.fail("no env"), shard_index=2, num_shards=2)


@pytest.mark.skipif(HAVE_HABITAT, reason="habitat is installed here")
def test_habitat_in_worker_processes_without_it_installed_fails_with_install_help():
    with pytest.raises(ImportError) as err:
        envs.make_vector_env("habitat", 2, workers="process", start_timeout=120)
    assert str(err.value).endswith(INSTALL_HELP)


def test_every_scalar_measure_habitat_reports_reaches_the_infos_flattened():
    venv = fake_vector(2)
    venv.reset()
    _, _, _, _, infos = venv.step(np.array([1, 2]))
    assert infos["soft_spl"].tolist() == [0.25, 0.0]
    assert infos["collisions.count"].tolist() == [1.0, 1.0]
    assert infos["collisions.is_collision"].tolist() == [0.0, 1.0]
    assert "top_down_map" not in infos and "collisions" not in infos
    assert infos["spl"].dtype == np.float32  # the PointNav measures keep their types


def test_a_habitat_release_other_than_the_supported_one_is_one_line_naming_it():
    from envs.habitat.loader import HABITAT_LAB_PYPI_VERSION, version_problem

    assert version_problem(HABITAT_LAB_VERSION, HABITAT_LAB_VERSION) is None
    line = version_problem("0.3.2", HABITAT_LAB_VERSION)
    assert line == (f"habitat-lab 0.3.2 installed; the habitat backend supports habitat-lab and "
                    f"habitat-sim {HABITAT_LAB_VERSION} only: pip install habitat-lab=="
                    f"{HABITAT_LAB_PYPI_VERSION} and build habitat-sim v{HABITAT_LAB_VERSION} "
                    "(docs/environments.md)")
    assert version_problem(None, "0.2.5").startswith(
        "habitat-lab (unknown version) and habitat-sim 0.2.5 installed;")
