"""The batched PointNav simulator core: N agents, each in its own scene and episode.

Everything per step is one vectorised call over all agents: motion with collision, geodesic
lookup, reward/metrics, and depth rendering. Per-agent data lives in fixed slots of flat arrays
(ray-caster tables, navigable mask, goal distance field) that are refilled only when an agent
changes scene or goal. Both the single environment and the vector environment drive this class.
"""

from __future__ import annotations


import numpy as np

from .episodes import load_episodes, sample_episode
from .geodesic import lookup_distance
from .motion import move
from .raycast import DepthCamera
from .scenes import get_scene_set, load_scene, resolve_scene_id
from .spec import (FORWARD_STEP_M, MAX_EPISODE_STEPS, NUM_ACTIONS, SUCCESS_DISTANCE_M,
                   TURN_ANGLE_RAD, Action, forward_vector, pointgoal_polar, spl, step_reward,
                   wrap_angle)

__all__ = ["PointNavSim", "check_options", "check_counts"]


def check_options(options, where):
    """Raise TypeError naming any key of ``options`` that PointNavSim does not take."""
    import inspect

    known = set(inspect.signature(PointNavSim.__init__).parameters) - {"self", "num_envs"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"{where} got unknown option(s) {unknown}; the options are "
                        f"{sorted(known)}")


def check_counts(*, num_envs, max_episode_steps, episodes_per_scene, depth_noise_std,
                 pointgoal_noise_std):
    """Raise ValueError for a simulator size or option no simulator can run with (the numpy and
    the batch simulator share these rules)."""
    if int(num_envs) < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs!r}")
    if int(max_episode_steps) < 1:
        raise ValueError(f"max_episode_steps must be positive, got {max_episode_steps!r}")
    if depth_noise_std < 0 or pointgoal_noise_std < 0:
        raise ValueError("noise standard deviations must be >= 0")
    if int(episodes_per_scene) < 1:
        raise ValueError(f"episodes_per_scene must be at least 1, got {episodes_per_scene!r}")


