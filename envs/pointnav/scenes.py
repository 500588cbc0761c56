"""Scenes and named scene sets: floor plans plus what the simulator precomputes for them.

A :class:`Scene` is a floor plan with its navigable area, ray-caster tables, and a seeded pool
of goals whose geodesic distance fields are computed when the scene loads (that is the scene
load cost, larger for larger maps, as loading a Habitat scene is). Scenes are addressed by a
``scene_id`` string -- ``pointnav://<set>/<split>/<index>`` for generated ones, a PNG path
otherwise -- and kept in a bounded least-recently-used cache per process.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import zlib

import numpy as np

from .generator import generate_floor_plan
from .geodesic import distance_fields
from .grid import largest_component, load_occupancy_png, navigable_mask
from .raycast import skip_table

__all__ = ["SceneSet", "Scene", "SCENE_SETS", "register_scene_set", "get_scene_set",
           "load_scene", "resolve_scene_id", "scene_from_grid", "clear_scene_cache",
           "set_scene_cache_size"]

SCENE_URI = "pointnav://"
_CACHE = collections.OrderedDict()  # key -> Scene, least recently used first
_CACHE_SIZE = [64]


@dataclasses.dataclass(frozen=True)
class SceneSet:
    """A named family of scenes with train/val splits and its episode rules.

    Generated sets draw each scene's size uniformly from ``size_m`` and its room count from
    ``rooms``; ``pngs`` (a dict split -> list of paths) makes a set of user maps instead.
    """

    name: str
    num_scenes: dict = dataclasses.field(default_factory=lambda: {"train": 32, "val": 8})
    size_m: tuple = (5.0, 8.0)
    rooms: tuple = (2, 4)
    clutter: float = 0.03
    resolution: float = 0.05
    seed: int = 0
    geodesic_range: tuple = (1.0, 30.0)   # start-goal geodesic distance, metres
    min_ratio: float = 1.1                # geodesic / euclidean lower bound
    goals_per_scene: int = 8
    pngs: dict = None

    @property
    def splits(self):
        """Names of the splits of this set."""
        return tuple(self.pngs) if self.pngs is not None else tuple(self.num_scenes)

    def scene_ids(self, split):
        """The ``scene_id`` strings of ``split``, in order."""
        if split not in self.splits:
            raise ValueError(f"scene set {self.name!r} has no split {split!r}; it has "
                             f"{list(self.splits)}")
        if self.pngs is not None:
            return [f"{SCENE_URI}{self.name}/{split}/{i}" for i in range(len(self.pngs[split]))]
        return [f"{SCENE_URI}{self.name}/{split}/{i}" for i in range(self.num_scenes[split])]


SCENE_SETS = {}
_PATH_SETS = {}  # sets made from a PNG file or directory, by absolute path


def register_scene_set(scene_set):
    """Add (or replace) a named :class:`SceneSet`; returns it."""
    if not isinstance(scene_set, SceneSet):
        raise TypeError("register_scene_set expects a SceneSet")
    _forget_set(scene_set.name)
    SCENE_SETS[scene_set.name] = scene_set
    return scene_set


def _forget_set(name):
    """Drop cached scenes of set ``name`` (it is being redefined)."""
    prefix = f"{SCENE_URI}{name}/"
    for key in [k for k in _CACHE if isinstance(k, str) and k.startswith(prefix)]:
        del _CACHE[key]


# "trivial": one open room and short straight episodes, for fast learning tests.
register_scene_set(SceneSet(name="trivial", num_scenes={"train": 4, "val": 2}, size_m=(2.6, 3.4),
                            rooms=(1, 1), clutter=0.0, seed=11, geodesic_range=(1.0, 2.5),
                            min_ratio=1.0, goals_per_scene=8))
# "default": small flats of a few rooms; a small policy learns them in minutes on a CPU.
register_scene_set(SceneSet(name="default", num_scenes={"train": 32, "val": 8}, size_m=(4.5, 7.0),
                            rooms=(2, 3), clutter=0.02, seed=22, geodesic_range=(1.0, 6.0),
                            min_ratio=1.1, goals_per_scene=8))
# "large": Habitat-like spans (up to 30 m paths), more rooms and furniture; scene loads and
# episode lengths vary a lot between workers.
register_scene_set(SceneSet(name="large", num_scenes={"train": 64, "val": 16}, size_m=(9.0, 16.0),
                            rooms=(4, 8), clutter=0.06, seed=33, geodesic_range=(1.0, 30.0),
                            min_ratio=1.1, goals_per_scene=8))


def get_scene_set(scenes, *, resolution=0.05):
    """Resolve ``scenes`` (a registered name, a PNG file or a directory of PNGs) to a SceneSet.

    A directory with ``train/`` and ``val/`` subdirectories gives those splits; otherwise every
    PNG serves both splits. ``resolution`` is the metres per pixel of user maps.
    """
    if isinstance(scenes, SceneSet):
        return scenes
    if not isinstance(scenes, (str, os.PathLike)):
        raise TypeError(f"scenes must be a scene-set name or a path, got {type(scenes).__name__}")
    scenes = os.fspath(scenes)
    if scenes in SCENE_SETS:
        return SCENE_SETS[scenes]
    if os.path.isfile(scenes) or os.path.isdir(scenes):
        if os.path.isfile(scenes):
            pngs = {"train": [scenes], "val": [scenes]}
        elif os.path.isdir(os.path.join(scenes, "train")):
            pngs = {s: sorted(glob.glob(os.path.join(scenes, s, "*.png")))
                    for s in ("train", "val") if os.path.isdir(os.path.join(scenes, s))}
        else:
            files = sorted(glob.glob(os.path.join(scenes, "*.png")))
            pngs = {"train": files, "val": files}
        if not any(pngs.values()):
            raise ValueError(f"no PNG maps found under {scenes!r}")
        name = os.path.abspath(scenes)
        _forget_set(name)
        _PATH_SETS[name] = SceneSet(name=name, resolution=resolution, pngs=pngs,
                                    num_scenes={s: len(p) for s, p in pngs.items()})
        return _PATH_SETS[name]
    raise ValueError(f"unknown scene set {scenes!r}: use one of {sorted(SCENE_SETS)}, a PNG "
                     f"occupancy map, or a directory of them")


class Scene:
    """A loaded floor plan and its precomputed data (see the module docstring)."""

    def __init__(self, scene_id, grid, *, goals_per_scene=8, seed=0):
        self.scene_id = scene_id
        self.grid = grid
        self.resolution = grid.resolution
        self.rows, self.cols = grid.shape
        self.cells = self.rows * self.cols
        self.navigable = largest_component(navigable_mask(grid))
        if not self.navigable.any():
            raise ValueError(f"scene {scene_id!r} has no place where the agent fits")
        self.nav_flat = self.navigable.ravel()
        self.table = skip_table(grid.blocked)
        rng = np.random.default_rng(seed)
        cells = np.flatnonzero(self.nav_flat)
        pick = rng.choice(cells, size=min(goals_per_scene, len(cells)), replace=False)
        self.goals = self._centers(pick)
        self.fields = distance_fields(self.navigable, self.goals, resolution=self.resolution)
        self._extra = collections.OrderedDict()  # goal (x, y) -> field, for episode files
        self._starts = {}

    def _centers(self, flat_cells):
        return np.stack([(flat_cells % self.cols + 0.5) * self.resolution,
                         (flat_cells // self.cols + 0.5) * self.resolution], axis=-1)

    def is_navigable(self, xy):
        """Whether the agent's centre may stand at ``xy``."""
        col, row = int(np.floor(xy[0] / self.resolution)), int(np.floor(xy[1] / self.resolution))
        return 0 <= row < self.rows and 0 <= col < self.cols and bool(self.navigable[row, col])

    def field_for(self, goal):
        """The geodesic distance field to ``goal`` (cached; pool goals are precomputed)."""
        goal = (float(goal[0]), float(goal[1]))
        hit = np.flatnonzero(np.all(np.abs(self.goals - goal) < 1e-9, axis=1))
        if hit.size:
            return self.fields[hit[0]]
        if goal in self._extra:
            self._extra.move_to_end(goal)
            return self._extra[goal]
        field = distance_fields(self.navigable, np.asarray([goal]), resolution=self.resolution)[0]
        self._extra[goal] = field
        if len(self._extra) > 64:
            self._extra.popitem(last=False)
        return field

    def start_candidates(self, goal_index, geodesic_range, min_ratio):
        """Flat cells from which pool goal ``goal_index`` is a valid episode (cached)."""
        key = (goal_index, tuple(geodesic_range), float(min_ratio))
        if key not in self._starts:
            field = self.fields[goal_index].ravel()
            cells = np.flatnonzero(self.nav_flat & np.isfinite(field)
                                   & (field >= geodesic_range[0]) & (field <= geodesic_range[1]))
            euclid = np.linalg.norm(self._centers(cells) - self.goals[goal_index], axis=1)
            ok = field[cells] >= min_ratio * euclid
            self._starts[key] = cells[ok]
        return self._starts[key]

    def geodesic_distance(self, a, b):
        """Geodesic distance in metres between positions ``a`` and ``b`` (inf if unreachable)."""
        from .geodesic import lookup_distance

        field = self.field_for(b)
        return float(lookup_distance(field.ravel(), np.zeros(1, np.int64), np.array([self.cols]),
                                     np.asarray([a], dtype=np.float64),
                                     np.asarray([b], dtype=np.float64),
                                     resolution=self.resolution)[0])


