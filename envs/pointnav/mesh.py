"""An occupancy grid as a Y-up triangle mesh, and the mesh as a glTF 2.0 binary (GLB) file.

The mesh is what a Habitat user loads in habitat-sim: a floor (y = 0, facing up) and a ceiling
(y = ``CEILING_HEIGHT_M``, facing down) over the free cells, and every wall or obstacle cell
extruded from the floor to the ceiling height as closed solids. Positions are Habitat's
``[x, y_up, z]``: cell ``(row, col)`` covers ``x in [col * res, (col + 1) * res)`` and
``z in [row * res, (row + 1) * res)``, so episode positions are the same in both simulators.

A GLB is a 12-byte header, a JSON chunk and a binary chunk; :func:`write_glb` writes one mesh
per part ("floor", "ceiling", "walls") with float32 positions and uint32 indices, and keeps the
grid's size and resolution in the root ``extras`` so :func:`grid_from_glb` can read the floor
back into the grid.
"""

from __future__ import annotations

import dataclasses
import json
import struct

import numpy as np

from .grid import OccupancyGrid
from .spec import CEILING_HEIGHT_M

__all__ = ["SceneMesh", "grid_to_mesh", "write_glb", "read_glb", "grid_from_glb", "GLBError"]

_MAGIC, _VERSION = b"glTF", 2
_CHUNK_JSON, _CHUNK_BIN = 0x4E4F534A, 0x004E4942
_FLOAT, _UINT = 5126, 5125
_ARRAY_BUFFER, _ELEMENT_ARRAY_BUFFER = 34962, 34963
EXTRAS_KEY = "pointnav_grid"


class GLBError(ValueError):
    """A file that is not a GLB this module can read."""


@dataclasses.dataclass
class SceneMesh:
    """Triangle meshes of one scene: ``parts[name] = (positions (V, 3) float32, triangles
    (T, 3) uint32)`` for ``floor``, ``ceiling`` and ``walls``; ``extras`` describes the grid."""

    parts: dict
    extras: dict