class PointNavSim:
    """``num_envs`` PointNav agents stepped together (see the package docs for the options)."""

    def __init__(self, num_envs, *, scenes="default", split="train", seed=0, depth_size=64,
                 max_episode_steps=MAX_EPISODE_STEPS, episodes=None, repeat_episodes=True,
                 shard_index=0, num_shards=1, episodes_per_scene=8, map_resolution=0.05,
                 depth_noise_std=0.0, pointgoal_noise_std=0.0, geodesic_range=None,
                 min_ratio=None, sensors=("depth",)):
        from .env import check_sensors

        self.sensors = check_sensors(sensors)
        check_counts(num_envs=num_envs, max_episode_steps=max_episode_steps,
                     episodes_per_scene=episodes_per_scene, depth_noise_std=depth_noise_std,
                     pointgoal_noise_std=pointgoal_noise_std)
        self.num_envs = n = int(num_envs)
        self.max_episode_steps = int(max_episode_steps)
        self.episodes_per_scene = int(episodes_per_scene)
        self.map_resolution = float(map_resolution)
        self.depth_noise_std = float(depth_noise_std)
        self.pointgoal_noise_std = float(pointgoal_noise_std)
        self.camera = DepthCamera(size=depth_size)
        self.split = split

        self._file_episodes = None
        if episodes is not None:
            eps = load_episodes(episodes)
            if not (0 <= int(shard_index) < int(num_shards)):
                raise ValueError(f"shard_index must be in [0, num_shards), got {shard_index!r} "
                                 f"of {num_shards!r}")
            self._file_episodes = eps[int(shard_index)::int(num_shards)]
            if not self._file_episodes:
                raise ValueError(f"shard {shard_index} of {num_shards} of {episodes!r} is empty")
            for scene_id in sorted({e.scene_id for e in self._file_episodes}):
                resolve_scene_id(scene_id)  # fail now, not at the first reset that needs it
            self.scene_set = None
            self._scene_ids = None
        else:
            self.scene_set = get_scene_set(scenes, resolution=self.map_resolution)
            self._scene_ids = self.scene_set.scene_ids(split)
        # Episode rules: the scene set's unless overridden (e.g. for a curriculum).
        self.geodesic_range = tuple(geodesic_range) if geodesic_range is not None else (
            self.scene_set.geodesic_range if self.scene_set is not None else None)
        self.min_ratio = float(min_ratio) if min_ratio is not None else (
            self.scene_set.min_ratio if self.scene_set is not None else None)
        if self.geodesic_range is not None and not (
                len(self.geodesic_range) == 2 and 0 <= self.geodesic_range[0]
                < self.geodesic_range[1]):
            raise ValueError(f"geodesic_range must be (min, max) metres with min < max, got "
                             f"{geodesic_range!r}")
        self.repeat_episodes = bool(repeat_episodes)

        self.pos = np.zeros((n, 2))
        self.heading = np.zeros(n)
        self.goal = np.zeros((n, 2))
        self.steps = np.zeros(n, dtype=np.int64)
        self.path_length = np.zeros(n)
        self.shortest = np.zeros(n)
        self.prev_distance = np.zeros(n)
        self.counted = np.ones(n, dtype=bool)
        self.episode = [None] * n
        self.scene = [None] * n
        self._field_ref = [None] * n
        self._scene_count = np.zeros(n, dtype=np.int64)
        self._episode_count = np.zeros(n, dtype=np.int64)
        self._needs_reset = np.ones(n, dtype=bool)
        self._cols = np.zeros(n, dtype=np.int64)
        self._cells = np.zeros(n, dtype=np.int64)
        self._stride = 0
        self._table = self._nav = self._field = None
        self.resolution = None
        self._seeds = None
        self.rngs = None
        self.seed(seed)

    # ---- seeding, episodes and slots ------------------------------------------------------
    def seed(self, seed):
        """Reseed: env ``i`` draws from its own stream seeded ``seed + i``."""
        seed = 0 if seed is None else int(seed)
        self._seeds = [seed + i for i in range(self.num_envs)]
        self.rngs = [np.random.default_rng(s) for s in self._seeds]
        # Sensor noise draws from its own streams so that it never changes the episodes.
        self._noise_rngs = [np.random.default_rng([s, 1]) for s in self._seeds]
        self._queue_next = 0
        self._queue_finished = 0
        self._scene_count[:] = 0
        self._episode_count[:] = 0
        self.scene = [None] * self.num_envs

    @property
    def num_file_episodes(self):
        """Episodes in the (sharded) episode file, or None in sampling mode."""
        return None if self._file_episodes is None else len(self._file_episodes)

    @property
    def exhausted(self):
        """True once every file episode ran to its end (only without ``repeat_episodes``)."""
        return (self._file_episodes is not None and not self.repeat_episodes
                and self._queue_finished >= len(self._file_episodes))

    def _ensure_stride(self, cells):
        if cells <= self._stride:
            return
        self._stride = int(cells)
        n, s = self.num_envs, self._stride
        self._table = np.full(n * 4 * s, -1.0, dtype=np.float32)
        self._nav = np.zeros(n * s, dtype=bool)
        self._field = np.full(n * s, np.inf, dtype=np.float32)
        for i in range(n):
            if self.scene[i] is not None:
                self._fill_scene(i, self.scene[i])
                self._fill_field(i, self._field_ref[i])

    def _fill_scene(self, i, scene):
        if self.resolution is None:
            self.resolution = scene.resolution
        elif abs(scene.resolution - self.resolution) > 1e-12:
            raise ValueError(f"scene {scene.scene_id!r} has resolution {scene.resolution} m but "
                             f"this simulator runs at {self.resolution} m; use one resolution")
        self._ensure_stride(scene.cells)
        s = self._stride
        self._table[i * 4 * s:i * 4 * s + 4 * scene.cells] = scene.table
        self._nav[i * s:i * s + scene.cells] = scene.nav_flat
        self._cols[i] = scene.cols
        self._cells[i] = scene.cells
        self.scene[i] = scene

    def _fill_field(self, i, field):
        s = self._stride
        self._field[i * s:i * s + field.size] = field.ravel()
        self._field_ref[i] = field

    def _next_episode(self, i):
        """The next episode of env ``i`` and whether it counts as a first deal."""
        rng = self.rngs[i]
        if self._file_episodes is None:
            if self.scene[i] is None or self._scene_count[i] >= self.episodes_per_scene:
                sid = self._scene_ids[int(rng.integers(len(self._scene_ids)))]
                self._fill_scene(i, load_scene(sid, resolution=self.map_resolution))
                self._scene_count[i] = 0
            self._scene_count[i] += 1
            ep = sample_episode(self.scene[i], rng,
                                episode_id=f"s{self._seeds[i]}-{self._episode_count[i]}",
                                geodesic_range=self.geodesic_range, min_ratio=self.min_ratio)
            self._episode_count[i] += 1
            return ep, True
        counted = True
        if self._queue_next >= len(self._file_episodes):
            if self.repeat_episodes:
                self._queue_next = 0
            else:
                # Parked: replay this env's last episode so it still returns observations.
                return self.episode[i] or self._file_episodes[-1], False
        ep = self._file_episodes[self._queue_next]
        self._queue_next += 1
        return ep, counted

    def reset_env(self, i):
        """Start env ``i``'s next episode (no rendering)."""
        ep, counted = self._next_episode(i)
        if self._file_episodes is not None:
            scene = self.scene[i]
            if scene is None or scene.scene_id != ep.scene_id:
                scene = load_scene(ep.scene_id, resolution=self.map_resolution)
                self._fill_scene(i, scene)
            if not scene.is_navigable(ep.start_position):
                raise ValueError(f"episode {ep.episode_id!r}: start {ep.start_position} is not "
                                 f"navigable in scene {ep.scene_id!r} (agent radius 0.1 m)")
        self._fill_field(i, self.scene[i].field_for(ep.goal_position))
        self.episode[i] = ep
        self.counted[i] = counted
        self.pos[i] = ep.start_position
        self.heading[i] = wrap_angle(ep.start_heading)
        self.goal[i] = ep.goal_position
        self.steps[i] = 0
        self.path_length[i] = 0.0
        d = self.distances(np.array([i]))[0]
        if not np.isfinite(d):
            raise ValueError(f"episode {ep.episode_id!r}: goal {ep.goal_position} cannot be "
                             f"reached from the start in scene {ep.scene_id!r}")
        self.shortest[i] = d
        self.prev_distance[i] = d
        self._needs_reset[i] = False

    def reset(self, seed=None):
        """Reset every env (reseeding first when ``seed`` is given); returns ``(obs, info)``."""
        if seed is not None:
            self.seed(seed)
        else:
            self._queue_next = 0
            self._queue_finished = 0
        for i in range(self.num_envs):
            self.reset_env(i)
        return self.observe(), self.start_infos()

    def start_infos(self):
        """The info of freshly started episodes (metrics at their start)."""
        none = np.zeros(self.num_envs, dtype=bool)
        return self._infos(none, none, self.prev_distance.copy(),
                           [e.episode_id for e in self.episode], none)

    # ---- per-step work ---------------------------------------------------------------------
    def distances(self, idx=None):
        """Geodesic distance to the goal of the envs in ``idx`` (all by default)."""
        idx = np.arange(self.num_envs) if idx is None else idx
        return lookup_distance(self._field, idx * self._stride, self._cols[idx], self.pos[idx],
                               self.goal[idx], resolution=self.resolution)

    def observe(self):
        """Observations of every env: ``depth`` (N, H, W, 1), ``rgb`` (N, H, W, 3) uint8 when
        ``sensors`` has it, and ``pointgoal_with_gps_compass``."""
        n = self.num_envs
        depth = self.camera.render(self._table, np.arange(n) * 4 * self._stride, self._cols,
                                   self._cells, self.pos, self.heading,
                                   resolution=self.resolution, rgb="rgb" in self.sensors)
        extra = {}
        if "rgb" in self.sensors:
            depth, extra["rgb"] = depth
        goal = pointgoal_polar(self.pos, self.heading, self.goal)
        if self.depth_noise_std > 0:
            noise = np.stack([r.normal(0.0, self.depth_noise_std, depth.shape[1:])
                              for r in self._noise_rngs]).astype(np.float32)
            depth = np.clip(depth + noise, 0.0, 1.0)
        if self.pointgoal_noise_std > 0:
            goal = goal + np.stack([r.normal(0.0, self.pointgoal_noise_std, 2)
                                    for r in self._noise_rngs])
            goal[:, 0] = np.abs(goal[:, 0])
            goal[:, 1] = wrap_angle(goal[:, 1])
        return {"depth": depth, **extra, "pointgoal_with_gps_compass": goal.astype(np.float32)}

    def check_actions(self, actions):
        """Validate ``actions`` (one integer in [0, 4) per env) and return them as int64."""
        a = np.asarray(actions)
        if a.shape != (self.num_envs,):
            a = a.reshape(-1) if a.size == self.num_envs else a
        if a.shape != (self.num_envs,) or not (np.issubdtype(a.dtype, np.integer)
                                               or (np.issubdtype(a.dtype, np.floating)
                                                   and np.all(a == np.round(a)))):
            raise ValueError(f"actions must be {self.num_envs} integers (0 STOP, 1 MOVE_FORWARD,"
                             f" 2 TURN_LEFT, 3 TURN_RIGHT), got {np.asarray(actions)!r}")
        a = a.astype(np.int64)
        if a.min() < 0 or a.max() >= NUM_ACTIONS:
            raise ValueError(f"actions must be in [0, {NUM_ACTIONS}) (0 STOP, 1 MOVE_FORWARD, "
                             f"2 TURN_LEFT, 3 TURN_RIGHT), got {a.tolist()}")
        return a

    def step(self, actions, *, autoreset=True):
        """Apply one action per env; returns ``(obs, reward, terminated, truncated, info)``.

        With ``autoreset`` an env whose episode ended starts its next one at once and the
        returned observation is that episode's first (the info still describes the ended one).
        """
        a = self.check_actions(actions)
        if self._needs_reset.any():
            raise RuntimeError("step() called on an episode that has ended; call reset() first")
        collided = np.zeros(self.num_envs, dtype=bool)
        fwd = np.flatnonzero(a == Action.MOVE_FORWARD)
        if fwd.size:
            disp = forward_vector(self.heading[fwd]) * FORWARD_STEP_M
            new, collided[fwd] = move(self._nav, fwd * self._stride, self._cols[fwd],
                                      self.pos[fwd], disp, resolution=self.resolution)
            self.path_length[fwd] += np.linalg.norm(new - self.pos[fwd], axis=1)
            self.pos[fwd] = new
        turn = (a == Action.TURN_LEFT).astype(np.float64) - (a == Action.TURN_RIGHT)
        self.heading = wrap_angle(self.heading + TURN_ANGLE_RAD * turn)
        self.steps += 1
        dist = self.distances()
        terminated = a == Action.STOP
        success = terminated & (dist < SUCCESS_DISTANCE_M)
        truncated = ~terminated & (self.steps >= self.max_episode_steps)
        reward = step_reward(self.prev_distance, dist, success).astype(np.float32)
        done = terminated | truncated
        self.prev_distance = dist
        info = self._infos(done, success, dist, [e.episode_id for e in self.episode], collided)
        if self._file_episodes is not None:
            self._queue_finished += int(np.sum(done & self.counted))
        ended = np.flatnonzero(done)
        if autoreset:
            for i in ended:
                self.reset_env(int(i))
        else:
            self._needs_reset[ended] = True
        obs = self.observe()
        return obs, reward, terminated, truncated, info

    def _infos(self, done, success, dist, episode_ids, collided):
        return {
            "distance_to_goal": dist.astype(np.float32),
            "success": success.copy(),
            "spl": np.where(done, spl(success, self.shortest, self.path_length), 0.0)
            .astype(np.float32),
            "episode_id": np.array(episode_ids, dtype=object),
            # Built before any auto-reset: these describe the episodes that just ended.
            "counted": self.counted.copy(),
            "path_length": self.path_length.astype(np.float32),
            "elapsed_steps": self.steps.copy(),
            "collided": collided.copy(),
        }
