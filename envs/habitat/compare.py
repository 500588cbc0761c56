"""Compare the two backends on the same exported episodes: depth images and geodesic distances.

    python -m envs.habitat.compare --episodes data/pointnav_habitat/episodes/{split}/{split}.json.gz \\
        --scenes-dir data/pointnav_habitat/scenes --split val --poses 4

For each episode of the exported dataset (``python -m envs.pointnav.export``) it runs habitat's
PointNav environment (the adapter's config) and, on the scene read back from the same GLB, the
embedded simulator, and measures

- the geodesic start-goal distance: habitat's ``distance_to_goal`` at reset (its navmesh)
  against the embedded distance field (its grid), as a ratio per episode;
- depth: at the episode's start pose and at ``--poses`` random poses navigable in the embedded
  scene, habitat's rendered depth image against the embedded ray caster's (absolute difference
  in metres per pixel, over all images).

It prints two tables and, with ``--json``, writes the per-episode figures.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from ..pointnav.mesh import grid_from_glb
from ..pointnav.raycast import DepthCamera
from ..pointnav.scenes import scene_from_grid
from ..pointnav.spec import MAX_DEPTH_M
from .loader import DEFAULT_CONFIG, load_dataset, make_habitat_config, make_habitat_gym_env
from .vector_env import config_overrides

__all__ = ["compare", "yaw_of", "rotation_of", "depth_stats", "table", "parse_args", "main"]


def yaw_of(rotation):
    """Habitat yaw (radians) of a quaternion ``[x, y, z, w]`` about the up axis."""
    x, y, z, w = (float(v) for v in rotation)
    return 2.0 * np.arctan2(y, w)


def rotation_of(yaw):
    """The quaternion ``[x, y, z, w]`` of a rotation by ``yaw`` about the up axis."""
    return [0.0, float(np.sin(yaw / 2.0)), 0.0, float(np.cos(yaw / 2.0))]


def depth_stats(diffs):
    """Summary of absolute depth differences in metres (any shape)."""
    d = np.abs(np.asarray(diffs, dtype=np.float64)).ravel()
    return {"pixels": int(d.size), "median_m": float(np.median(d)),
            "mean_m": float(np.mean(d)), "p95_m": float(np.percentile(d, 95)),
            "p99_m": float(np.percentile(d, 99)), "max_m": float(np.max(d)),
            "frac_over_5cm": float(np.mean(d > 0.05)), "frac_over_25cm": float(np.mean(d > 0.25))}


def _habitat_env(gym_env):
    """habitat-lab's ``Env`` under a gym env built by ``habitat.gym`` (wrappers unwrapped)."""
    env = gym_env
    while not hasattr(env, "habitat_env"):
        env = env.env
    return env.habitat_env


def _random_poses(scene, rng, count):
    """``count`` (position, yaw) pairs with positions navigable in the embedded scene."""
    out = []
    h, w = scene.rows * scene.resolution, scene.cols * scene.resolution
    while len(out) < count:
        xy = rng.uniform([0.0, 0.0], [w, h])
        if scene.is_navigable(xy):
            out.append((xy, float(rng.uniform(-np.pi, np.pi))))
    return out


