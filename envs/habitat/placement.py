"""Where a habitat env runs: its share of the dataset's scenes and its renderer's GPU.

Pure rules (no habitat import), so the trainer and the tests can call them anywhere.
"""

from __future__ import annotations

__all__ = ["scene_split", "worker_gpu"]


def scene_split(scenes, index, count):
    """The scenes env ``index`` of ``count`` loads (``habitat.dataset.content_scenes``).

    habitat-baselines' rule (``HabitatVectorEnvFactory.construct_envs``): scene ``k`` goes to
    env ``k % count``; with fewer scenes than envs every env loads all of them. Here ``count``
    spans every env of every rank (env ``i`` of rank ``r`` is ``index = r * num_envs + i`` of
    ``count = world_size * num_envs``), so ranks share the dataset out without talking; for the
    same reason the scenes are sorted where habitat-baselines shuffles them with its process's
    random state. Raises ValueError when there are no scenes.
    """
    if not 0 <= int(index) < int(count):
        raise ValueError(f"shard_index must be in [0, num_shards), got {index!r} of {count!r}")
    scenes = sorted(set(scenes))
    if not scenes:
        raise ValueError("the habitat dataset names no scenes to load; scenes are shared out "
                         "between envs, so check habitat.dataset.data_path and content_scenes")
    if len(scenes) < int(count):
        return scenes
    return scenes[int(index)::int(count)]


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
