"""Embedded scenes as Habitat GLB meshes (envs.pointnav.mesh) and the export command
(``python -m envs.pointnav.export``): a valid glTF 2.0 binary, closed outward-facing wall solids,
a floor over exactly the free cells, and coordinates that match the grid."""

import json
import struct

import numpy as np
import pytest

from envs.pointnav.episodes import load_episodes, save_episodes
from envs.pointnav.export import glb_name, main as export_main
from envs.pointnav.grid import OccupancyGrid
from envs.pointnav.make_episodes import make_episodes
from envs.pointnav.mesh import grid_from_glb, grid_to_mesh, read_glb, write_glb
from envs.pointnav.scenes import load_scene
from envs.pointnav.spec import CEILING_HEIGHT_M

H = CEILING_HEIGHT_M


@pytest.fixture(scope="module")
def grid():
    return load_scene("pointnav://default/val/1").grid  # several rooms, furniture


@pytest.fixture(scope="module")
def glb(grid, tmp_path_factory):
    path = tmp_path_factory.mktemp("glb") / "scene.glb"
    write_glb(path, grid_to_mesh(grid, scene_id="pointnav://default/val/1"))
    return path


def _pinched():
    """A grid whose obstacles touch only at corners (two pinches) and a free island."""
    blocked = np.zeros((10, 10), dtype=bool)
    blocked[3, 3] = blocked[4, 4] = blocked[3, 5] = True
    blocked[6:8, 6:8] = True
    return OccupancyGrid(blocked, 0.1)


def _triangles(mesh, part):
    pos, tris = mesh.parts[part]
    return pos.astype(np.float64), tris.astype(np.int64)


def _signed_volume(pos, tris):
    a, b, c = pos[tris[:, 0]], pos[tris[:, 1]], pos[tris[:, 2]]
    return float(np.einsum("ij,ij->i", a, np.cross(b, c)).sum() / 6.0)


def _areas_and_normals(pos, tris):
    n = np.cross(pos[tris[:, 1]] - pos[tris[:, 0]], pos[tris[:, 2]] - pos[tris[:, 0]])
    area = np.linalg.norm(n, axis=1)
    return area / 2.0, n / area[:, None]


def test_the_glb_container_is_valid_gltf_2(glb):
    raw = glb.read_bytes()
    magic, version, length = struct.unpack_from("<4sII", raw)
    assert (magic, version, length) == (b"glTF", 2, len(raw))
    json_len, json_type = struct.unpack_from("<II", raw, 12)
    assert json_type == 0x4E4F534A and json_len % 4 == 0
    doc = json.loads(raw[20:20 + json_len])
    bin_len, bin_type = struct.unpack_from("<II", raw, 20 + json_len)
    assert bin_type == 0x004E4942 and bin_len % 4 == 0 and 28 + json_len + bin_len == len(raw)
    assert doc["asset"]["version"] == "2.0" and doc["buffers"] == [{"byteLength": bin_len}]
    assert [m["name"] for m in doc["meshes"]] == ["floor", "ceiling", "walls"]
    for view in doc["bufferViews"]:
        assert view["byteOffset"] % 4 == 0 and view["byteOffset"] + view["byteLength"] <= bin_len
    mesh = read_glb(glb)
    for m in doc["meshes"]:
        (prim,) = m["primitives"]
        pos_acc, idx_acc = doc["accessors"][prim["attributes"]["POSITION"]], \
            doc["accessors"][prim["indices"]]
        pos, tris = mesh.parts[m["name"]]
        assert pos_acc["count"] == len(pos) and idx_acc["count"] == tris.size
        assert doc["bufferViews"][pos_acc["bufferView"]]["byteLength"] == 12 * len(pos)
        assert doc["bufferViews"][idx_acc["bufferView"]]["byteLength"] == 4 * tris.size
        assert pos_acc["min"] == pos.min(axis=0).tolist()
        assert pos_acc["max"] == pos.max(axis=0).tolist()
        assert tris.max() < len(pos)


