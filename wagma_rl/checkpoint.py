"""Checkpoints written atomically into a run folder, keeping the last K.

A checkpoint is whatever picklable mapping the caller hands over (model and optimizer state dicts,
counters, RNG state, the resolved config). :class:`CheckpointManager` writes it to a temporary file
in the same folder, flushes it to disk and renames it into place, so a crash mid-write never leaves
a truncated file under a checkpoint's name; only whole files ever match ``ckpt_*.pt``.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch

__all__ = ["CheckpointManager", "load_checkpoint"]

_NAME = re.compile(r"^ckpt_(\d+)\.pt$")


def load_checkpoint(path: str | Path, *, map_location: Any = "cpu") -> dict[str, Any]:
    """Load one checkpoint file written by :class:`CheckpointManager` (tensors onto ``map_location``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} not found")
    # weights_only=False: our checkpoints carry numpy/Python RNG state, and we only load files we wrote.
    return torch.load(path, map_location=map_location, weights_only=False)


class CheckpointManager:
    """Save, list and load checkpoints under ``run_dir/checkpoints``.

    ``keep_last``: how many of the newest checkpoints to keep (older ones are deleted after a
    successful save); 0 or less keeps all.
    """

    def __init__(self, run_dir: str | Path, *, keep_last: int = 3, subdir: str = "checkpoints"):
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / subdir
        self.keep_last = int(keep_last)

    def path_for(self, step: int) -> Path:
        """The file name a checkpoint at ``step`` gets (steps order the files)."""
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0, got {step}")
        return self.dir / f"ckpt_{int(step):012d}.pt"

    def all(self) -> list[Path]:
        """Every complete checkpoint in the folder, oldest first."""
        if not self.dir.is_dir():
            return []
        found = []
        for p in self.dir.iterdir():
            m = _NAME.match(p.name)
            if m:
                found.append((int(m.group(1)), p))
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        """The newest checkpoint, or None when there is none."""
        paths = self.all()
        return paths[-1] if paths else None

    def save(self, state: Mapping[str, Any], *, step: int) -> Path:
        """Write ``state`` as the checkpoint for ``step`` atomically; prune old ones; return its path."""
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.path_for(step)
        fd, tmp = tempfile.mkstemp(prefix=".tmp_ckpt_", suffix=".pt", dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as fh:
                torch.save(dict(state), fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        self._fsync_dir()
        self._prune()
        return final

    def load(self, path: str | Path | None = None, *, map_location: Any = "cpu") -> dict[str, Any]:
        """Load ``path`` (default: the latest checkpoint); raise FileNotFoundError when there is none."""
        if path is None:
            path = self.latest()
            if path is None:
                raise FileNotFoundError(f"no checkpoint in {str(self.dir)!r}")
        return load_checkpoint(path, map_location=map_location)

    def _prune(self) -> None:
        if self.keep_last <= 0:
            return
        for old in self.all()[:-self.keep_last]:
            try:
                old.unlink()
            except FileNotFoundError:
                pass

    def _fsync_dir(self) -> None:
        # Make the rename itself durable (matters on a crash right after saving on a cluster FS).
        try:
            fd = os.open(self.dir, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