def compare(*, episodes, scenes_dir, split="val", count=0, poses=4, depth_size=64, seed=0,
            config=DEFAULT_CONFIG, overrides=()):
    """Run both backends on the first ``count`` episodes (0: all) of the dataset; returns
    ``{"episodes": [per-episode dicts], "depth": depth_stats, "geodesic": ratio summary}``."""
    cfg = make_habitat_config(config, overrides=[
        *config_overrides(split=split, depth_size=depth_size, episodes=episodes,
                          scenes_dir=scenes_dir, shuffle=False),
        f"habitat.seed={int(seed)}", *overrides])
    dataset = load_dataset(cfg)
    n = min(len(dataset.episodes), int(count) or len(dataset.episodes))
    dataset.episodes = dataset.episodes[:n]
    gym_env, _ = make_habitat_gym_env(cfg, dataset=dataset)
    camera = DepthCamera(size=depth_size)
    rng = np.random.default_rng(seed)
    scenes, rows, diffs = {}, [], []
    try:
        for _ in range(n):
            hab_obs = gym_env.reset()
            henv = _habitat_env(gym_env)
            sim, ep = henv.sim, henv.current_episode
            if ep.scene_id not in scenes:
                scenes[ep.scene_id] = scene_from_grid(grid_from_glb(ep.scene_id),
                                                      scene_id=ep.scene_id)
            scene = scenes[ep.scene_id]
            start = np.asarray(ep.start_position, dtype=np.float64)
            goal = np.asarray(ep.goals[0].position, dtype=np.float64)
            d_hab = float(henv.get_metrics()["distance_to_goal"])
            d_emb = scene.geodesic_distance(start[[0, 2]], goal[[0, 2]])
            ep_poses = [(start[[0, 2]], yaw_of(ep.start_rotation))] + _random_poses(
                scene, rng, poses)
            ep_diffs = []
            for k, (xy, yaw) in enumerate(ep_poses):
                if k == 0:
                    hab = np.asarray(hab_obs["depth"], dtype=np.float64)
                else:
                    hab = np.asarray(sim.get_observations_at(
                        [float(xy[0]), float(start[1]), float(xy[1])], rotation_of(yaw),
                        keep_agent_at_new_pose=False)["depth"], dtype=np.float64)
                emb = camera.render(scene.table, np.zeros(1, np.int64), np.array([scene.cols]),
                                    np.array([scene.cells]), np.asarray([xy]),
                                    np.array([yaw]), resolution=scene.resolution)[0]
                diff = (hab.reshape(emb.shape) - emb) * MAX_DEPTH_M
                ep_diffs.append(diff)
            ep_diffs = np.stack(ep_diffs)
            diffs.append(ep_diffs)
            rows.append({"episode_id": str(ep.episode_id), "scene_id": ep.scene_id,
                         "geodesic_file_m": float(ep.info.get("geodesic_distance", np.nan)),
                         "geodesic_embedded_m": d_emb, "geodesic_habitat_m": d_hab,
                         "ratio": d_hab / d_emb if d_emb > 0 else float("nan"),
                         "depth_start_median_m": float(np.median(np.abs(ep_diffs[0]))),
                         "depth_median_m": float(np.median(np.abs(ep_diffs))),
                         "depth_max_m": float(np.max(np.abs(ep_diffs)))})
    finally:
        gym_env.close()
    ratios = np.array([r["ratio"] for r in rows])
    finite = ratios[np.isfinite(ratios)]
    geo = {"episodes": len(rows), "unreachable_in_habitat": int(np.sum(~np.isfinite(ratios))),
           "ratio_median": float(np.median(finite)) if finite.size else float("nan"),
           "ratio_min": float(np.min(finite)) if finite.size else float("nan"),
           "ratio_max": float(np.max(finite)) if finite.size else float("nan"),
           "abs_diff_median_m": float(np.median(np.abs(
               [r["geodesic_habitat_m"] - r["geodesic_embedded_m"] for r in rows
                if np.isfinite(r["ratio"])]))) if finite.size else float("nan")}
    all_diffs = np.concatenate(diffs)
    return {"episodes": rows, "geodesic": geo, "depth": depth_stats(all_diffs),
            "depth_start": depth_stats(np.stack([d[0] for d in diffs])),
            "images": int(all_diffs.shape[0]), "depth_size": int(depth_size)}


def table(result):
    """The two Markdown tables of a :func:`compare` result: geodesic ratios, depth differences."""
    g, d, s = result["geodesic"], result["depth"], result["depth_start"]
    lines = [
        "| geodesic distance, habitat / embedded | episodes | unreachable in habitat | median "
        "| min | max | median abs diff (m) |",
        "|---|---|---|---|---|---|---|",
        f"| ratio | {g['episodes']} | {g['unreachable_in_habitat']} | {g['ratio_median']:.4f} "
        f"| {g['ratio_min']:.4f} | {g['ratio_max']:.4f} | {g['abs_diff_median_m']:.4f} |",
        "",
        f"| depth {result['depth_size']}x{result['depth_size']}, abs diff (m) | images | median "
        f"| mean | p95 | p99 | max | > 5 cm | > 25 cm |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, st, n in (("start poses", s, result["geodesic"]["episodes"]),
                        ("all poses", d, result["images"])):
        lines.append(f"| {name} | {n} | {st['median_m']:.4f} | {st['mean_m']:.4f} | "
                     f"{st['p95_m']:.4f} | {st['p99_m']:.4f} | {st['max_m']:.3f} | "
                     f"{100 * st['frac_over_5cm']:.2f}% | {100 * st['frac_over_25cm']:.2f}% |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    """The comparison's command line (``main``'s, and benchmarks/habitat_compare.py's after --)."""
    parser = argparse.ArgumentParser(
        prog="python -m envs.habitat.compare",
        description="Compare habitat-sim and the embedded simulator on exported episodes: "
                    "geodesic distances and depth images.")
    parser.add_argument("--episodes", required=True,
                        help="exported episode file (may contain {split})")
    parser.add_argument("--scenes-dir", required=True, help="exported scenes folder")
    parser.add_argument("--split", default="val")
    parser.add_argument("--count", type=int, default=0, help="episodes to compare (0: all)")
    parser.add_argument("--poses", type=int, default=4,
                        help="random poses per episode besides its start pose")
    parser.add_argument("--depth-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--override", action="append", default=[],
                        help="extra habitat Hydra override (repeatable)")
    parser.add_argument("--json", help="write the per-episode figures to this file")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    result = compare(episodes=args.episodes, scenes_dir=args.scenes_dir, split=args.split,
                     count=args.count, poses=args.poses, depth_size=args.depth_size,
                     seed=args.seed, overrides=args.override)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
