"""``HabitatVectorEnv``: N habitat environments behind the embedded simulator's vector API, and
the habitat backend's evaluation set (:func:`eval_env`)."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from ..eval_set import EvalSet
from ..pointnav.env import check_sensors
from .adapter import HabitatEnv
from .loader import (DEFAULT_CONFIG, RGB_CAMERA, add_rgb_camera, load_dataset,
                     make_habitat_config, make_habitat_gym_env,
                     override, require_habitat, restrict_scenes, scenes_to_load, subset)
from .placement import GPU_KEY, SCENE_SPLITS, eval_scene_split, scene_split

__all__ = ["HabitatVectorEnv", "eval_env", "eval_shard_env", "config_overrides", "GPU_KEY"]

_SENSOR = "habitat.simulator.agents.main_agent.sim_sensors.depth_sensor"


#: habitat's TopDownMap measure added to the task (as habitat-baselines' docs add it); its fog
#: of war off (the maps shown here do not use it, and it costs a numba compile per process).
TOP_DOWN_MAP = ("+habitat/task/measurements@habitat.task.measurements.top_down_map=top_down_map",
                "habitat.task.measurements.top_down_map.fog_of_war.draw=False")


def config_overrides(*, split=None, depth_size=None, max_episode_steps=None, episodes=None,
                     scenes_dir=None, shuffle=None, sensors=("depth",), top_down_map=0):
    """The Hydra overrides for the backend-neutral options (values quoted where they are text;
    ``sensors`` with ``"rgb"`` adds habitat's RGB camera, :func:`_config` sizes it;
    ``top_down_map`` > 0 adds habitat's ``top_down_map`` measure, :data:`TOP_DOWN_MAP`)."""
    out = [RGB_CAMERA] if "rgb" in check_sensors(sensors) else []
    if top_down_map:
        out += TOP_DOWN_MAP
    if depth_size is not None:
        out += [f"{_SENSOR}.width={int(depth_size)}", f"{_SENSOR}.height={int(depth_size)}"]
    if max_episode_steps is not None:
        out.append(f"habitat.environment.max_episode_steps={int(max_episode_steps)}")
    if split is not None:
        out.append(override("habitat.dataset.split", split))
    if episodes is not None:
        out.append(override("habitat.dataset.data_path", episodes))
    if scenes_dir is not None:
        out.append(override("habitat.dataset.scenes_dir", scenes_dir))
    if shuffle is not None:
        out.append(f"habitat.environment.iterator_options.shuffle={bool(shuffle)}")
    return out


def _config(config, overrides, sensors):
    """habitat's config of ``config`` and ``overrides`` with an RGB camera as large as the depth
    one when ``sensors`` has ``"rgb"``."""
    cfg = make_habitat_config(config, overrides=overrides)
    return add_rgb_camera(cfg) if "rgb" in sensors else cfg


def _check_scenes(scenes):
    if scenes != "default":
        raise ValueError("env.scenes selects the embedded simulator's scene sets; for habitat, "
                         "choose scenes through habitat.dataset (env.options: episodes, "
                         "scenes_dir, overrides)")


def _check_one_simulator_per_process(num_envs):
    """habitat-sim 0.3.3 holds one GL context per process: a second simulator in the same process
    crashed (segmentation fault in training, ``GL::Context::current(): no current context`` at
    exit) in the real run of docs/environments.md. Refuse it with the fix instead (the
    contract tests' stand-in enforces the same rule). The process pool
    (``workers="process"``) builds one env per process and always passes."""
    try:
        import habitat_sim  # noqa: F401
    except ImportError:  # a custom env_fn without habitat-sim: no simulator to share a process
        return
    if num_envs > 1:
        raise ValueError(f"{num_envs} environments in one process: habitat-sim runs one simulator "
                         "per process (a second one crashes); run each env in its own process "
                         "(workers='process' in envs.make_vector_env / make_eval_env) or set "
                         "env.num_envs=1 and eval.num_envs=1")


def _gpu_of(gpu_device_id, i, num_envs):
    """Env ``i``'s renderer GPU: one id for every env, or a sequence of (at least) one per env."""
    if gpu_device_id is None or isinstance(gpu_device_id, (int, np.integer)):
        return gpu_device_id
    gpus = list(gpu_device_id)
    if len(gpus) < num_envs:
        raise ValueError(f"gpu_device_id: {len(gpus)} GPUs for {num_envs} envs; give one id or "
                         "one per env")
    return gpus[i]


def _placement(num_envs, shard_index, num_shards, envs_per_shard):
    """``i -> (env, envs per rank, rank, world size)`` of this vector env's env ``i``."""
    per = num_envs if envs_per_shard is None else int(envs_per_shard)
    total = num_shards * num_envs
    if per < 1 or total % per:
        raise ValueError(f"envs_per_shard={envs_per_shard!r} must divide the job's "
                         f"{total} envs")

    def place(i):
        g = shard_index * num_envs + i
        return g % per, per, g // per, total // per

    return place


def _split_scenes(scenes, env, num_envs, rank, world_size, *, seed, rule):
    """:func:`scene_split` (``HabitatVectorEnv``'s argument of that name hides it there)."""
    return scene_split(scenes, env, num_envs, rank=rank, world_size=world_size, seed=seed,
                       rule=rule)


def _gpu_overrides(gpu):
    return [] if gpu is None else [f"{GPU_KEY}={int(gpu)}"]


class HabitatVectorEnv(VectorEnv):
    """``num_envs`` habitat PointNav environments with SAME_STEP autoreset, stepped in turn in
    this process, with the same observations, actions and ``infos`` arrays as
    :class:`envs.PointNavVectorEnv`.

    ``config``: habitat-lab config path (default: depth-only PointNav, :data:`DEFAULT_CONFIG`);
    ``overrides``: extra Hydra ``"key=value"`` overrides, applied last. The common options map
    onto the config: ``seed`` (env ``i``: ``habitat.seed = seed + i``), ``depth_size`` (depth
    sensor width and height), ``max_episode_steps``, ``split`` (``habitat.dataset.split``),
    ``episodes`` (``habitat.dataset.data_path``, may hold ``{split}``) and ``scenes_dir``
    (``habitat.dataset.scenes_dir``). ``gpu_device_id``: the renderer's GPU
    (``habitat.simulator.habitat_sim_v0.gpu_device_id``; one id, or one per env; None keeps the
    config's; :func:`envs.habitat.worker_gpu` gives the rule). Scenes
    (:func:`envs.habitat.placement.scene_split`): env ``i`` is env ``g % E`` of rank ``g // E``
    of ``num_shards * num_envs // E`` ranks, where ``g = shard_index * num_envs + i`` and ``E``
    is ``envs_per_shard`` (default ``num_envs``): pass the rank and the world size as
    ``shard_index``/``num_shards`` (a worker process of the pool gets its own flattened index and
    ``envs_per_shard``). ``scene_split``: ``"rank"`` (default: each rank deals the whole split
    over its envs, shuffled by ``scene_seed`` (default ``seed``) and the rank) or ``"global"``
    (one deal over every env of the job). ``sensors``: ``["depth"]`` or ``["depth", "rgb"]``
    (an RGB camera of the depth camera's size is added to the config; ``obs["rgb"]`` uint8).
    ``infos`` carry habitat's other scalar measures too (``soft_spl``, ``collisions.count``,
    ...), as float arrays, at a reset their start values. ``top_down_map``: with N > 0 habitat's
    ``top_down_map`` measure is added to the task and ``infos["top_down_map"]`` holds each env's
    map as an RGB image of at most N pixels a side (object array; at a step that ends an
    episode, the ended one's; :func:`envs.habitat.adapter.colorize_top_down_map`) and
    ``infos["next_top_down_map"]`` the next episode's first map where one began (else None).
    ``env_fn(i) -> (habitat gym env, max_episode_steps)`` replaces the config-based construction
    (custom setups, tests; the scene and GPU options then do nothing); ``episode_limits[i]``:
    env ``i``'s episodes after its first ``episode_limits[i]`` are reported with ``counted``
    False (evaluation). More than one env in a process is refused when habitat-sim is
    installed (one simulator per process); ``envs.make_vector_env(..., workers="process")``
    runs each in its own.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs, *, config=DEFAULT_CONFIG, overrides=(), scenes="default",
                 split=None, seed=0, depth_size=None, max_episode_steps=None, episodes=None,
                 scenes_dir=None, env_fn=None, episode_limits=None, gpu_device_id=None,
                 shard_index=0, num_shards=1, envs_per_shard=None, scene_seed=None,
                 scene_split="rank", sensors=("depth",), top_down_map=0):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs!r}")
        if not 0 <= int(shard_index) < int(num_shards):
            raise ValueError(f"shard_index must be in [0, num_shards), got {shard_index!r} of "
                             f"{num_shards!r}")
        _check_scenes(scenes)
        sensors = check_sensors(sensors)
        if scene_split not in SCENE_SPLITS:
            raise ValueError(f"scene_split must be one of {list(SCENE_SPLITS)}, got "
                             f"{scene_split!r} (docs/environments.md, scene sharding)")
        if env_fn is None:
            require_habitat()  # fail at once, before any other work, with install help
            common = config_overrides(split=split, depth_size=depth_size,
                                      max_episode_steps=max_episode_steps, episodes=episodes,
                                      scenes_dir=scenes_dir, sensors=sensors,
                                      top_down_map=top_down_map)
            n = int(num_envs)
            gpus = [_gpu_of(gpu_device_id, i, n) for i in range(n)]
            place = _placement(n, int(shard_index), int(num_shards), envs_per_shard)
            split_options = dict(seed=int(seed if scene_seed is None else scene_seed),
                                 rule=scene_split)

            def env_fn(i):
                cfg = _config(config, [*common, f"habitat.seed={int(seed) + i}",
                                       *_gpu_overrides(gpus[i]), *overrides], sensors)
                every = scenes_to_load(cfg)
                mine = _split_scenes(every, *place(i), **split_options)
                if len(mine) < len(set(every)):
                    restrict_scenes(cfg, mine)
                return make_habitat_gym_env(cfg, sensors=sensors)

        _check_one_simulator_per_process(int(num_envs))
        self.envs = []
        for i in range(int(num_envs)):
            henv, steps = env_fn(i)
            self.envs.append(HabitatEnv(henv, max_episode_steps=steps if max_episode_steps is None
                                        else max_episode_steps, sensors=sensors,
                                        top_down_map=top_down_map))
        self._maps = int(top_down_map) > 0
        self.num_envs = len(self.envs)
        self._limits = [None] * self.num_envs if episode_limits is None else list(episode_limits)
        self._started_count = np.zeros(self.num_envs, dtype=np.int64)
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = gym.spaces.Discrete(4)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._seed = seed
        self._started = False

    def _counted(self):
        return np.array([lim is None or n <= lim
                         for n, lim in zip(self._started_count, self._limits)], dtype=bool)

    def reset(self, *, seed=None, options=None):
        """Reset every env (``seed``: env ``i`` reseeded with ``seed + i``)."""
        results = [env.reset(seed=None if seed is None else seed + i)
                   for i, env in enumerate(self.envs)]
        self._started_count[:] = 1
        self._started = True
        return self._stack([r[0] for r in results]), self._infos([r[1] for r in results])

    def step(self, actions):
        """Step every env; a finished env is reset at once (its info describes the ended
        episode, its observation is the next episode's first)."""
        if not self._started:
            raise RuntimeError("call reset() before step()")
        a = np.asarray(actions)
        if a.shape != (self.num_envs,):
            raise ValueError(f"actions must be {self.num_envs} integers (0 STOP, 1 MOVE_FORWARD,"
                             f" 2 TURN_LEFT, 3 TURN_RIGHT), got shape {a.shape}")
        obs, rewards, terms, truncs, infos = [], [], [], [], []
        counted = self._counted()  # of the episodes this step may end
        for i, (env, act) in enumerate(zip(self.envs, a)):
            o, r, term, trunc, info = env.step(act)
            if self._maps:
                info["next_top_down_map"] = None
            if term or trunc:
                o, start = env.reset()
                self._started_count[i] += 1
                if self._maps:
                    info["next_top_down_map"] = start["top_down_map"]
            obs.append(o)
            rewards.append(r)
            terms.append(term)
            truncs.append(trunc)
            infos.append(info)
        out = self._infos(infos)
        out["counted"] = counted
        return (self._stack(obs), np.asarray(rewards, dtype=np.float32),
                np.asarray(terms, dtype=bool), np.asarray(truncs, dtype=bool), out)

    @staticmethod
    def _stack(obs):
        return {k: np.stack([o[k] for o in obs]) for k in obs[0]}

    def _infos(self, infos):
        out = {
            "distance_to_goal": np.array([i["distance_to_goal"] for i in infos], np.float32),
            "success": np.array([i["success"] for i in infos], dtype=bool),
            "spl": np.array([i["spl"] for i in infos], np.float32),
            "episode_id": np.array([i["episode_id"] for i in infos], dtype=object),
            "elapsed_steps": np.array([i["elapsed_steps"] for i in infos], dtype=np.int64),
            "counted": self._counted(),
        }
        for k in ("top_down_map", "next_top_down_map"):  # images (or None): one object each
            if k in infos[0]:
                out[k] = np.empty(len(infos), dtype=object)
                out[k][:] = [i[k] for i in infos]
        # habitat's other measures (soft_spl, collisions.count, ...): float64, NaN where an env
        # does not report one.
        extra = sorted({k for i in infos for k in i if k not in out})
        for k in extra:
            out[k] = np.array([i.get(k, np.nan) for i in infos], dtype=np.float64)
        return out

    def close_extras(self, **kwargs):
        """Close every habitat environment."""
        for env in self.envs:
            env.close()


def _eval_setup(*, split, episodes, num_episodes, seed, config, overrides, depth_size,
                max_episode_steps, scenes_dir, gpu_device_id, sensors, top_down_map,
                scenes_only=None):
    """``(base overrides, config, dataset, chosen episodes)`` of an evaluation set;
    ``scenes_only``: load only those scenes (``content_scenes``; a dataset with one file per
    scene then reads only theirs)."""
    base = [*config_overrides(split=split, depth_size=depth_size,
                              max_episode_steps=max_episode_steps, episodes=episodes,
                              scenes_dir=scenes_dir, shuffle=False, sensors=sensors,
                              top_down_map=top_down_map)]
    cfg = _config(config, [*base, f"habitat.seed={int(seed)}", *overrides], sensors)
    if scenes_only is not None:
        restrict_scenes(cfg, scenes_only)
    dataset = load_dataset(cfg)
    chosen = dataset.episodes[:int(num_episodes) or None]
    if not chosen:
        raise ValueError(f"the habitat dataset {cfg.habitat.dataset.data_path!r} (split "
                         f"{split!r}) holds no episodes")
    return base, cfg, dataset, chosen


def _scene_name(dataset, episode):
    """The scene name ``content_scenes`` selects an episode by (habitat's own rule)."""
    return type(dataset).scene_from_scene_path(episode.scene_id)


def _key(episode):
    return (str(episode.scene_id), str(episode.episode_id))


def _eval_shares(dataset, chosen, num_envs):
    """The evaluation's deal by scene (:func:`eval_scene_split`): per env, its scenes and its
    episodes' keys (scene, episode id)."""
    shares = eval_scene_split([_scene_name(dataset, e) for e in chosen], num_envs)
    return [(sorted({_scene_name(dataset, chosen[k]) for k in share}),
             [_key(chosen[k]) for k in share]) for share in shares]


def _eval_vector_env(indices, count, setup, shares, *, seed, config, overrides,
                     max_episode_steps, gpu_device_id, sensors, top_down_map, **_):
    """A HabitatVectorEnv of the evaluation shares ``indices`` (of ``count``); ``setup``'s
    dataset holds (at least) their episodes."""
    base, _cfg, dataset, _chosen = setup
    by_key = {_key(e): e for e in dataset.episodes}

    def env_fn(j):
        i = indices[j]
        scenes, keys = shares[j]
        cfg_i = _config(config, [*base, f"habitat.seed={int(seed) + i}",
                                 *_gpu_overrides(_gpu_of(gpu_device_id, i, count)), *overrides],
                        sensors)
        restrict_scenes(cfg_i, scenes)
        return make_habitat_gym_env(cfg_i, dataset=subset(dataset, [by_key[k] for k in keys]),
                                    sensors=sensors)

    return HabitatVectorEnv(len(indices), seed=int(seed) + indices[0],
                            max_episode_steps=max_episode_steps, env_fn=env_fn, sensors=sensors,
                            episode_limits=[len(keys) for _, keys in shares],
                            top_down_map=top_down_map)


def eval_shard_env(index, count, share, **options):
    """In a worker process: the one-env HabitatVectorEnv of evaluation share ``index`` of
    ``count``, ``share`` its ``(scenes, episode keys)``; it loads only those scenes
    (``options`` as :func:`eval_env`'s)."""
    require_habitat()
    setup = _eval_setup(**options, scenes_only=share[0])
    return _eval_vector_env([int(index)], int(count), setup, [share], **options)


def eval_env(num_envs, *, split="val", episodes=None, num_episodes=0, seed=0,
             episode_dir=None, config=DEFAULT_CONFIG, overrides=(), scenes="default",
             depth_size=None, max_episode_steps=None, scenes_dir=None, gpu_device_id=None,
             workers="inprocess", timeout=300.0, sensors=("depth",), top_down_map=0):
    """The habitat backend's evaluation set: the episodes of ``split`` of the config's dataset
    (or of the file ``episodes``), the first ``num_episodes`` of them (0: all), in file order,
    dealt by scene over at most ``num_envs`` environments (each scene's episodes on one env, which
    loads only its scenes; at most one env per scene: :func:`eval_scene_split`), each run once.
    ``episode_dir`` is not used (habitat's episodes always come from a dataset file).
    ``workers="process"``: each env in its own worker process (:class:`envs.ProcessVectorEnv`,
    ``timeout`` its timeout), as more than one needs with habitat-sim. ``top_down_map``: as
    :class:`HabitatVectorEnv`'s."""
    _check_scenes(scenes)
    require_habitat()
    options = dict(split=split, episodes=episodes, num_episodes=num_episodes, seed=seed,
                   config=config, overrides=tuple(overrides), depth_size=depth_size,
                   max_episode_steps=max_episode_steps, scenes_dir=scenes_dir,
                   gpu_device_id=gpu_device_id, sensors=check_sensors(sensors),
                   top_down_map=int(top_down_map))
    setup = _eval_setup(**options)
    _, cfg, dataset, chosen = setup
    shares = _eval_shares(dataset, chosen, num_envs)
    n = len(shares)
    if workers == "process":
        from ..pool import ProcessVectorEnv

        venv = ProcessVectorEnv([functools.partial(eval_shard_env, i, n, shares[i], **options)
                                 for i in range(n)], timeout=timeout)
    elif workers == "inprocess":
        venv = _eval_vector_env(list(range(n)), n, setup, shares, **options)
    else:
        raise ValueError(f"workers must be 'inprocess' or 'process', got {workers!r}")
    source = str(cfg.habitat.dataset.data_path).format(split=split)
    return EvalSet(env=venv, episode_ids=[str(e.episode_id) for e in chosen], source=source)
