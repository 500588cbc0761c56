"""Export embedded scenes and episodes for habitat-sim: Y-up GLB meshes plus a Habitat episode file.

    python -m envs.pointnav.export --scenes default --split val --count 100 --out data/pointnav_habitat
    python -m envs.pointnav.export --episodes val.json.gz --split val --out data/pointnav_habitat

writes ``<out>/scenes/<set>/<split>_<index>.glb`` for every scene the episodes use (with its
habitat-sim stage config ``<split>_<index>.stage_config.json``, which says the mesh is Y-up) and
``<out>/episodes/<split>/<split>.json.gz`` with the same episodes (ids, positions, rotations,
geodesic distances), their ``scene_id`` being the GLB path relative to ``<out>/scenes``. A
Habitat run reads them with ``habitat.dataset.scenes_dir=<out>/scenes`` and
``habitat.dataset.data_path=<out>/episodes/{split}/{split}.json.gz``; habitat-sim computes the
navmesh of a GLB that has none. The episodes come from an embedded episode file
(``--episodes``, e.g. one written by ``envs.pointnav.make_episodes``) or are drawn as that
module draws them (``--scenes``/``--count``/``--seed``), so both backends run the same ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from .episodes import EpisodeFileError, load_episodes, save_episodes
from .make_episodes import make_episodes
from .mesh import grid_to_mesh, write_glb
from .scenes import SCENE_URI, load_scene

__all__ = ["export", "glb_name", "stage_config_path", "main"]


def glb_name(scene_id):
    """The GLB path, relative to the scenes folder, of embedded scene ``scene_id``."""
    if scene_id.startswith(SCENE_URI):
        set_name, split, index = scene_id[len(SCENE_URI):].rsplit("/", 2)
        return f"{os.path.basename(set_name.rstrip('/'))}/{split}_{index}.glb"
    return f"maps/{os.path.splitext(os.path.basename(scene_id))[0]}.glb"


def stage_config_path(glb_path):
    """The habitat-sim stage config written beside ``glb_path`` (``x.glb`` -> ``x.stage_config.json``)."""
    return os.path.splitext(glb_path)[0] + ".stage_config.json"


def write_stage_config(glb_path):
    """Tell habitat-sim that the GLB is Y-up. Without a stage config beside it, habitat-sim takes
    any ``.glb`` for a Matterport mesh with gravity along -Z and turns it on its side (floor in
    the x-y plane, no navmesh under the episodes: found in the real habitat-sim 0.3.3 run); it
    reads ``<name>.stage_config.json`` next to ``<name>.glb`` when the scene is given by the GLB
    path. ``up``/``front`` are habitat's own frame (+Y up, -Z forward), so nothing is rotated."""
    config = {"render_asset": os.path.basename(glb_path), "up": [0.0, 1.0, 0.0],
              "front": [0.0, 0.0, -1.0]}
    with open(stage_config_path(glb_path), "w") as f:
        json.dump(config, f, indent=1)


def export(episodes, out_dir, *, split, map_resolution=0.05):
    """Write the GLB of every scene of ``episodes`` (a list of :class:`Episode`) and their
    Habitat episode file under ``out_dir``; returns ``(episode file, [GLB paths])``."""
    scenes_dir = os.path.join(out_dir, "scenes")
    written = {}
    for ep in episodes:
        if ep.scene_id in written:
            continue
        path = os.path.join(scenes_dir, glb_name(ep.scene_id))
        if path in written.values():
            raise ValueError(f"scenes {ep.scene_id!r} and another one export to the same "
                             f"file {path!r}; give the maps distinct names")
        scene = load_scene(ep.scene_id, resolution=map_resolution)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_glb(path, grid_to_mesh(scene.grid, scene_id=ep.scene_id))
        write_stage_config(path)
        written[ep.scene_id] = path
    renamed = [dataclasses.replace(ep, scene_id=glb_name(ep.scene_id)) for ep in episodes]
    file = os.path.join(out_dir, "episodes", split, f"{split}.json.gz")
    save_episodes(file, renamed)
    return file, sorted(written.values())


def main(argv=None):
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m envs.pointnav.export",
                                     description="Write embedded PointNav scenes as GLB meshes "
                                                 "with their Habitat episode file.")
    parser.add_argument("--episodes", help="embedded episode file to export (instead of drawing "
                                           "episodes with --scenes/--count/--seed)")
    parser.add_argument("--scenes", default="default",
                        help="scene set name, PNG map or directory of maps (default: default)")
    parser.add_argument("--split", default="val",
                        help="split to draw scenes from and to name the episode file after "
                             "(default: val)")
    parser.add_argument("--count", type=int, default=100, help="episodes to draw (default: 100)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--map-resolution", type=float, default=0.05,
                        help="metres per pixel of PNG maps (default: 0.05)")
    parser.add_argument("--out", required=True, help="output folder")
    args = parser.parse_args(argv)
    try:
        if args.episodes:
            episodes = load_episodes(args.episodes)
        else:
            episodes = make_episodes(scenes=args.scenes, split=args.split, count=args.count,
                                     seed=args.seed, map_resolution=args.map_resolution)
        file, glbs = export(episodes, args.out, split=args.split,
                            map_resolution=args.map_resolution)
    except (EpisodeFileError, ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    # Quoted as the adapter passes them: unquoted, Hydra rejects the braces of `{split}`.
    from ..habitat.loader import override

    scenes_dir = os.path.join(args.out, "scenes")
    data_path = os.path.join(args.out, "episodes", "{split}", "{split}.json.gz")
    print(f"wrote {len(glbs)} scene(s) under {scenes_dir} and {len(episodes)} episodes to {file}")
    print("habitat overrides: " + " ".join([override("habitat.dataset.scenes_dir", scenes_dir),
                                            override("habitat.dataset.data_path", data_path),
                                            override("habitat.dataset.split", args.split)]))


if __name__ == "__main__":
    main()