def _runs(mask_row):
    """``[start, stop)`` column ranges of the True runs of a 1-D bool array."""
    padded = np.concatenate([[False], mask_row, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return edges[0::2], edges[1::2]


def _plane(free, res, y, up):
    """Quads over the free cells at height ``y`` (merged along rows), facing up or down."""
    quads = []
    for row in range(free.shape[0]):
        c0, c1 = _runs(free[row])
        for a, b in zip(c0, c1):
            x0, x1, z0, z1 = a * res, b * res, row * res, (row + 1) * res
            # Counter-clockwise seen from +y: (x0, z0) -> (x0, z1) -> (x1, z1) -> (x1, z0).
            quad = [(x0, y, z0), (x0, y, z1), (x1, y, z1), (x1, y, z0)]
            quads.append(quad if up else quad[::-1])
    pos = np.asarray(quads, dtype=np.float64).reshape(-1, 3)
    base = 4 * np.arange(len(quads), dtype=np.uint32)[:, None]
    tris = np.concatenate([base + [0, 1, 2], base + [0, 2, 3]]).astype(np.uint32)
    return pos.astype(np.float32), tris


def _solids(blocked, res, height):
    """The blocked cells extruded from y = 0 to ``height``: closed, outward-facing solids.

    Faces share vertices, so every edge of a solid joins exactly two triangles. Where two
    blocked cells touch only at a corner (a pinch), that corner gets one vertex per cell so
    that the solids stay two-manifold there.
    """
    rows, cols = blocked.shape
    pad = np.pad(blocked, 1)  # outside the grid counts as empty space
    nw, ne, sw, se = pad[:-1, :-1], pad[:-1, 1:], pad[1:, :-1], pad[1:, 1:]
    pinch = (nw & se & ~ne & ~sw) | (ne & sw & ~nw & ~se)  # (rows + 1, cols + 1) grid points

    def vid(level, gr, gc, cell_row):
        # Copy 1 of a pinch point belongs to the cell south of it (cell_row == gr).
        k = np.where(pinch[gr, gc] & (cell_row == gr), 1, 0)
        return ((level * (rows + 1) + gr) * (cols + 1) + gc) * 2 + k

    r, c = np.nonzero(blocked)
    quads = [
        # top (+y) and bottom (-y)
        [vid(1, r, c, r), vid(1, r + 1, c, r), vid(1, r + 1, c + 1, r), vid(1, r, c + 1, r)],
        [vid(0, r, c, r), vid(0, r, c + 1, r), vid(0, r + 1, c + 1, r), vid(0, r + 1, c, r)],
    ]
    sides = {  # neighbour offset -> corners (level, grid row, grid col) of the outward face
        (-1, 0): [(0, 0, 0), (1, 0, 0), (1, 0, 1), (0, 0, 1)],   # north, -z
        (1, 0): [(0, 1, 0), (0, 1, 1), (1, 1, 1), (1, 1, 0)],    # south, +z
        (0, -1): [(0, 0, 0), (0, 1, 0), (1, 1, 0), (1, 0, 0)],   # west, -x
        (0, 1): [(0, 0, 1), (1, 0, 1), (1, 1, 1), (0, 1, 1)],    # east, +x
    }
    for (dr, dc), corners in sides.items():
        open_side = ~pad[r + 1 + dr, c + 1 + dc]
        rr, cc = r[open_side], c[open_side]
        quads.append([vid(lv, rr + a, cc + b, rr) for lv, a, b in corners])
    q = np.concatenate([np.stack(x, axis=1) for x in quads])
    tris = np.concatenate([q[:, [0, 1, 2]], q[:, [0, 2, 3]]])
    used, tris = np.unique(tris, return_inverse=True)
    key = used // 2
    gc = key % (cols + 1)
    gr = (key // (cols + 1)) % (rows + 1)
    level = key // ((cols + 1) * (rows + 1))
    pos = np.stack([gc * res, level * height, gr * res], axis=1).astype(np.float32)
    return pos, tris.reshape(-1, 3).astype(np.uint32)


def grid_to_mesh(grid, *, height=CEILING_HEIGHT_M, scene_id=""):
    """The :class:`SceneMesh` of an :class:`OccupancyGrid` (see the module docs)."""
    free = ~grid.blocked
    res = grid.resolution
    return SceneMesh(parts={"floor": _plane(free, res, 0.0, up=True),
                            "ceiling": _plane(free, res, float(height), up=False),
                            "walls": _solids(grid.blocked, res, float(height))},
                     extras={"rows": int(grid.shape[0]), "cols": int(grid.shape[1]),
                             "resolution": float(res), "ceiling_height": float(height),
                             "scene_id": str(scene_id)})


def write_glb(path, mesh):
    """Write ``mesh`` (a :class:`SceneMesh`) to ``path`` as a GLB file."""
    blob = bytearray()
    views, accessors, meshes, nodes = [], [], [], []

    def add_view(data, target):
        views.append({"buffer": 0, "byteOffset": len(blob), "byteLength": len(data),
                      "target": target})
        blob.extend(data)
        blob.extend(b"\0" * (-len(blob) % 4))  # every view starts 4-byte aligned
        return len(views) - 1

    for name, (pos, tris) in mesh.parts.items():
        pos = np.ascontiguousarray(pos, dtype="<f4")
        idx = np.ascontiguousarray(tris, dtype="<u4")
        accessors.append({"bufferView": add_view(pos.tobytes(), _ARRAY_BUFFER),
                          "componentType": _FLOAT, "count": int(len(pos)), "type": "VEC3",
                          "min": pos.min(axis=0).tolist() if len(pos) else [0.0] * 3,
                          "max": pos.max(axis=0).tolist() if len(pos) else [0.0] * 3})
        accessors.append({"bufferView": add_view(idx.tobytes(), _ELEMENT_ARRAY_BUFFER),
                          "componentType": _UINT, "count": int(idx.size), "type": "SCALAR"})
        meshes.append({"name": name, "primitives": [{
            "attributes": {"POSITION": len(accessors) - 2}, "indices": len(accessors) - 1,
            "mode": 4}]})
        nodes.append({"name": name, "mesh": len(meshes) - 1})
    doc = {"asset": {"version": "2.0", "generator": "wagma-rl envs.pointnav.export"},
           "scene": 0, "scenes": [{"nodes": list(range(len(nodes)))}], "nodes": nodes,
           "meshes": meshes, "accessors": accessors, "bufferViews": views,
           "buffers": [{"byteLength": len(blob)}], "extras": {EXTRAS_KEY: mesh.extras}}
    text = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 4)  # the JSON chunk is padded with spaces, BIN with zeros
    total = 12 + 8 + len(text) + 8 + len(blob)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<4sII", _MAGIC, _VERSION, total))
        fh.write(struct.pack("<II", len(text), _CHUNK_JSON) + text)
        fh.write(struct.pack("<II", len(blob), _CHUNK_BIN) + bytes(blob))


def read_glb(path):
    """Read a GLB written by :func:`write_glb` (any GLB with indexed float32 VEC3 positions)
    into a :class:`SceneMesh`; raises :class:`GLBError` naming what is wrong."""
    with open(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 20:
        raise GLBError(f"{path}: too short for a GLB file")
    magic, version, total = struct.unpack_from("<4sII", raw, 0)
    if magic != _MAGIC or version != _VERSION or total != len(raw):
        raise GLBError(f"{path}: not a glTF 2.0 binary (magic {magic!r}, version {version}, "
                       f"length {total} of {len(raw)} bytes)")
    json_len, kind = struct.unpack_from("<II", raw, 12)
    if kind != _CHUNK_JSON:
        raise GLBError(f"{path}: the first chunk is not JSON")
    doc = json.loads(raw[20:20 + json_len])
    blob = b""
    if 20 + json_len < len(raw):
        bin_len, kind = struct.unpack_from("<II", raw, 20 + json_len)
        if kind != _CHUNK_BIN or 28 + json_len + bin_len != len(raw):
            raise GLBError(f"{path}: bad binary chunk")
        blob = raw[28 + json_len:28 + json_len + bin_len]

    def accessor(i, dtype, width):
        acc = doc["accessors"][i]
        view = doc["bufferViews"][acc["bufferView"]]
        start = view.get("byteOffset", 0) + acc.get("byteOffset", 0)
        data = np.frombuffer(blob, dtype=dtype, count=acc["count"] * width, offset=start)
        return data.reshape(acc["count"], width) if width > 1 else data

    dtypes = {_FLOAT: "<f4", _UINT: "<u4", 5123: "<u2"}
    parts = {}
    for m in doc.get("meshes", []):
        (prim,) = m["primitives"]
        pos = accessor(prim["attributes"]["POSITION"], "<f4", 3)
        idx_acc = doc["accessors"][prim["indices"]]
        tris = accessor(prim["indices"], dtypes[idx_acc["componentType"]], 1)
        parts[m.get("name", str(len(parts)))] = (pos, tris.reshape(-1, 3).astype(np.uint32))
    return SceneMesh(parts=parts, extras=doc.get("extras", {}).get(EXTRAS_KEY, {}))


def grid_from_glb(path):
    """The :class:`OccupancyGrid` of a GLB written by :func:`write_glb`: a cell is free where
    its centre lies on a floor triangle (y = 0, facing up)."""
    mesh = read_glb(path)
    ex = mesh.extras
    if not {"rows", "cols", "resolution"} <= set(ex) or "floor" not in mesh.parts:
        raise GLBError(f"{path}: no '{EXTRAS_KEY}' grid description or no floor mesh; only "
                       f"scenes written by `python -m envs.pointnav.export` can be read back")
    rows, cols, res = int(ex["rows"]), int(ex["cols"]), float(ex["resolution"])
    pos, tris = mesh.parts["floor"]
    free = np.zeros((rows, cols), dtype=bool)
    for tri in pos[tris].astype(np.float64):
        a, b, c = tri[:, [0, 2]]
        if np.any(np.abs(tri[:, 1]) > 1e-6):
            continue
        lo = np.floor(np.minimum(np.minimum(a, b), c) / res).astype(int)
        hi = np.ceil(np.maximum(np.maximum(a, b), c) / res).astype(int)
        cc, rr = np.meshgrid(np.arange(max(lo[0], 0), min(hi[0], cols)),
                             np.arange(max(lo[1], 0), min(hi[1], rows)))
        p = np.stack([(cc + 0.5) * res, (rr + 0.5) * res], axis=-1)
        # Barycentric sign test: the centre is inside when all three edge functions agree.
        d = [(q[0] - p0[0]) * (p[..., 1] - p0[1]) - (q[1] - p0[1]) * (p[..., 0] - p0[0])
             for p0, q in ((a, b), (b, c), (c, a))]
        inside = ((d[0] >= 0) & (d[1] >= 0) & (d[2] >= 0)) | ((d[0] <= 0) & (d[1] <= 0)
                                                              & (d[2] <= 0))
        free[rr[inside], cc[inside]] = True
    return OccupancyGrid(~free, res)