@pytest.mark.parametrize("which", ["scene", "pinched"])
def test_walls_are_closed_solids_every_edge_shared_by_two_triangles(grid, which):
    g = grid if which == "scene" else _pinched()
    pos, tris = _triangles(grid_to_mesh(g), "walls")
    directed = np.concatenate([tris[:, [0, 1]], tris[:, [1, 2]], tris[:, [2, 0]]])
    undirected, count = np.unique(np.sort(directed, axis=1), axis=0, return_counts=True)
    assert len(undirected) > 0 and set(count.tolist()) == {2}
    # Consistently oriented: each edge is walked once in each direction.
    assert len(np.unique(directed, axis=0)) == len(directed)
    # Outward-facing and the right size: the divergence theorem gives the blocked volume.
    # (rel 1e-6: the file stores float32 coordinates; one cell more or less is > 1e-3.)
    assert _signed_volume(pos, tris) == pytest.approx(g.blocked.sum() * g.resolution ** 2 * H,
                                                      rel=1e-6)


def test_a_pinch_gets_one_vertex_per_touching_cell():
    pos, _ = _triangles(grid_to_mesh(_pinched()), "walls")
    corner = np.all(np.isclose(pos, [0.4, 0.0, 0.4]), axis=1)  # where cells (3,3), (4,4) touch
    assert corner.sum() == 2


def test_the_floor_and_ceiling_cover_exactly_the_free_cells(grid):
    mesh = grid_to_mesh(grid)
    free_area = (~grid.blocked).sum() * grid.resolution ** 2
    for part, y, up in (("floor", 0.0, 1.0), ("ceiling", H, -1.0)):
        pos, tris = _triangles(mesh, part)
        area, normal = _areas_and_normals(pos, tris)
        assert area.sum() == pytest.approx(free_area, rel=1e-6)  # float32 coordinates
        assert np.all(pos[:, 1] == np.float32(y))
        np.testing.assert_allclose(normal, np.tile([0.0, up, 0.0], (len(normal), 1)), atol=1e-9)


def _inside_triangles_xz(points, pos, tris):
    """Whether each (x, z) point lies in some triangle (projected on the floor plane)."""
    a, b, c = (pos[tris[:, k]][:, [0, 2]] for k in range(3))
    p = points[:, None, :]

    def edge(u, v):
        return (v[..., 0] - u[..., 0]) * (p[..., 1] - u[..., 1]) - \
               (v[..., 1] - u[..., 1]) * (p[..., 0] - u[..., 0])

    d = np.stack([edge(a, b), edge(b, c), edge(c, a)])
    return (np.all(d >= 0, axis=0) | np.all(d <= 0, axis=0)).any(axis=1)


def _inside_solid(points, pos, tris):
    """Parity of crossings of a +x ray from each 3-D point with the triangles."""
    a, b, c = (pos[tris[:, k]] for k in range(3))
    e1, e2 = b - a, c - a
    d = np.array([1.0, 0.0, 0.0])
    h = np.cross(d, e2)
    det = np.einsum("ij,ij->i", e1, h)
    ok = np.abs(det) > 1e-12
    inv = np.where(ok, 1.0 / np.where(ok, det, 1.0), 0.0)
    s = points[:, None, :] - a[None]
    u = np.einsum("pij,ij->pi", s, h) * inv
    q = np.cross(s, e1[None])
    v = (q @ d) * inv
    t = np.einsum("pij,ij->pi", q, e2) * inv
    hit = ok & (u >= 0) & (v >= 0) & (u + v <= 1) & (t > 0)
    return hit.sum(axis=1) % 2 == 1


