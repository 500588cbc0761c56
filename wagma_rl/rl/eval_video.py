"""Top-down maps and videos of evaluation episodes (``eval.maps``, ``eval.video``), as
habitat-baselines' ``top_down_map`` measure and ``video_option`` give them.

A video frame is the agent's depth (and RGB when the env gives it) beside the top-down map of the
path so far, scaled to :data:`FRAME_HEIGHT` rows, over a caption line: the step, and on the last
frame success, SPL and distance to goal. As habitat-baselines does, an episode of ``T`` steps has
``T + 1`` frames: its first observation, one per step, and a last frame whose cameras are black
(the env has moved on to its next episode; the map and the caption are the ended episode's).

Maps come from the embedded simulator's state when it runs in this process (``env.sim``), or
from ``infos["top_down_map"]`` (RGB images; a new episode's first in
``infos["next_top_down_map"]``), which the Habitat backend gives when asked for them
(:class:`envs.habitat.HabitatVectorEnv`'s ``top_down_map``). Memory: only the frames of episodes
in flight while videos are still wanted, stored small (a depth image per step, the map's
position or scaled image), and those of the chosen episodes until they are written.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from envs.pointnav.topdown import top_down_map

__all__ = ["EpisodeRecorder", "Video", "FRAME_HEIGHT", "video_name", "write_gif", "strip"]

FRAME_HEIGHT = 128
"""Rows of every panel of a video frame (nearest-neighbour scaling)."""
CAPTION_ROWS = 14
STRIP_FRAMES = 8
"""Frames of a video (evenly spaced, first and last included) in its TensorBoard image."""
FRAME_MS = 100


def _fit(img: np.ndarray, height: int = FRAME_HEIGHT) -> np.ndarray:
    """``img`` scaled (nearest neighbour, aspect kept) to ``height`` rows."""
    h, w = img.shape[:2]
    width = max(1, round(w * height / h))
    return img[np.arange(height) * h // height][:, np.arange(width) * w // width]


def _gray(depth) -> np.ndarray:
    """A depth image in [0, 1] (``(H, W)`` or ``(H, W, 1)``) as uint8 ``(H, W)``."""
    d = np.asarray(depth, dtype=np.float32).reshape(np.shape(depth)[:2])
    return (np.clip(d, 0.0, 1.0) * 255 + 0.5).astype(np.uint8)


@dataclass
class Video:
    """One recorded episode: its id, measures at its end, its steps as the env counted them
    (``infos["elapsed_steps"]``) and its frames (uint8 ``(H, W, 3)``, ``steps + 1`` of them)."""

    episode: str
    measures: dict
    steps: int
    frames: list = field(default_factory=list)


class _Episode:
    """What an env's episode in flight has shown: per frame its cameras and its map (a position
    for the embedded simulator, a scaled image from the Habitat backend)."""

    def __init__(self, cams, where, start=None):
        self.cams, self.where, self.start = [cams], [where], start


class EpisodeRecorder:
    """The maps (``maps``: how many) and videos (``videos``) of the first counted episodes an
    evaluation ends over ``env``. Call :meth:`started` after the reset and :meth:`stepped`
    after every step; read :attr:`maps` (``[(episode id, RGB image)]``) and :attr:`videos`."""

    def __init__(self, env, *, maps: int, videos: int):
        self.want_maps, self.want_videos = int(maps), int(videos)
        self.sim = getattr(env, "sim", None)
        self.maps: list[tuple[str, np.ndarray]] = []
        self.videos: list[Video] = []
        self._live: list[_Episode | None] = []
        self.drawn = True  # False once an env is seen to give no maps

    @property
    def done(self) -> bool:
        """Every map and video wanted is there."""
        return len(self.maps) >= self.want_maps and len(self.videos) >= self.want_videos

    def _where(self, i: int, infos: dict, key: str = "top_down_map"):
        if self.sim is not None:
            return self.sim.pos[i].copy()
        image = infos[key][i] if key in infos else None
        if image is None:
            self.drawn = False
            return None
        return _fit(np.asarray(image, dtype=np.uint8)) if self.want_videos else None

    def _begin(self, i, obs, infos, key="top_down_map") -> _Episode:
        start = (self.sim.scene[i].grid.blocked, self.sim.goal[i].copy()) if self.sim else None
        cams = (_gray(obs["depth"][i]), obs["rgb"][i].copy() if "rgb" in obs else None) \
            if self.want_videos else None
        return _Episode(cams, self._where(i, infos, key), start)

    def started(self, obs: dict, infos: dict) -> None:
        """Every env has begun an episode: ``obs``/``infos`` of the reset."""
        if self.want_maps or self.want_videos:
            self._live = [self._begin(i, obs, infos) for i in range(len(obs["depth"]))]
            if not self.drawn:
                self.want_maps = self.want_videos = 0

    def stepped(self, obs: dict, dones, counted, infos: dict, measures) -> None:
        """After a step: its ``obs`` and ``infos``, which envs' episodes ended (``dones``),
        which of those are ``counted``, and ``measures(i)``: the ended episode's measures."""
        if self.done:
            self._live = []
            return
        for i, ep in enumerate(self._live):
            if not dones[i]:
                if self.want_videos:
                    ep.cams.append((_gray(obs["depth"][i]),
                                    obs["rgb"][i].copy() if "rgb" in obs else None))
                ep.where.append(self._where(i, infos))
                continue
            if counted[i]:
                self._finish(i, ep, infos, measures(i))
            self._live[i] = self._begin(i, obs, infos, "next_top_down_map")

    def _map(self, ep: _Episode, k: int) -> np.ndarray:
        """The map after frame ``k`` of ``ep`` (embedded: drawn from the path so far)."""
        if ep.start is None:
            return ep.where[k]
        blocked, goal = ep.start
        return top_down_map(blocked, self.sim.resolution, ep.where[:k + 1], goal)

    def _finish(self, i, ep, infos, measures) -> None:
        episode = str(infos["episode_id"][i])
        if ep.start is None:  # the Habitat backend's map of the ended episode, at its end
            final = np.asarray(infos["top_down_map"][i], dtype=np.uint8)
            ep.where.append(_fit(final) if self.want_videos else None)
        else:  # the embedded env moved on: the path up to the last step's start
            final = self._map(ep, len(ep.where) - 1)
            ep.where.append(ep.where[-1])
        if len(self.maps) < self.want_maps:
            self.maps.append((episode, final))
        if len(self.videos) < self.want_videos:
            depth, rgb = ep.cams[-1]
            ep.cams.append((np.zeros_like(depth), None if rgb is None else np.zeros_like(rgb)))
            steps = int(infos["elapsed_steps"][i]) if "elapsed_steps" in infos \
                else len(ep.cams) - 2
            video = Video(episode, dict(measures), steps)
            for k, (d, c) in enumerate(ep.cams):
                last = k == len(ep.cams) - 1
                caption = f"step {k}" + (f"  success={measures['success']:.2f} "
                                         f"spl={measures['spl']:.2f} d="
                                         f"{measures['distance_to_goal']:.2f}" if last else "")
                video.frames.append(_frame(d, c, _fit(self._map(ep, k)), caption))
            self.videos.append(video)