def scene_from_grid(grid, *, scene_id="custom", goals_per_scene=8, seed=0):
    """Build a :class:`Scene` from an :class:`OccupancyGrid` (not cached)."""
    return Scene(scene_id, grid, goals_per_scene=goals_per_scene, seed=seed)




def set_scene_cache_size(size):
    """Keep at most ``size`` loaded scenes per process (least recently used go first)."""
    if int(size) < 1:
        raise ValueError("scene cache size must be at least 1")
    _CACHE_SIZE[0] = int(size)
    while len(_CACHE) > _CACHE_SIZE[0]:
        _CACHE.popitem(last=False)


def clear_scene_cache():
    """Forget every loaded scene."""
    _CACHE.clear()


def _stable_seed(*parts):
    return zlib.crc32("/".join(str(p) for p in parts).encode())


def resolve_scene_id(scene_id):
    """Check that ``scene_id`` names a scene, without loading it.

    Returns ``(scene_set, split, index)`` for ``pointnav://`` ids and ``None`` for PNG paths;
    raises ValueError (FileNotFoundError for a missing PNG) saying what is wrong.
    """
    if scene_id.startswith(SCENE_URI):
        parts = scene_id[len(SCENE_URI):].rsplit("/", 2)
        if len(parts) != 3 or not parts[2].isdigit():
            raise ValueError(f"malformed scene_id {scene_id!r}: expected "
                             f"{SCENE_URI}<set>/<split>/<index>")
        set_name, split, index = parts[0], parts[1], int(parts[2])
        sset = _PATH_SETS.get(set_name) or get_scene_set(set_name)
        ids = sset.scene_ids(split)
        if index >= len(ids):
            raise ValueError(f"scene {scene_id!r} does not exist: split {split!r} of "
                             f"{set_name!r} has {len(ids)} scenes")
        return sset, split, index
    if scene_id.lower().endswith(".png"):
        if not os.path.isfile(scene_id):
            raise FileNotFoundError(f"scene map {scene_id!r} does not exist")
        return None
    raise ValueError(f"unknown scene_id {scene_id!r}: expected {SCENE_URI}<set>/<split>/"
                     f"<index> or the path of a PNG occupancy map")


