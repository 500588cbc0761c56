"""Where a habitat env runs: its share of the dataset's scenes and its renderer's GPU.

Pure rules (no habitat import), so the trainer and the tests can call them anywhere.
"""

from __future__ import annotations

import numpy as np

__all__ = ["scene_split", "SCENE_SPLITS", "eval_scene_split", "worker_gpu", "renderer_gpu",
           "GPU_KEY"]

#: habitat's config key of the renderer's GPU.
GPU_KEY = "habitat.simulator.habitat_sim_v0.gpu_device_id"

#: The scene-sharding rules (``scene_split``'s ``rule``; ``env.options: {scene_split: ...}``).
SCENE_SPLITS = ("rank", "global")


def _scenes(scenes):
    out = sorted(set(scenes))
    if not out:
        raise ValueError("the habitat dataset names no scenes to load; scenes are shared out "
                         "between envs, so check habitat.dataset.data_path and content_scenes")
    return out


def scene_split(scenes, env, num_envs, *, rank=0, world_size=1, seed=0, rule="rank"):
    """The scenes env ``env`` of rank ``rank``'s ``num_envs`` envs loads
    (``habitat.dataset.content_scenes``).

    ``rule="rank"`` (default, habitat-baselines' ``construct_envs``): every rank deals the whole
    split over its own envs: the scenes are shuffled by a generator seeded with ``(seed,
    rank)`` and scene ``k`` goes to env ``k % num_envs``. Every rank covers the dataset and an
    env holds about ``len(scenes) / num_envs`` scenes at any job size. With fewer scenes than
    envs the deal wraps around (env ``i`` takes the ``i % len(scenes)``-th scene of the shuffle)
    where habitat-baselines would give every env all of them.

    ``rule="global"``: one deal over every env of the job (env ``i`` of rank ``r`` is env
    ``r * num_envs + i`` of ``world_size * num_envs``), of the sorted scenes, the seed unused:
    no two envs of the job hold the same scene while there are enough, so an env holds about
    ``len(scenes) / (world_size * num_envs)`` (less memory and load time on a large dataset), but a
    rank, and under WAGMA a group between its global averages, trains on its own subset. Past
    ``len(scenes)`` envs it wraps around alike (one scene per env, never all).

    Raises ValueError when there are no scenes or an index is out of range.
    """
    env, num_envs, rank, world_size = int(env), int(num_envs), int(rank), int(world_size)
    if not 0 <= env < num_envs:
        raise ValueError(f"env must be in [0, num_envs), got {env} of {num_envs}")
    if not 0 <= rank < world_size:
        raise ValueError(f"shard_index (the rank) must be in [0, num_shards), got {rank} of "
                         f"{world_size}")
    if rule not in SCENE_SPLITS:
        raise ValueError(f"scene_split must be one of {list(SCENE_SPLITS)}, got {rule!r}")
    scenes = _scenes(scenes)
    if rule == "global":
        order, index, count = scenes, rank * num_envs + env, world_size * num_envs
    else:
        rng = np.random.default_rng([int(seed) % 2**32, rank])
        order, index, count = [scenes[k] for k in rng.permutation(len(scenes))], env, num_envs
    if len(order) < count:
        return [order[index % len(order)]]
    return order[index::count]


def eval_scene_split(episode_scenes, num_workers):
    """Evaluation's deal by scene: ``episode_scenes`` (each chosen episode's scene, in file
    order) over at most ``num_workers`` workers, each scene wholly on one worker so that a
    worker loads only its own scenes. Scenes go, most episodes first (then by name), to the
    worker with the fewest episodes so far (then the lowest index). Returns one sorted list of
    episode indices per worker, empty workers left out (fewer scenes than workers: one worker
    per scene)."""
    by_scene: dict[str, list[int]] = {}
    for i, scene in enumerate(episode_scenes):
        by_scene.setdefault(str(scene), []).append(i)
    if not by_scene:
        raise ValueError("no episodes to evaluate")
    n = max(1, min(int(num_workers), len(by_scene)))
    shares: list[list[int]] = [[] for _ in range(n)]
    for scene in sorted(by_scene, key=lambda s: (-len(by_scene[s]), s)):
        w = min(range(n), key=lambda k: (len(shares[k]), k))
        shares[w] += by_scene[scene]
    return [sorted(s) for s in shares]


def worker_gpu(local_rank, worker_index, num_gpus, *, local_size=None):
    """The GPU (``habitat.simulator.habitat_sim_v0.gpu_device_id``) env worker
    ``worker_index`` of the rank with node-local rank ``local_rank`` renders on; None when the
    node has no GPU (``num_gpus`` 0: habitat's default is kept).

    As habitat-baselines' DD-PPO, a rank's envs render on the rank's own GPU, ``local_rank %
    num_gpus`` (observations stay on the device the policy runs on). When the node has more
    GPUs than ranks (``local_size``, the ranks on this node, given and smaller than
    ``num_gpus``), rank ``r`` owns GPUs ``r, r + local_size, ...`` and its workers take them in
    turn.
    """
    num_gpus = int(num_gpus)
    if num_gpus <= 0:
        return None
    if local_rank < 0 or worker_index < 0:
        raise ValueError(f"local_rank and worker_index must be >= 0, got {local_rank}, "
                         f"{worker_index}")
    if local_size is None or int(local_size) >= num_gpus:
        return int(local_rank) % num_gpus
    owned = list(range(int(local_rank) % int(local_size), num_gpus, int(local_size)))
    return owned[int(worker_index) % len(owned)]


def renderer_gpu(rank_gpu, options):
    """``(options, note)``: a rank's habitat env options with its renderer on the rank's GPU.

    ``rank_gpu``: the index of the GPU the rank's policy runs on (None on a CPU: the options are
    returned as they are). ``options``: the env's options (``env.options``). They get
    ``gpu_device_id=rank_gpu`` unless they choose the GPU themselves, by ``gpu_device_id`` or an
    ``overrides`` entry for :data:`GPU_KEY` (the last one wins, as in Hydra): then theirs stays
    and ``note`` is a line saying so, for the run's log; otherwise ``note`` is None.
    """
    options = dict(options)
    if rank_gpu is None:
        return options, None
    rank_gpu = int(rank_gpu)
    chosen = [(f"gpu_device_id={options['gpu_device_id']!r}", options["gpu_device_id"])] \
        if options.get("gpu_device_id") is not None else []
    for item in options.get("overrides") or ():
        key, sep, value = str(item).partition("=")
        if sep and key.strip().lstrip("+~") == GPU_KEY:
            chosen.append((str(item), value.strip()))
    if not chosen:
        options["gpu_device_id"] = rank_gpu
        return options, None
    how, value = chosen[-1]
    return options, (f"env.options sets the habitat renderer's GPU ({how}); it wins over the "
                     f"rank's GPU {rank_gpu}, so observations are rendered on {value} and copied "
                     "to the policy's device each step")
