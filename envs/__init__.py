"""Navigation environments for wagma-rl.

``import envs`` registers ``"PointNav-v0"`` (the embedded simulator) with gymnasium, with
:class:`PointNavVectorEnv` as its vector entry point (``gymnasium.make_vec``).
:func:`make_vector_env` is the one factory the trainer uses: ``backend="pointnav"`` (default,
always available) or ``backend="habitat"`` (needs habitat-sim and habitat-lab);
:func:`make_eval_env` gives a backend's fixed evaluation episode set. Both take the same
backend-neutral options (``split``, ``seed``, ``depth_size``, ``max_episode_steps``,
``episodes``, ``scenes``); anything else is the backend's own option. Both run their envs in
this process (``workers="inprocess"``) or each in its own worker process
(``workers="process"``, :class:`ProcessVectorEnv`); :class:`InProcessAsync` gives an
in-process env the pool's asynchronous calls.
"""

import gymnasium as gym

from .eval_set import EvalSet
from .pointnav import Action, PointNavEnv, PointNavVectorEnv
from .pool import EnvWorkerError, InProcessAsync, ProcessVectorEnv, WorkerEnvFn

__all__ = ["PointNavEnv", "PointNavVectorEnv", "Action", "make_vector_env", "make_eval_env",
           "EvalSet", "BACKENDS", "WORKERS", "ProcessVectorEnv", "InProcessAsync",
           "EnvWorkerError"]

BACKENDS = ("pointnav", "habitat")
WORKERS = ("inprocess", "process")

if "PointNav-v0" not in gym.registry:
    # ``gym.make_vec("PointNav-v0", n)`` builds the batched simulator itself (the vector entry
    # point), not n single envs behind gymnasium's SyncVectorEnv.
    gym.register(id="PointNav-v0", entry_point="envs.pointnav.env:PointNavEnv",
                 vector_entry_point="envs.pointnav.vector_env:PointNavVectorEnv",
                 max_episode_steps=None, disable_env_checker=True)


def make_vector_env(backend="pointnav", num_envs=1, *, workers="inprocess", timeout=300.0,
                    start_timeout=None, wrap_worker=None, device=None, **kwargs):
    """A batched PointNav environment of ``num_envs`` envs with the gymnasium vector API.

    ``backend="pointnav"``: :class:`PointNavVectorEnv` (``kwargs`` are its options).
    ``backend="habitat"``: :class:`envs.habitat.HabitatVectorEnv` over real Habitat scenes;
    raises ImportError with install help when habitat-sim/habitat-lab are missing.

    ``workers="inprocess"`` (default): that vector env, in this process. ``workers="process"``:
    a :class:`ProcessVectorEnv` whose worker ``i`` runs ``make_vector_env(backend, 1,
    **kwargs)`` with ``seed + i``, ``shard_index * num_envs + i`` of ``num_shards * num_envs``
    (its own part of an episode file; ``shard_index``/``num_shards`` are this rank's, default 0
    of 1; a habitat worker also gets ``envs_per_shard=num_envs`` and ``scene_seed=seed``, so it
    takes the scenes of env ``i`` of this rank) and ``gpu_device_id`` (one id, or one per env), then
    ``wrap_worker(env, i)`` when given (picklable). ``timeout``/``start_timeout``: the
    pool's (seconds for a step or reset / for starting a worker and building its env).

    ``device`` (a torch device, pointnav in-process only): the batch simulator on that device,
    :class:`envs.pointnav.torch_vector_env.TorchPointNavVectorEnv`, whose results are tensors
    there; None (default): the numpy simulator.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown environment backend {backend!r}: use one of {list(BACKENDS)}")
    if device is not None:
        if backend != "pointnav" or workers != "inprocess":
            raise ValueError(f"device={device!r}: the device batch simulator is the embedded "
                             f"PointNav simulator in this process (backend='pointnav', "
                             f"workers='inprocess'), got backend={backend!r}, workers={workers!r}")
        from .pointnav.torch_vector_env import TorchPointNavVectorEnv

        return TorchPointNavVectorEnv(num_envs, device=device, **kwargs)
    if workers == "inprocess":
        if wrap_worker is not None:
            raise TypeError("wrap_worker wraps the env of a worker process: it needs "
                            "workers='process'")
        return _build(backend, num_envs, **kwargs)
    if workers != "process":
        raise ValueError(f"workers must be one of {list(WORKERS)}, got {workers!r}")
    n = int(num_envs)
    if n < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs!r}")
    seed = int(kwargs.pop("seed", 0))
    shard, shards = int(kwargs.pop("shard_index", 0)), int(kwargs.pop("num_shards", 1))
    if not 0 <= shard < shards:
        raise ValueError(f"shard_index must be in [0, num_shards), got {shard} of {shards}")
    gpus = kwargs.pop("gpu_device_id", None)
    if gpus is not None and not isinstance(gpus, int) and len(gpus) < n:
        raise ValueError(f"gpu_device_id: {len(gpus)} GPUs for {n} envs; give one id or one "
                         "per env")
    if backend == "habitat":  # a worker's env knows its rank and place (scene sharding)
        kwargs.update(envs_per_shard=n, scene_seed=kwargs.get("scene_seed", seed))
    fns = []
    for i in range(n):
        options = dict(kwargs, seed=seed + i, shard_index=shard * n + i, num_shards=shards * n)
        gpu = gpus if gpus is None or isinstance(gpus, int) else gpus[i]
        if gpu is not None:
            options["gpu_device_id"] = gpu
        fns.append(WorkerEnvFn(_build, i, wrap=wrap_worker, backend=backend, num_envs=1,
                               **options))
    return ProcessVectorEnv(fns, timeout=timeout, start_timeout=start_timeout)


def _build(backend, num_envs, **kwargs):
    """The backend's vector env in this process (a worker's ``env_fn`` too)."""
    if backend == "pointnav":
        return PointNavVectorEnv(num_envs, **kwargs)
    from .habitat import HabitatVectorEnv

    return HabitatVectorEnv(num_envs, **kwargs)


def make_eval_env(backend="pointnav", num_envs=1, **kwargs):
    """The backend's evaluation set as an :class:`EvalSet` (a vector env of at most
    ``num_envs`` envs that runs each episode once, the episode ids, their source).

    Common options: ``split``, ``episodes`` (an episode file; None: the backend's own set for
    ``split``), ``num_episodes`` (the first that many; 0: all), ``seed``, ``episode_dir`` (where
    a backend may keep an episode set it draws), ``depth_size``, ``max_episode_steps``,
    ``workers`` (``"process"``: one worker process per env, ``timeout`` the pool's); the rest
    are the backend's options as for :func:`make_vector_env`.
    """
    if backend == "pointnav":
        from .pointnav.vector_env import eval_env
    elif backend == "habitat":
        from .habitat.vector_env import eval_env
    else:
        raise ValueError(f"unknown environment backend {backend!r}: use one of {list(BACKENDS)}")
    return eval_env(num_envs, **kwargs)
