"""Procedurally drawn shapes to classify: a learnable, not trivial image task needing no download.

Six classes (circle, ring, square, hollow square, triangle, cross), each drawn at a random
position, size and rotation, in a random colour on a random background colour, with pixel noise
and a distractor stroke. Image ``i`` depends only on (seed, i), so every rank can generate exactly
its own shard.
"""
from __future__ import annotations

import numpy as np

__all__ = ["SHAPE_CLASSES", "generate_shapes"]

SHAPE_CLASSES = ("circle", "ring", "square", "hollow_square", "triangle", "cross")
_CHUNK = 64


def _masks(label: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Inside-the-shape masks for shape coordinates (u, v) scaled so the shape spans about [-1, 1]."""
    r2 = u * u + v * v
    box = np.maximum(np.abs(u), np.abs(v))
    lab = label[:, None, None]
    out = np.zeros(u.shape, dtype=bool)
    out |= (lab == 0) & (r2 <= 1.0)
    out |= (lab == 1) & (r2 <= 1.0) & (r2 >= 0.36)
    out |= (lab == 2) & (box <= 0.8)
    out |= (lab == 3) & (box <= 0.85) & (box >= 0.5)
    out |= (lab == 4) & (v >= -0.5) & (v <= 1.0) & (np.abs(u) <= (1.0 - v) / np.sqrt(3.0))
    out |= (lab == 5) & (((np.abs(u) <= 0.3) & (np.abs(v) <= 1.0)) | ((np.abs(v) <= 0.3) & (np.abs(u) <= 1.0)))
    return out


def _chunk(seed: int, chunk: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, chunk])
    n = _CHUNK
    label = rng.integers(0, len(SHAPE_CLASSES), n)
    radius = rng.uniform(0.25, 0.42, n) * size
    cx = rng.uniform(radius, size - radius)
    cy = rng.uniform(radius, size - radius)
    angle = rng.uniform(0, 2 * np.pi, n)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    dx = (xx[None] - cx[:, None, None]) / radius[:, None, None]
    dy = (yy[None] - cy[:, None, None]) / radius[:, None, None]
    c, s = np.cos(angle)[:, None, None], np.sin(angle)[:, None, None]
    u, v = c * dx + s * dy, -s * dx + c * dy
    mask = _masks(label, u, v)
    bg = rng.uniform(0, 1, (n, 3))
    # The foreground differs from the background by at least 0.35 in some channel, so every shape
    # is visible, but colour itself says nothing about the class.
    fg = np.clip(bg + rng.choice([-1, 1], (n, 3)) * rng.uniform(0.45, 0.8, (n, 3)), 0, 1)
    img = np.where(mask[:, None], fg[:, :, None, None], bg[:, :, None, None])
    # A distractor stroke: a thin line through the image in the foreground colour.
    theta = rng.uniform(0, np.pi, n)[:, None, None]
    off = rng.uniform(-0.5, 0.5, n)[:, None, None] * size
    dist = np.abs((xx[None] - size / 2) * np.cos(theta) + (yy[None] - size / 2) * np.sin(theta) - off)
    stroke = (dist < 0.6) & (rng.uniform(0, 1, n) < 0.3)[:, None, None]
    img = np.where(stroke[:, None], fg[:, :, None, None] * 0.5 + bg[:, :, None, None] * 0.5, img)
    img = img + rng.normal(0, 0.05, img.shape)
    return ((img - 0.5) / 0.3).astype(np.float32), label.astype(np.int64)


def generate_shapes(n: int, *, size: int = 32, seed: int = 0, rank: int = 0,
                    world_size: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(m, 3, size, size)`` float32 (normalised) and labels ``(m,)`` of rank's shard.

    The data set has ``n`` images (rounded up to whole chunks of 256); rank ``rank`` of
    ``world_size`` gets every ``world_size``-th chunk, so shards are disjoint and cover it.
    """
    chunks = list(range(rank, -(-n // _CHUNK), world_size))
    if not chunks:
        raise ValueError(f"{n} generated images are too few for {world_size} ranks "
                         f"(each rank needs at least one chunk of {_CHUNK})")
    parts = [_chunk(seed, c, size) for c in chunks]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
