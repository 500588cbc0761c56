"""A user's own images: ``root/<split>/<class name>/<image file>`` (the usual ImageFolder layout)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["IMAGE_SUFFIXES", "list_image_folder", "load_images"]

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm"}


def list_image_folder(root: str | Path, split: str) -> tuple[list[Path], list[int], list[str]]:
    """Files, labels and class names of ``root/split`` (classes are the sorted subfolder names)."""
    base = Path(root) / split
    if not base.is_dir():
        raise FileNotFoundError(f"image folder {str(base)!r} not found: data.path must hold "
                                f"'{split}/<class>/<images>' subfolders")
    classes = sorted(d.name for d in base.iterdir() if d.is_dir())
    if not classes:
        raise ValueError(f"{str(base)!r} has no class subfolders")
    files, labels = [], []
    for i, name in enumerate(classes):
        for f in sorted((base / name).rglob("*")):
            if f.suffix.lower() in IMAGE_SUFFIXES:
                files.append(f)
                labels.append(i)
    if not files:
        raise ValueError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) under {str(base)!r}")
    return files, labels, classes


def load_images(files: list[Path], *, size: int) -> np.ndarray:
    """Load, convert to RGB, resize to ``size`` x ``size`` and normalise: ``(n, 3, size, size)``."""
    try:
        from PIL import Image
    except ImportError as exc:  # pillow is a project dependency; say so if it is missing
        raise ImportError("reading an image folder needs pillow: pip install pillow") from exc
    out = np.empty((len(files), 3, size, size), dtype=np.float32)
    for i, f in enumerate(files):
        with Image.open(f) as im:
            arr = np.asarray(im.convert("RGB").resize((size, size), Image.BILINEAR), dtype=np.float32)
        out[i] = ((arr / 255.0 - 0.5) / 0.25).transpose(2, 0, 1)
    return out
