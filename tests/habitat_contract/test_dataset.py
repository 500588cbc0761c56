"""Our Habitat-format episode files, read by habitat-lab's own PointNav dataset loader."""

import gzip
import json
import os

import numpy as np
from habitat.datasets import make_dataset

from envs.habitat.loader import make_habitat_config
from envs.habitat.vector_env import config_overrides
from envs.pointnav.episodes import load_episodes, yaw_to_quaternion


def _habitat_dataset(data_path, scenes_dir, split):
    cfg = make_habitat_config(overrides=config_overrides(split=split, episodes=data_path,
                                                         scenes_dir=scenes_dir))
    return make_dataset(cfg.habitat.dataset.type, config=cfg.habitat.dataset)


def test_habitats_loader_reads_the_exported_episodes_as_written(exported):
    ds = _habitat_dataset(exported["data_path"], exported["scenes_dir"], "val")
    ours = load_episodes(exported["embedded"]["val"])
    assert [e.episode_id for e in ds.episodes] == [e.episode_id for e in ours]
    for h, e in zip(ds.episodes, ours):
        assert h.start_position == [e.start_position[0], 0.0, e.start_position[1]]
        np.testing.assert_allclose(h.start_rotation, yaw_to_quaternion(e.start_heading))
        assert h.goals[0].position == [e.goal_position[0], 0.0, e.goal_position[1]]
        assert h.goals[0].radius == e.goal_radius
        assert h.info["geodesic_distance"] == e.geodesic_distance
        assert os.path.isfile(h.scene_id) and h.scene_id.endswith(".glb")


def test_habitats_loader_reads_the_embedded_simulators_own_files(exported):
    ds = _habitat_dataset(exported["embedded"]["train"], exported["scenes_dir"], "train")
    raw = json.loads(gzip.decompress(open(exported["embedded"]["train"], "rb").read()))
    assert [e.episode_id for e in ds.episodes] == [e["episode_id"] for e in raw["episodes"]]
    assert [e.scene_id for e in ds.episodes] == [
        os.path.join(exported["scenes_dir"], e["scene_id"]) for e in raw["episodes"]]


def test_the_overrides_that_export_prints_load_its_dataset(tmp_path, capsys):
    from envs.pointnav.export import main as export_main

    export_main(["--scenes", "trivial", "--split", "val", "--count", "2", "--seed", "0",
                 "--out", str(tmp_path / "a,b")])
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("habitat overrides: ")
    # As a user passes them to habitat.get_config (Hydra rejected the unquoted `{split}`).
    cfg = make_habitat_config(overrides=line[len("habitat overrides: "):].split(" "))
    ds = make_dataset(cfg.habitat.dataset.type, config=cfg.habitat.dataset)
    assert [e.episode_id for e in ds.episodes] == ["0", "1"]
    assert all(os.path.isfile(e.scene_id) for e in ds.episodes)