def load_scene(scene_id, *, resolution=0.05):
    """Load (or fetch from the cache) the scene named by ``scene_id``.

    ``scene_id``: ``pointnav://<set>/<split>/<index>`` or a PNG path (read at ``resolution``
    metres per pixel; maps of a registered PNG set use the set's resolution).
    """
    # Generated scenes carry their own resolution; only PNG maps depend on the argument.
    key = scene_id if scene_id.startswith(SCENE_URI) else (scene_id, float(resolution))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    if scene_id.startswith(SCENE_URI):
        sset, split, index = resolve_scene_id(scene_id)
        seed = _stable_seed(sset.seed, split, index)
        if sset.pngs is not None:
            grid = load_occupancy_png(sset.pngs[split][index], resolution=sset.resolution)
        else:
            rng = np.random.default_rng(seed)
            w, h = rng.uniform(*sset.size_m, size=2)
            rooms = int(rng.integers(sset.rooms[0], sset.rooms[1] + 1))
            grid = generate_floor_plan(seed=seed, width_m=w, height_m=h,
                                       resolution=sset.resolution, max_rooms=rooms,
                                       clutter=sset.clutter)
        scene = Scene(scene_id, grid, goals_per_scene=sset.goals_per_scene, seed=seed)
    else:
        resolve_scene_id(scene_id)
        grid = load_occupancy_png(scene_id, resolution=resolution)
        scene = Scene(scene_id, grid, seed=_stable_seed(scene_id))
    _CACHE[key] = scene
    while len(_CACHE) > _CACHE_SIZE[0]:
        _CACHE.popitem(last=False)
    return scene
