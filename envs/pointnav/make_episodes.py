"""Generate a fixed PointNav evaluation set and save it as a Habitat episode file.

    python -m envs.pointnav.make_episodes --scenes default --split val --count 100 \\
        --seed 0 --out data/pointnav_default_val.json.gz

Episodes cycle through the split's scenes in order (so every scene is used evenly) and follow
the scene set's rules (geodesic distance range, geodesic/euclidean ratio). The same arguments
always give the same file.
"""

from __future__ import annotations

import argparse

import numpy as np

from .episodes import sample_episode, save_episodes
from .scenes import get_scene_set, load_scene

__all__ = ["make_episodes", "main"]


def make_episodes(*, scenes="default", split="val", count=100, seed=0, map_resolution=0.05,
                  id_prefix=""):
    """Return ``count`` episodes sampled from ``split`` of scene set ``scenes``.

    ``seed`` is an int or a sequence of ints (numpy seed material); episode ids are
    ``f"{id_prefix}{k}"``.
    """
    if int(count) < 1:
        raise ValueError(f"count must be at least 1, got {count!r}")
    sset = get_scene_set(scenes, resolution=map_resolution)
    ids = sset.scene_ids(split)
    rng = np.random.default_rng(seed)
    episodes = []
    for k in range(int(count)):
        scene = load_scene(ids[k % len(ids)], resolution=map_resolution)
        episodes.append(sample_episode(scene, rng, episode_id=f"{id_prefix}{k}",
                                       geodesic_range=sset.geodesic_range,
                                       min_ratio=sset.min_ratio))
    return episodes


def main(argv=None):
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m envs.pointnav.make_episodes",
                                     description="Generate a PointNav episode file (Habitat "
                                                 "format, gzipped JSON).")
    parser.add_argument("--scenes", default="default",
                        help="scene set name, PNG map or directory of maps (default: default)")
    parser.add_argument("--split", default="val", help="split to draw scenes from (default: val)")
    parser.add_argument("--count", type=int, default=100, help="number of episodes (default: 100)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--map-resolution", type=float, default=0.05,
                        help="metres per pixel of PNG maps (default: 0.05)")
    parser.add_argument("--out", required=True, help="output path, e.g. val.json.gz")
    args = parser.parse_args(argv)
    try:
        episodes = make_episodes(scenes=args.scenes, split=args.split, count=args.count,
                                 seed=args.seed, map_resolution=args.map_resolution)
    except ValueError as exc:
        parser.error(str(exc))
    save_episodes(args.out, episodes)
    dist = np.array([e.geodesic_distance for e in episodes])
    print(f"wrote {len(episodes)} episodes to {args.out} (geodesic distance {dist.min():.2f}-"
          f"{dist.max():.2f} m, mean {dist.mean():.2f} m)")


if __name__ == "__main__":
    main()