def test_coordinates_match_the_grid(grid, glb):
    mesh = read_glb(glb)
    res = grid.resolution
    rng = np.random.default_rng(0)
    rows, cols = np.nonzero(~grid.blocked)
    pick = rng.choice(len(rows), 200, replace=False)
    free_pts = grid.cell_center(rows[pick], cols[pick])
    assert _inside_triangles_xz(free_pts, *_triangles(mesh, "floor")).all()
    rows, cols = np.nonzero(grid.blocked)
    pick = rng.choice(len(rows), 100, replace=False)
    xz = grid.cell_center(rows[pick], cols[pick])
    # Off-centre a little so no ray runs exactly along a shared edge of the solid.
    pts = np.stack([xz[:, 0] + 0.013 * res, np.full(len(xz), 1.1), xz[:, 1] + 0.017 * res], axis=1)
    assert _inside_solid(pts, *_triangles(mesh, "walls")).all()
    assert not _inside_triangles_xz(xz, *_triangles(mesh, "floor")).any()
    free = grid.cell_center(*np.nonzero(~grid.blocked))[:50]
    free3 = np.stack([free[:, 0] + 0.013 * res, np.full(len(free), 1.1), free[:, 1] + 0.017 * res],
                     axis=1)
    assert not _inside_solid(free3, *_triangles(mesh, "walls")).any()


def test_reading_the_floor_back_gives_the_grid(grid, glb):
    back = grid_from_glb(glb)
    assert back.resolution == grid.resolution
    np.testing.assert_array_equal(back.blocked, grid.blocked)


def test_export_writes_the_scenes_and_the_same_episodes_for_habitat(tmp_path, capsys):
    export_main(["--scenes", "trivial", "--split", "val", "--count", "5", "--seed", "3",
                 "--out", str(tmp_path)])
    # Quoted, so that Hydra accepts the braces of {split} (the contract suite loads them).
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"habitat overrides: habitat.dataset.scenes_dir='{tmp_path}/scenes' "
        f"habitat.dataset.data_path='{tmp_path}/episodes/{{split}}/{{split}}.json.gz' "
        f"habitat.dataset.split='val'")
    exported = load_episodes(tmp_path / "episodes" / "val" / "val.json.gz")
    original = make_episodes(scenes="trivial", split="val", count=5, seed=3)
    for e, o in zip(exported, original, strict=True):
        assert e.scene_id == glb_name(o.scene_id) == f"trivial/val_{o.scene_id[-1]}.glb"
        assert (e.episode_id, e.start_position, e.goal_position, e.geodesic_distance) == \
            (o.episode_id, o.start_position, o.goal_position, o.geodesic_distance)
        assert e.start_heading == pytest.approx(o.start_heading, abs=1e-12)
        back = grid_from_glb(tmp_path / "scenes" / e.scene_id)
        np.testing.assert_array_equal(back.blocked, load_scene(o.scene_id).grid.blocked)
        # habitat-sim reads this beside the GLB; without it a .glb is taken for gravity -Z.
        stage = json.loads((tmp_path / "scenes" / e.scene_id.replace(".glb", ".stage_config.json"))
                           .read_text())
        assert stage == {"render_asset": e.scene_id.split("/")[-1], "up": [0.0, 1.0, 0.0],
                         "front": [0.0, 0.0, -1.0]}


def test_export_of_an_episode_file_keeps_its_episodes(tmp_path):
    eps = make_episodes(scenes="trivial", split="train", count=3, seed=1, id_prefix="t-")
    save_episodes(tmp_path / "in.json.gz", eps)
    export_main(["--episodes", str(tmp_path / "in.json.gz"), "--split", "train",
                 "--out", str(tmp_path / "out")])
    out = load_episodes(tmp_path / "out" / "episodes" / "train" / "train.json.gz")
    assert [e.episode_id for e in out] == ["t-0", "t-1", "t-2"]


def test_export_of_a_missing_episode_file_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        export_main(["--episodes", str(tmp_path / "none.json.gz"), "--out", str(tmp_path)])
    assert exc.value.code == 2 and "does not exist" in capsys.readouterr().err
