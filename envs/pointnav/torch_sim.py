"""The PointNav simulator as a batch simulator on a torch device (cpu or cuda).

:class:`TorchPointNavSim` implements :class:`envs.pointnav.sim.PointNavSim`'s task (motion with
collision and wall sliding, the column raycast of every env, geodesic lookups, rewards, success,
SPL, auto-reset from the episode set) with every env a row of tensors on one device, as batch
simulators do (BPS, Madrona, Isaac Lab). A step is a fixed sequence of kernels over all rows: no
data-dependent shapes, no host synchronisation, so observations go from the simulator to the
policy without a host copy. The numpy simulator stays the reference; the tests drive both with the
same episodes and actions.

Differences from the reference, each forced by "no host synchronisation":

* Every scene the envs may visit is loaded up front and packed on the device (a split's scenes, or
  the scenes of an episode file); an env switches scene by index.
* Sampled episodes draw from one device generator (the episode rules are the reference's: a pool
  goal with a valid start, uniformly, then a start cell uniformly among those the rules allow), so
  a sampled stream differs from the reference's numpy streams while following the same
  distribution. Episode files are dealt exactly as the reference deals them (file order, one
  shared queue, ascending env index within a step), with ``repeat_episodes`` only.
* Rays finish in a fixed number of rounds (free-space jumps, then cell-by-cell chunks whose
  count covers the longest possible ray), not by dropping finished rays.
* Actions given as a tensor are not range-checked (that would read them back from the device);
  numpy or list actions are.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .episodes import load_episodes
from .geodesic import lookup_distance
from .raycast import DepthCamera
from .scenes import get_scene_set, load_scene, resolve_scene_id
from .sim import check_counts
from .spec import (FORWARD_STEP_M, MAX_EPISODE_STEPS, NUM_ACTIONS, SLACK_REWARD,
                   SUCCESS_DISTANCE_M, SUCCESS_REWARD, TURN_ANGLE_RAD, Action)

__all__ = ["TorchPointNavSim", "SceneBank"]

_EPS = 1e-5         # cells: a boundary step lands a hair inside the next cell (as raycast.py)
_SKIP_ITERS = 6     # free-space jumps before the cell-by-cell chunks
_CHUNK = 64         # cell boundaries per axis checked by one chunk
_DC = (0.0, 1.0, 0.0, 1.0)  # the four cell centres around a position (as geodesic.py)
_DR = (0.0, 0.0, 1.0, 1.0)


class SceneBank:
    """Scenes packed into flat device tensors: ray-caster tables, navigable masks, distance fields
    (the pool goals' and any extra goals'), and each pool goal's valid start cells.

    Scene ``s`` has its tables at ``table_off[s]`` (4 quadrants of ``cells[s]``), its mask at
    ``nav_off[s]``; field ``f`` starts at ``field_off[f]``; ``pool_field[s, g]`` is the field of
    pool goal ``g``. ``start_cells[start_off[s, g] : + start_cnt[s, g]]`` are the cells a start of
    goal ``g`` may take under the episode rules; ``goal_ok[s, g]`` says the goal has any.
    """

    def __init__(self, scenes, *, device, geodesic_range=None, min_ratio=None):
        self.scenes = list(scenes)
        self.index = {sc.scene_id: i for i, sc in enumerate(self.scenes)}
        res = {round(sc.resolution, 12) for sc in self.scenes}
        if len(res) != 1:
            raise ValueError(f"scenes of different resolutions {sorted(res)} in one simulator; use "
                             "one resolution")
        self.resolution = self.scenes[0].resolution
        self.device = torch.device(device)
        tables, navs, table_off, nav_off, t, v = [], [], [], [], 0, 0
        for sc in self.scenes:
            table_off.append(t)
            nav_off.append(v)
            tables.append(sc.table)
            navs.append(sc.nav_flat)
            t += sc.table.size
            v += sc.cells
        self._field_ids = {}
        self._fields_host = []
        self._field_off_host = []
        self._field_len = 0
        g_max = max(len(sc.goals) for sc in self.scenes)
        pool_field = np.zeros((len(self.scenes), g_max), dtype=np.int64)
        goals = np.zeros((len(self.scenes), g_max, 2))
        for s, sc in enumerate(self.scenes):
            for g in range(len(sc.goals)):
                pool_field[s, g] = self.add_field(s, sc.goals[g], sc.fields[g])
                goals[s, g] = sc.goals[g]
        starts, start_off, start_cnt = [], np.zeros((len(self.scenes), g_max), np.int64), \
            np.zeros((len(self.scenes), g_max), np.int64)
        goal_ok = np.zeros((len(self.scenes), g_max), dtype=bool)
        n_start = 0
        if geodesic_range is not None:
            for s, sc in enumerate(self.scenes):
                lists = [sc.start_candidates(g, geodesic_range, min_ratio)
                         for g in range(len(sc.goals))]
                if not any(c.size for c in lists):
                    # The reference's relaxed rule for maps too small for the range.
                    lists = []
                    for g in range(len(sc.goals)):
                        field = sc.fields[g].ravel()
                        cells = np.flatnonzero(sc.nav_flat & np.isfinite(field) & (field > 0.5))
                        if not cells.size:
                            cells = np.flatnonzero(sc.nav_flat & np.isfinite(field))
                        lists.append(cells)
                for g, cells in enumerate(lists):
                    start_off[s, g], start_cnt[s, g], goal_ok[s, g] = n_start, cells.size, cells.size > 0
                    starts.append(cells)
                    n_start += cells.size
        dev = self.device
        self.table = torch.as_tensor(np.concatenate(tables), device=dev)
        self.nav = torch.as_tensor(np.concatenate(navs), device=dev)
        self.table_off = torch.as_tensor(table_off, dtype=torch.int64, device=dev)
        self.nav_off = torch.as_tensor(nav_off, dtype=torch.int64, device=dev)
        self.cols = torch.as_tensor([sc.cols for sc in self.scenes], dtype=torch.int64, device=dev)
        self.cells = torch.as_tensor([sc.cells for sc in self.scenes], dtype=torch.int64, device=dev)
        self.pool_field = torch.as_tensor(pool_field, device=dev)
        self.goals = torch.as_tensor(goals, device=dev)
        self.goal_ok = torch.as_tensor(goal_ok, device=dev)
        self.start_off = torch.as_tensor(start_off, device=dev)
        self.start_cnt = torch.as_tensor(start_cnt, device=dev)
        self.start_cells = torch.as_tensor(np.concatenate(starts) if starts else
                                           np.zeros(1, np.int64), dtype=torch.int64, device=dev)
        self._upload_fields()
        # The longest distance (cells) a ray can travel inside any scene: its map's diagonal.
        self.max_span_cells = max(math.hypot(sc.rows, sc.cols) for sc in self.scenes)

    def add_field(self, scene_index, goal, field=None):
        """The index of the distance field of ``goal`` in scene ``scene_index`` (computed and
        packed when new; call :meth:`_upload_fields` after adding)."""
        key = (scene_index, round(float(goal[0]), 9), round(float(goal[1]), 9))
        if key not in self._field_ids:
            if field is None:
                field = self.scenes[scene_index].field_for(goal)
            self._field_ids[key] = len(self._fields_host)
            self._fields_host.append(np.asarray(field, dtype=np.float32).ravel())
            self._field_off_host.append(self._field_len)
            self._field_len += field.size
        return self._field_ids[key]

    def _upload_fields(self):
        self.field = torch.as_tensor(np.concatenate(self._fields_host), device=self.device)
        self.field_off = torch.as_tensor(self._field_off_host, dtype=torch.int64,
                                         device=self.device)


class TorchPointNavSim:
    """``num_envs`` PointNav agents as rows of tensors on ``device`` (see the module docstring).

    Options are the reference's (:class:`envs.pointnav.sim.PointNavSim`) except that an episode
    file needs ``repeat_episodes=True``; ``graph`` (cuda): capture a step as a CUDA graph and
    replay it; ``early_exit`` (default: on cpu without ``compile`` only): end the ray chunks once
    every ray is done, which reads a flag back from the device; ``compile``: cast the rays through
    ``torch.compile`` (Inductor; the same depth, fused kernels, compiled at the first
    observation). :meth:`reset` and :meth:`step` return observations
    ``{"depth": (N, H, W, 1), "pointgoal_with_gps_compass": (N, 2)}`` (float32) and, for
    :meth:`step`, rewards (float32), ``terminated`` and ``truncated`` (bool) and an info dict of
    tensors describing the step's episodes before any auto-reset: ``distance_to_goal``,
    ``success``, ``spl``, ``path_length``, ``elapsed_steps``, ``collided``, ``episode_index``
    (the episode's index in the file, -1 for sampled episodes).
    """

    def __init__(self, num_envs, *, device="cpu", scenes="default", split="train", seed=0,
                 depth_size=64, max_episode_steps=MAX_EPISODE_STEPS, episodes=None,
                 repeat_episodes=True, shard_index=0, num_shards=1, episodes_per_scene=8,
                 map_resolution=0.05, depth_noise_std=0.0, pointgoal_noise_std=0.0,
                 geodesic_range=None, min_ratio=None, graph=True, early_exit=None,
                 compile=False, sensors=("depth",)):
        from .env import check_sensors

        if "rgb" in check_sensors(sensors):
            raise ValueError("the device simulator renders depth only; an RGB camera needs the "
                             "numpy simulator (env.device=numpy)")
        check_counts(num_envs=num_envs, max_episode_steps=max_episode_steps,
                     episodes_per_scene=episodes_per_scene, depth_noise_std=depth_noise_std,
                     pointgoal_noise_std=pointgoal_noise_std)
        if episodes is not None and not repeat_episodes:
            raise ValueError("the device simulator deals an episode file round and round "
                             "(repeat_episodes=True); evaluate a file once with the numpy "
                             "simulator (env.device=numpy)")
        self.device = dev = torch.device(device)
        self.num_envs = n = int(num_envs)
        self.max_episode_steps = int(max_episode_steps)
        self.episodes_per_scene = int(episodes_per_scene)
        self.depth_noise_std = float(depth_noise_std)
        self.pointgoal_noise_std = float(pointgoal_noise_std)
        self.camera = DepthCamera(size=depth_size)
        self.depth_size = self.camera.size

        if episodes is not None:
            eps = load_episodes(episodes)
            if not (0 <= int(shard_index) < int(num_shards)):
                raise ValueError(f"shard_index must be in [0, num_shards), got {shard_index!r} "
                                 f"of {num_shards!r}")
            eps = eps[int(shard_index)::int(num_shards)]
            if not eps:
                raise ValueError(f"shard {shard_index} of {num_shards} of {episodes!r} is empty")
            ids = sorted({e.scene_id for e in eps})
            for scene_id in ids:
                resolve_scene_id(scene_id)
            self.bank = SceneBank([load_scene(i, resolution=map_resolution) for i in ids],
                                  device=dev)
            self._load_file(eps)
            self._sampling = False
        else:
            sset = get_scene_set(scenes, resolution=map_resolution)
            rng = tuple(geodesic_range) if geodesic_range is not None else sset.geodesic_range
            if not (len(rng) == 2 and 0 <= rng[0] < rng[1]):
                raise ValueError(f"geodesic_range must be (min, max) metres with min < max, got "
                                 f"{geodesic_range!r}")
            ratio = float(min_ratio) if min_ratio is not None else sset.min_ratio
            self.bank = SceneBank([load_scene(i, resolution=map_resolution)
                                   for i in sset.scene_ids(split)], device=dev,
                                  geodesic_range=rng, min_ratio=ratio)
            self._sampling = True
        self.resolution = self.bank.resolution

        f64 = dict(dtype=torch.float64, device=dev)
        self.pos = torch.zeros(n, 2, **f64)
        self.heading = torch.zeros(n, **f64)
        self.goal = torch.zeros(n, 2, **f64)
        self.scene = torch.zeros(n, dtype=torch.int64, device=dev)
        self.field_id = torch.zeros(n, dtype=torch.int64, device=dev)
        self.episode_index = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.steps = torch.zeros(n, dtype=torch.int64, device=dev)
        self.path_length = torch.zeros(n, **f64)
        self.shortest = torch.zeros(n, **f64)
        self.prev_distance = torch.zeros(n, **f64)
        self.scene_count = torch.zeros(n, dtype=torch.int64, device=dev)
        self._queue_next = torch.zeros((), dtype=torch.int64, device=dev)
        self._all = torch.ones(n, dtype=torch.bool, device=dev)

        cam = self.camera
        w = cam.size
        self._col_angle = torch.as_tensor(cam._col_angle, **f64)
        self._col_scale = torch.as_tensor(cam._col_cos * (self.resolution / cam.max_depth), **f64)
        self._plane = torch.as_tensor(cam._plane, dtype=torch.float32, device=dev)
        t_max = cam._t_max / self.resolution
        self._t_max = torch.as_tensor(np.tile(t_max, n), **f64)
        longest = min(float(t_max.max()), self.bank.max_span_cells) + 2.0
        self._chunks = int(math.ceil(longest / (_CHUNK - 1)))
        self._ray_env = torch.arange(n, device=dev).repeat_interleave(w)
        move = FORWARD_STEP_M
        self._samples = max(1, int(np.ceil(round(move / (0.5 * self.resolution), 9))))
        self._frac = torch.arange(1, self._samples + 1, **f64) / (self._samples * self.resolution)
        self._dc = torch.as_tensor(_DC, **f64)
        self._dr = torch.as_tensor(_DR, **f64)
        self.generator = torch.Generator(device=dev)
        self._u = torch.zeros(4, n, **f64)
        self._actions = torch.zeros(n, dtype=torch.int64, device=dev)
        self._depth_noise = torch.zeros(n, self.depth_size, self.depth_size, 1, **f64) \
            if self.depth_noise_std > 0 else None
        self._goal_noise = torch.zeros(n, 2, **f64) if self.pointgoal_noise_std > 0 else None
        # CUDA graphs: a step is a fixed sequence of kernels on fixed buffers, so after two eager
        # steps it is captured once and replayed (one launch instead of hundreds).
        self._graph_wanted = bool(graph) and dev.type == "cuda"
        # On cpu a ray chunk loop may stop once every ray is done: reading that flag costs nothing
        # there, while on a GPU it would stall the stream (default: cpu only).
        if compile and early_exit:
            raise ValueError("compile=True casts every ray through the fixed number of chunks "
                             "(one compiled graph, no flag read back): leave early_exit off")
        self._early_exit = dev.type == "cpu" and not compile if early_exit is None \
            else bool(early_exit)
        # The ray cast is most of a step; compiled, its chunks fuse into a few kernels that read
        # the table and keep per-ray values, where eager ones write ~25 (rays x _CHUNK) float64
        # temporaries a chunk. It compiles at its first call (reset() or the first eager step),
        # before any CUDA graph capture. No fused multiply-adds (Triton contracts by default,
        # Inductor's C++ does not): a cell boundary must round as the eager kernels round it, or
        # a ray may see another cell.
        self._compiled = bool(compile)
        self._caster = torch.compile(_cast_rays, dynamic=False, fullgraph=True, options={
            "emulate_precision_casts": True}) if compile else _cast_rays
        self._graph = None
        self._eager_steps = 0
        self.seed(seed)

    # ---- episodes ----------------------------------------------------------------------------
    def _load_file(self, eps):
        """Episode tensors of a file, checked on the host once (a start that is not navigable or a
        goal that cannot be reached is a ValueError naming the episode)."""
        bank = self.bank
        scene, field, start, heading, goal = [], [], [], [], []
        for ep in eps:
            s = bank.index[ep.scene_id]
            sc = bank.scenes[s]
            if not sc.is_navigable(ep.start_position):
                raise ValueError(f"episode {ep.episode_id!r}: start {ep.start_position} is not "
                                 f"navigable in scene {ep.scene_id!r} (agent radius 0.1 m)")
            f = bank.add_field(s, ep.goal_position)
            d = lookup_distance(bank._fields_host[f], np.zeros(1, np.int64), np.array([sc.cols]),
                                np.asarray([ep.start_position], dtype=np.float64),
                                np.asarray([ep.goal_position], dtype=np.float64),
                                resolution=sc.resolution)[0]
            if not np.isfinite(d):
                raise ValueError(f"episode {ep.episode_id!r}: goal {ep.goal_position} cannot be "
                                 f"reached from the start in scene {ep.scene_id!r}")
            scene.append(s)
            field.append(f)
            start.append(ep.start_position)
            heading.append(ep.start_heading)
            goal.append(ep.goal_position)
        bank._upload_fields()
        dev = self.device
        self.episodes = eps
        self._ep_scene = torch.as_tensor(scene, dtype=torch.int64, device=dev)
        self._ep_field = torch.as_tensor(field, dtype=torch.int64, device=dev)
        self._ep_start = torch.as_tensor(np.asarray(start, np.float64), device=dev)
        self._ep_heading = torch.as_tensor(np.asarray(heading, np.float64), device=dev)
        self._ep_goal = torch.as_tensor(np.asarray(goal, np.float64), device=dev)

    def seed(self, seed):
        """Reseed the device generator (sampled episodes and sensor noise) and restart the file."""
        self.generator.manual_seed(0 if seed is None else int(seed))
        self._queue_next.zero_()
        self.scene_count.fill_(self.episodes_per_scene)  # the first episode picks a scene

    def _start_episodes(self, ended):
        """Start the next episode of every env where ``ended`` (a bool tensor) is set."""
        if self._sampling:
            self._sample_episodes(ended)
        else:
            order = torch.cumsum(ended.long(), 0) - 1
            idx = (self._queue_next + order) % len(self.episodes)
            self._queue_next.add_(ended.long().sum()).remainder_(len(self.episodes))
            _put(self.scene, ended, self._ep_scene[idx])
            _put(self.field_id, ended, self._ep_field[idx])
            _put(self.pos, ended, self._ep_start[idx])
            _put(self.heading, ended, _wrap(self._ep_heading[idx]))
            _put(self.goal, ended, self._ep_goal[idx])
            _put(self.episode_index, ended, idx)
        self.steps.masked_fill_(ended, 0)
        self.path_length.masked_fill_(ended, 0.0)
        d = self.distances()
        _put(self.shortest, ended, d)
        _put(self.prev_distance, ended, d)

    def _sample_episodes(self, ended):
        bank = self.bank
        u = self._u
        switch = ended & (self.scene_count >= self.episodes_per_scene)
        new_scene = (u[0] * len(bank.scenes)).long().clamp_(max=len(bank.scenes) - 1)
        _put(self.scene, switch, new_scene)
        self.scene_count.masked_fill_(switch, 0).add_(ended.long())
        ok = bank.goal_ok[self.scene]                                   # (N, G)
        k = (u[1] * ok.sum(1)).long()
        g = (torch.cumsum(ok.long(), 1) <= k[:, None]).sum(1)          # the k-th valid goal
        g = g.clamp_(max=ok.shape[1] - 1)
        off, cnt = bank.start_off[self.scene, g], bank.start_cnt[self.scene, g]
        cell = bank.start_cells[off + torch.minimum((u[2] * cnt).long(), cnt - 1)]
        cols = bank.cols[self.scene]
        res = self.resolution
        start = torch.stack([((cell % cols).double() + 0.5) * res,
                             (torch.div(cell, cols, rounding_mode="floor").double() + 0.5) * res], 1)
        _put(self.pos, ended, start)
        _put(self.heading, ended, _wrap(u[3] * (2 * math.pi) - math.pi))
        _put(self.goal, ended, bank.goals[self.scene, g])
        _put(self.field_id, ended, bank.pool_field[self.scene, g])

    def reset(self, seed=None):
        """Start every env's next episode (reseeding first when ``seed`` is given); returns
        ``(obs, info)``."""
        if seed is not None:
            self.seed(seed)
        else:
            self._queue_next.zero_()
        self._draw()
        self._start_episodes(self._all)
        return self.observe(), {"distance_to_goal": self.prev_distance.float()}

    # ---- per-step work -----------------------------------------------------------------------
    def distances(self):
        """Geodesic distance of every env to its goal (float64, metres): the reference's lookup."""
        bank, res = self.bank, self.resolution
        pos = self.pos
        cols = bank.cols[self.scene]
        base_f = bank.field_off[self.field_id]
        u = pos[:, 0] / res - 0.5
        v = pos[:, 1] / res - 0.5
        c0, r0 = torch.floor(u), torch.floor(v)
        base = base_f + r0.long() * cols + c0.long()
        dc, dr = self._dc, self._dr
        corner = base[:, None] + dc.long() + dr.long() * cols[:, None]
        du = (u - c0)[:, None] - dc
        dv = (v - r0)[:, None] - dr
        best = (bank.field[corner].double() + res * torch.sqrt(du * du + dv * dv)).min(1).values
        own_c = torch.floor(pos[:, 0] / res)
        own_r = torch.floor(pos[:, 1] / res)
        own = bank.field[base_f + own_r.long() * cols + own_c.long()].double()
        centre_d = res * torch.hypot(own_c + 0.5 - self.goal[:, 0] / res,
                                     own_r + 0.5 - self.goal[:, 1] / res)
        direct = (own - centre_d).abs() < 1e-4
        return torch.where(direct, torch.hypot(pos[:, 0] - self.goal[:, 0],
                                               pos[:, 1] - self.goal[:, 1]), best)

    def _free_prefix(self, start, disp, scene):
        """How many of the move's sample points each agent passes before a non-navigable one."""
        bank = self.bank
        px = start[:, 0:1] / self.resolution + self._frac * disp[:, 0:1]
        py = start[:, 1:2] / self.resolution + self._frac * disp[:, 1:2]
        flat = (bank.nav_off[scene][:, None] + torch.floor(py).long() * bank.cols[scene][:, None]
                + torch.floor(px).long())
        ok = bank.nav[flat.clamp(0, bank.nav.numel() - 1)]
        blocked = ~ok
        first = blocked.long().argmax(1)
        return torch.where(blocked.any(1), first, self._samples)

    def _move(self, fwd):
        """MOVE_FORWARD for the envs in ``fwd``: straight, then sliding along a wall it met."""
        s = self._samples
        h = self.heading
        disp = torch.stack([-torch.sin(h), -torch.cos(h)], 1) * FORWARD_STEP_M
        free = self._free_prefix(self.pos, disp, self.scene)
        new = self.pos + disp * (free / s)[:, None]
        collided = free < s
        rest = disp * (1.0 - free / s)[:, None]
        zero = torch.zeros_like(rest[:, 0])
        slide_x = torch.stack([rest[:, 0], zero], 1)
        slide_y = torch.stack([zero, rest[:, 1]], 1)
        got_x = self._free_prefix(new, slide_x, self.scene)
        got_y = self._free_prefix(new, slide_y, self.scene)
        step_x = slide_x * (got_x / s)[:, None]
        step_y = slide_y * (got_y / s)[:, None]
        use_x = step_x[:, 0].abs() >= step_y[:, 1].abs()
        slid = new + torch.where(use_x[:, None], step_x, step_y)
        new = torch.where(collided[:, None], slid, new)
        _put(self.path_length, fwd, self.path_length + torch.linalg.vector_norm(new - self.pos,
                                                                                dim=1))
        _put(self.pos, fwd, new)
        return collided & fwd

    def check_actions(self, actions):
        """``actions`` as an int64 device tensor of shape (N,); numpy or list input is
        range-checked, a tensor only for its shape and dtype."""
        n = self.num_envs
        if isinstance(actions, torch.Tensor):  # the trainer's: checked without reading it back
            if actions.numel() != n or actions.is_floating_point():
                raise ValueError(f"actions must be {n} integers (0 STOP, 1 MOVE_FORWARD, "
                                 f"2 TURN_LEFT, 3 TURN_RIGHT), got a {actions.dtype} tensor of "
                                 f"shape {tuple(actions.shape)}")
            return actions.reshape(n).to(self.device, torch.int64)
        a = np.asarray(actions)
        if a.size == n:
            a = a.reshape(n)
        if a.shape != (n,) or not (np.issubdtype(a.dtype, np.integer) or (
                np.issubdtype(a.dtype, np.floating) and np.all(a == np.round(a)))):
            raise ValueError(f"actions must be {n} integers (0 STOP, 1 MOVE_FORWARD, 2 TURN_LEFT, "
                             f"3 TURN_RIGHT), got {np.asarray(actions)!r}")
        if a.min() < 0 or a.max() >= NUM_ACTIONS:
            raise ValueError(f"actions must be in [0, {NUM_ACTIONS}) (0 STOP, 1 MOVE_FORWARD, "
                             f"2 TURN_LEFT, 3 TURN_RIGHT), got {a.tolist()}")
        return torch.as_tensor(a.astype(np.int64), device=self.device)

    def step(self, actions):
        """Apply one action per env and auto-reset the envs whose episode ended (their observation
        is the next episode's first; the info describes the ended one). Returns ``(obs, reward,
        terminated, truncated, info)``. On cuda (``graph=True``) the returned tensors are the
        captured step's outputs: the next step overwrites them, so keep a copy of what must last
        (the rollout storage copies)."""
        self._actions.copy_(self.check_actions(actions))
        self._draw()
        if self._graph is not None:
            self._graph.replay()
            return self._out
        if self._graph_wanted and self._eager_steps >= 2:
            self._capture()
            if self._graph is not None:
                self._graph.replay()
                return self._out
        self._eager_steps += 1
        return self._step()

    def _capture(self):
        """Capture :meth:`_step` as a CUDA graph (on failure: warn once and stay eager)."""
        import warnings

        graph = torch.cuda.CUDAGraph()
        try:
            torch.cuda.current_stream(self.device).synchronize()  # once, before capturing
            with torch.cuda.graph(graph):
                out = self._step()
        except RuntimeError as exc:  # pragma: no cover - depends on the CUDA runtime
            self._graph_wanted = False
            warnings.warn(f"TorchPointNavSim: CUDA graph capture failed ({exc}); stepping "
                          "eagerly (slower)", RuntimeWarning, stacklevel=3)
            return
        self._graph, self._out = graph, out

    def _draw(self):
        """This step's random numbers, drawn outside any captured graph (episode sampling and
        sensor noise read these buffers)."""
        self._u.uniform_(generator=self.generator)
        if self._depth_noise is not None:
            self._depth_noise.normal_(generator=self.generator)
        if self._goal_noise is not None:
            self._goal_noise.normal_(generator=self.generator)

    def _step(self):
        a = self._actions
        collided = self._move(a == Action.MOVE_FORWARD)
        turn = (a == Action.TURN_LEFT).double() - (a == Action.TURN_RIGHT).double()
        self.heading.copy_(_wrap(self.heading + TURN_ANGLE_RAD * turn))
        self.steps.add_(1)
        dist = self.distances()
        terminated = a == Action.STOP
        success = terminated & (dist < SUCCESS_DISTANCE_M)
        truncated = ~terminated & (self.steps >= self.max_episode_steps)
        reward = (SLACK_REWARD + (self.prev_distance - dist)
                  + SUCCESS_REWARD * success.double()).float()
        done = terminated | truncated
        self.prev_distance.copy_(dist)
        denom = torch.maximum(self.shortest, self.path_length)
        spl = torch.where(denom > 0, success.double() * self.shortest / torch.where(
            denom > 0, denom, 1.0), success.double())
        info = {"distance_to_goal": dist.float(), "success": success,
                "spl": torch.where(done, spl, 0.0).float(),
                "path_length": self.path_length.float(), "elapsed_steps": self.steps.clone(),
                "collided": collided, "episode_index": self.episode_index.clone()}
        self._start_episodes(done)
        return self.observe(), reward, terminated, truncated, info

    def observe(self):
        """Every env's observations (float32 tensors on the device)."""
        depth = self.render()
        dx = self.goal[:, 0] - self.pos[:, 0]
        dy = self.goal[:, 1] - self.pos[:, 1]
        s, c = torch.sin(self.heading), torch.cos(self.heading)
        ahead = -dx * s - dy * c
        left = -dx * c + dy * s
        goal = torch.stack([torch.hypot(dx, dy), torch.atan2(left, ahead)], 1)
        if self._depth_noise is not None:
            depth = (depth + (self._depth_noise * self.depth_noise_std).float()).clamp_(0.0, 1.0)
        if self._goal_noise is not None:
            goal = goal + self._goal_noise * self.pointgoal_noise_std
            goal = torch.stack([goal[:, 0].abs(), _wrap(goal[:, 1])], 1)
        return {"depth": depth, "pointgoal_with_gps_compass": goal.float()}

    def render(self):
        """Depth images (N, size, size, 1) float32 in [0, 1]: the reference camera's."""
        n, w = self.num_envs, self.camera.size
        phi = (self._col_angle[None, :] - self.heading[:, None]).reshape(-1)
        t = self._cast(self.pos[self._ray_env] / self.resolution,
                       torch.stack([torch.sin(phi), -torch.cos(phi)], 1),
                       self.scene[self._ray_env])
        wall = torch.clamp(t.view(n, w) * self._col_scale, max=1.0).float()
        return torch.minimum(wall[:, None, :], self._plane[None, :, None])[..., None]

    def _cast(self, origin, direction, scene):
        """Distance (cells) along each ray to the first blocked cell, capped at its ``t_max``."""
        bank = self.bank
        return self._caster(origin, direction, scene, self._t_max, bank.table, bank.table_off,
                            bank.cells, bank.cols, chunks=self._chunks,
                            early_exit=self._early_exit, fused=self._compiled)


def _cast_rays(origin, direction, scene, t_max, table, table_off, cells, cols, *, chunks,
               early_exit, fused=False):
    """Distance (cells) along each ray (``origin``, ``direction``: (R, 2) float64, in cells) to
    the first blocked cell of its scene's ray-caster table (:class:`SceneBank`), capped at its
    ``t_max``: free-space jumps, then ``chunks`` cell-by-cell chunks. ``early_exit``: stop the
    chunks once every ray is done (reads a flag back from the device; not under torch.compile).
    ``fused``: write the chunks as plain whole-array formulas, which torch.compile fuses into one
    kernel (eagerly they are slower; the result is the same to the bit). Pure tensor code, so
    :class:`TorchPointNavSim` runs it eagerly or through torch.compile."""
    last = table.numel() - 1
    ox, oy = origin[:, 0], origin[:, 1]
    dx, dy = direction[:, 0], direction[:, 1]
    tiny = 1e-12
    dx = torch.where(dx.abs() < tiny, torch.copysign(torch.full_like(dx, tiny), dx), dx)
    dy = torch.where(dy.abs() < tiny, torch.copysign(torch.full_like(dy, tiny), dy), dy)
    idx, idy = 1.0 / dx, 1.0 / dy
    linf = 1.0 / torch.maximum(dx.abs(), dy.abs())
    sx = torch.where(dx > 0, 1.0 + _EPS, -_EPS)
    sy = torch.where(dy > 0, 1.0 + _EPS, -_EPS)
    cols = cols[scene]
    base = table_off[scene] + cells[scene] * (2 * (dx < 0).long() + (dy < 0).long())
    t = torch.zeros_like(ox)
    # Free-space jumps: a ray in a free cell jumps through the largest free square ahead of
    # it (never over a wall), or at least to the next cell boundary; in a wall it stays.
    for _ in range(_SKIP_ITERS):
        px, py = ox + t * dx, oy + t * dy
        ix, iy = px.long(), py.long()  # positions are positive: truncation is floor
        val = table[base + iy * cols + ix].double()
        adv = torch.maximum(val * linf, torch.minimum((ix + sx - px) * idx,
                                                      (iy + sy - py) * idy))
        t = t + torch.where(val < 0, 0.0, adv)
    px, py = ox + t * dx, oy + t * dy
    done = (table[base + py.long() * cols + px.long()] < 0) | (t >= t_max)
    # Cell-by-cell chunks for the rest: each checks the next _CHUNK boundaries along x and
    # along y and advances at least _CHUNK - 1 cells, so ``chunks`` of them finish any ray.
    k = torch.arange(_CHUNK, dtype=origin.dtype, device=origin.device)[None, :]
    stepx, stepy = torch.sign(dx), torch.sign(dy)
    aix, aiy = idx.abs(), idy.abs()
    kx, ky = k * aix[:, None], k * aiy[:, None]
    if not fused:
        # Eagerly, every op writes a (rays x _CHUNK) array: the products with k once here, the
        # cell indices summed in place as int64 (exact integers, so the same as the float64 sums;
        # int32 could overflow on near-axis rays before the clamp), the first hit by argmax (the
        # boundary times grow with k) instead of a masked minimum over an array of infinities.
        kstepx = (k * stepx[:, None]).long()
        kstepy = (k * (stepy * cols)[:, None]).long()
        cols_k, dyc, dxc = cols[:, None], dy[:, None], dx[:, None]
        oyc, oxc = oy[:, None], ox[:, None]
    for _ in range(chunks):
        if early_exit and bool(done.all()):
            break
        px, py = ox + t * dx, oy + t * dy
        cx, cy = torch.floor(px), torch.floor(py)
        ax = t + (cx + sx - px) * idx
        ay = t + (cy + sy - py) * idy
        tx = ax[:, None] + kx
        ty = ay[:, None] + ky
        # The cell beyond each x boundary (the row where the ray crosses it), and each y's.
        if fused:
            flat_x = ((base + cx + stepx)[:, None] + k * stepx[:, None]
                      + torch.floor(oy[:, None] + tx * dy[:, None]) * cols[:, None])
            flat_y = ((base + (cy + stepy) * cols)[:, None] + k * (stepy * cols)[:, None]
                      + torch.floor(ox[:, None] + ty * dx[:, None]))
            hit_x = table[flat_x.clamp(0, last).long()] < 0
            hit_y = table[flat_y.clamp(0, last).long()] < 0
            inf = torch.full_like(tx, math.inf)
            hit = torch.minimum(torch.where(hit_x, tx, inf).min(1).values,
                                torch.where(hit_y, ty, inf).min(1).values)
        else:
            fx = torch.mul(tx, dyc).add_(oyc).floor_().long().mul_(cols_k)
            fx.add_(kstepx).add_((base + cx + stepx).long()[:, None]).clamp_(0, last)
            fy = torch.mul(ty, dxc).add_(oxc).floor_().long()
            fy.add_(kstepy).add_((base + (cy + stepy) * cols).long()[:, None]).clamp_(0, last)
            hit_x = (table[fx] < 0).view(torch.uint8)
            hit_y = (table[fy] < 0).view(torch.uint8)
            hx = torch.where(hit_x.amax(1) > 0, ax + hit_x.argmax(1).double() * aix, math.inf)
            hy = torch.where(hit_y.amax(1) > 0, ay + hit_y.argmax(1).double() * aiy, math.inf)
            hit = torch.minimum(hx, hy)
        t_end = torch.minimum(tx[:, -1], ty[:, -1])
        now = (hit <= t_end) | (t_end >= t_max)
        t = torch.where(done, t, torch.where(now, torch.minimum(hit, t_end), t_end))
        done = done | now
    # A ray that hit stopped a hair inside its first blocked cell: the exact time it entered
    # that cell (the later of its x and y slab entries) is the answer.
    px, py = ox + t * dx, oy + t * dy
    hit = table[(base + torch.floor(py) * cols + torch.floor(px)).clamp(0, last).long()] < 0
    tx = (torch.floor(px) + (dx < 0).double() - ox) * idx
    ty = (torch.floor(py) + (dy < 0).double() - oy) * idy
    entry = torch.minimum(torch.maximum(tx, ty), t)
    return torch.where(hit, torch.minimum(entry, t_max), t_max)


def _put(state, mask, new):
    """``state[mask] = new[mask]`` in place, without reading ``mask`` back to the host."""
    m = mask.view(-1, *[1] * (state.dim() - 1))
    state.copy_(torch.where(m, new, state))


def _wrap(angle):
    """Wrap angles to ``[-pi, pi)`` as the reference's ``wrap_angle`` does."""
    return torch.remainder(angle + math.pi, 2.0 * math.pi) - math.pi