def _frame(depth, rgb, map_image, caption) -> np.ndarray:
    """One video frame: depth, RGB (when given) and the map side by side over ``caption``."""
    from PIL import Image, ImageDraw

    panels = [_fit(np.repeat(depth[..., None], 3, axis=-1))]
    if rgb is not None:
        panels.append(_fit(np.asarray(rgb, dtype=np.uint8)[..., :3]))
    panels.append(map_image)
    top = np.concatenate(panels, axis=1)
    image = Image.new("RGB", (top.shape[1], top.shape[0] + CAPTION_ROWS))
    image.paste(Image.fromarray(top), (0, 0))
    ImageDraw.Draw(image).text((2, top.shape[0] + 1), caption, fill=(255, 255, 255))
    return np.asarray(image)


def video_name(episode: str, checkpoint: str | os.PathLike, measures: dict) -> str:
    """habitat-baselines' video file name: ``episode=<id>-ckpt=<n>-success=<s>-spl=<x>.gif``,
    ``n`` the checkpoint's number (``ckpt_<n>.pt``: its frame count), measures to 2 decimals."""
    stem = Path(checkpoint).stem
    number = re.fullmatch(r"ckpt_(\d+)", stem)
    ckpt = str(int(number.group(1))) if number else stem
    safe = re.sub(r"[^A-Za-z0-9._=-]", "_", str(episode))
    return (f"episode={safe}-ckpt={ckpt}-success={measures['success']:.2f}-"
            f"spl={measures['spl']:.2f}.gif")


def write_gif(path: str | os.PathLike, frames) -> None:
    """``frames`` (uint8 ``(H, W, 3)``, one size) as an animated GIF at ``path`` (Pillow), one
    frame per image (the captions' step numbers keep Pillow from merging equal frames)."""
    from PIL import Image

    images = [Image.fromarray(f) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=FRAME_MS, loop=0)


def strip(frames, count: int = STRIP_FRAMES) -> np.ndarray:
    """Up to ``count`` of ``frames``, evenly spaced with the first and the last, side by side:
    a video as one image (what TensorBoard gets without moviepy for ``add_video``)."""
    picks = sorted(set(np.linspace(0, len(frames) - 1, min(count, len(frames))).round()
                       .astype(int).tolist()))
    return np.concatenate([frames[k] for k in picks], axis=1)
