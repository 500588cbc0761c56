"""Fixed evaluation episode sets in the Habitat episode format, drawn from an embedded scene set."""
from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["make_episode_file"]


def make_episode_file(path: str | Path, *, scenes: str, split: str, num_episodes: int,
                      seed: int) -> Path:
    """Write ``num_episodes`` episodes of ``scenes``/``split`` (scenes taken in turn, starts and
    goals drawn with ``seed``) to ``path`` as gzipped Habitat JSON; the same arguments always give
    the same file. Returns the path."""
    from envs.pointnav import get_scene_set, load_scene, save_episodes
    from envs.pointnav.episodes import sample_episode

    sset = get_scene_set(scenes)
    scene_ids = sset.scene_ids(split)
    rng = np.random.default_rng([seed, num_episodes])
    episodes = []
    for k in range(num_episodes):
        scene = load_scene(scene_ids[k % len(scene_ids)], resolution=sset.resolution)
        episodes.append(sample_episode(scene, rng, episode_id=f"{split}-{k}",
                                       geodesic_range=sset.geodesic_range, min_ratio=sset.min_ratio))
    path = Path(path)
    save_episodes(str(path), episodes)
    return path
