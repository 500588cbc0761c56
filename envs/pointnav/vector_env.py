"""``PointNavVectorEnv``: N embedded PointNav environments stepped in one vectorised call."""

from __future__ import annotations

import os

import gymnasium as gym
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from ..eval_set import EvalSet
from .env import observation_space
from .episodes import load_episodes, save_episodes
from .make_episodes import make_episodes
from .sim import PointNavSim, check_options
from .spec import MAX_EPISODE_STEPS

__all__ = ["PointNavVectorEnv", "eval_env", "DEFAULT_EVAL_EPISODES"]

DEFAULT_EVAL_EPISODES = 100  # without an episode file and with num_episodes 0


class PointNavVectorEnv(VectorEnv):
    """``num_envs`` PointNav environments with gymnasium's vector API and SAME_STEP autoreset.

    ``step(actions)`` returns ``(obs, rewards, terminated, truncated, infos)``; for an env whose
    episode just ended the observation is already the next episode's first, while ``infos``
    (arrays of length N: ``distance_to_goal``, ``success``, ``spl``, ``episode_id``, ``counted``,
    ``collided``, ``path_length``, ``elapsed_steps``) describe the episode that ended.

    Options: ``scenes`` (scene-set name, PNG map or directory of maps), ``split``, ``seed`` (env
    ``i`` uses ``seed + i``), ``depth_size``, ``max_episode_steps``, ``episodes`` (a Habitat
    episode file to run instead of sampling; dealt to envs in file order, each once per pass,
    split across workers by ``shard_index``/``num_shards``; with ``repeat_episodes=False`` envs
    that find the file used up replay their last episode with ``counted`` False and
    ``exhausted`` turns True once every episode finished), ``episodes_per_scene`` (sampled
    episodes before an env moves to another scene), ``map_resolution`` (metres per pixel of PNG
    maps), ``geodesic_range``/``min_ratio`` (override the scene set's episode rules, e.g. for
    a curriculum) and ``depth_noise_std``/``pointgoal_noise_std`` (sensor noise, off by default).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs, *, scenes="default", split="train", seed=0, depth_size=64,
                 max_episode_steps=MAX_EPISODE_STEPS, episodes=None, **more):
        check_options(more, "PointNavVectorEnv")
        self._sim = PointNavSim(num_envs, scenes=scenes, split=split, seed=seed,
                                depth_size=depth_size, max_episode_steps=max_episode_steps,
                                episodes=episodes, **more)
        self.num_envs = self._sim.num_envs
        self.single_observation_space = observation_space(int(depth_size), self._sim.sensors)
        self.single_action_space = gym.spaces.Discrete(4)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._seed = seed
        self._started = False

    def reset(self, *, seed=None, options=None):
        """Reset every env. ``seed``: env ``i`` is reseeded with ``seed + i``; without it the
        first reset uses the constructor's seed and later ones continue the same streams. An
        episode file restarts from its first episode."""
        if seed is None and not self._started:
            seed = self._seed
        self._started = True
        return self._sim.reset(seed=seed)

    def step(self, actions):
        """Step every env with ``actions`` (N integers: 0 STOP, 1 MOVE_FORWARD, 2 TURN_LEFT,
        3 TURN_RIGHT)."""
        if not self._started:
            raise RuntimeError("call reset() before step()")
        return self._sim.step(actions, autoreset=True)

    def close_extras(self, **kwargs):
        """Nothing to release: the simulator lives in this process."""

    @property
    def num_file_episodes(self):
        """Number of episodes in this worker's share of the episode file (None when sampling)."""
        return self._sim.num_file_episodes

    @property
    def exhausted(self):
        """True once every file episode ran to its end (``repeat_episodes=False`` only)."""
        return self._sim.exhausted

    @property
    def sim(self):
        """The batched simulator core (state for tests and tools)."""
        return self._sim


def eval_env(num_envs, *, split="val", episodes=None, num_episodes=0, seed=0, episode_dir=None,
             scenes="default", workers="inprocess", timeout=300.0, **options):
    """The embedded backend's evaluation set: the first ``num_episodes`` (0: all) of the file
    ``episodes``, or without a file ``num_episodes`` (default 100) episodes drawn from
    ``split`` of ``scenes`` with ``seed`` and kept in ``episode_dir`` (the same arguments give
    the same file). Runs on at most ``num_envs`` environments, each file episode once: dealt in
    file order from one queue, or with ``workers="process"`` one env per worker process
    (:class:`envs.ProcessVectorEnv`, ``timeout`` its timeout), env ``i`` running every
    ``n``-th episode from the ``i``-th."""
    if workers not in ("inprocess", "process"):
        raise ValueError(f"workers must be 'inprocess' or 'process', got {workers!r}")
    file = episodes
    if file is None:
        n = int(num_episodes) or DEFAULT_EVAL_EPISODES
        if episode_dir is None:
            raise ValueError("eval_env needs an episode file or an episode_dir to keep the "
                             "episodes it draws")
        file = os.path.join(os.fspath(episode_dir),
                            f"{os.path.basename(os.fspath(scenes))}_{split}_{n}.json.gz")
        if not os.path.isfile(file):
            save_episodes(file, make_episodes(
                scenes=scenes, split=split, count=n, seed=[int(seed), n], id_prefix=f"{split}-",
                map_resolution=options.get("map_resolution", 0.05)))
    ids = [e.episode_id for e in load_episodes(file)][:int(num_episodes) or None]
    n = max(1, min(int(num_envs), len(ids)))
    if workers == "process":
        from ..pool import ProcessVectorEnv, WorkerEnvFn

        venv = ProcessVectorEnv([WorkerEnvFn(PointNavVectorEnv, i, num_envs=1, scenes=scenes,
                                             split=split, seed=int(seed) + i, episodes=file,
                                             repeat_episodes=False, shard_index=i, num_shards=n,
                                             **options) for i in range(n)], timeout=timeout)
    else:
        venv = PointNavVectorEnv(n, scenes=scenes, split=split, seed=seed, episodes=file,
                                 repeat_episodes=False, **options)
    return EvalSet(env=venv, episode_ids=ids, source=os.fspath(file))
