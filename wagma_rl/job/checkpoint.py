"""Checkpoints written atomically into a run folder, keeping the last K.

A checkpoint is whatever picklable mapping the caller hands over (model and optimizer state dicts,
counters, RNG state, the resolved config). :class:`CheckpointManager` writes it to a temporary file
in the same folder, flushes it to disk and renames it into place, so a crash mid-write never leaves
a truncated file under a checkpoint's name; only whole files ever match ``ckpt_*.pt``.

Integrity: a file is one header line ``WAGMACKPT 1 <sha256> <length>`` and the ``torch.save``
payload it describes, so a file damaged later (a truncated copy, a full disk on another tool's
rewrite, bit rot) fails :func:`load_checkpoint` with a :class:`CheckpointError` that names it, and
:meth:`CheckpointManager.latest_good` falls back to the newest older checkpoint that verifies. A
state whose tensors hold NaN or inf is never written (a diverged model would otherwise become the
checkpoint every resume starts from).
"""
from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

__all__ = ["CheckpointManager", "CheckpointError", "NonFiniteCheckpoint", "load_checkpoint",
           "nonfinite_tensors", "run_folder_of"]

_NAME = re.compile(r"^ckpt_(\d+)\.pt$")
_MAGIC = b"WAGMACKPT 1 "


class CheckpointError(ValueError):
    """A checkpoint file is damaged or cannot be written; the message names the file."""


class NonFiniteCheckpoint(CheckpointError):
    """The state to save holds NaN or inf (nothing was written)."""


def run_folder_of(path: str | Path) -> Path:
    """The run folder a checkpoint file or run folder belongs to, where it is now (a moved run's
    checkpoints still record the old ``run.dir``): ``<run>/checkpoints/ckpt_*.pt`` gives
    ``<run>``, any other file its own folder, a folder itself."""
    path = Path(path)
    if path.is_dir():
        return path
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


def load_checkpoint(path: str | Path, *, map_location: Any = "cpu") -> dict[str, Any]:
    """Load and verify one checkpoint file written by :class:`CheckpointManager` (tensors onto
    ``map_location``). Raises FileNotFoundError, or :class:`CheckpointError` naming the file and
    what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} not found")
    raw = path.read_bytes()
    if raw.startswith(_MAGIC):
        end = raw.find(b"\n")
        try:
            digest, length = raw[len(_MAGIC):end].decode().split()
            length = int(length)
        except ValueError:
            raise CheckpointError(f"checkpoint {str(path)!r}: damaged header") from None
        payload = raw[end + 1:]
        if len(payload) != length:
            raise CheckpointError(f"checkpoint {str(path)!r} is truncated ({len(payload)} of "
                                  f"{length} bytes)")
        if hashlib.sha256(payload).hexdigest() != digest:
            raise CheckpointError(f"checkpoint {str(path)!r} is corrupt (checksum mismatch)")
    else:
        payload = raw  # written before checkpoints carried a checksum: loading is the only test
    try:
        # weights_only=False: our checkpoints carry numpy/Python RNG state, and we only load
        # files we wrote (and verified above).
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=False)
    except Exception as exc:  # any unpickling failure means the same thing: unreadable
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read ({type(exc).__name__}: "
                              f"{str(exc)[:200]})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} does not hold a state mapping")
    return state


def nonfinite_tensors(state: Any, prefix: str = "") -> list[str]:
    """Keys (dotted) of the floating-point tensors in ``state`` holding NaN or inf."""
    found: list[str] = []
    if isinstance(state, torch.Tensor):
        if torch.is_floating_point(state) and not bool(torch.isfinite(state).all()):
            found.append(prefix or "<tensor>")
    elif isinstance(state, Mapping):
        for k, v in state.items():
            found += nonfinite_tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            found += nonfinite_tensors(v, f"{prefix}[{i}]")
    return found


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
        """The newest checkpoint file, or None when there is none (not verified)."""
        paths = self.all()
        return paths[-1] if paths else None

    def latest_good(self, *, on_skip: Callable[[Path, str], None] | None = None,
                    map_location: Any = "cpu") -> tuple[Path | None, dict | None]:
        """The newest checkpoint that loads and verifies, and its state: ``(None, None)`` when
        none does. ``on_skip(path, why)`` is told about each newer one passed over."""
        for path in reversed(self.all()):
            try:
                return path, load_checkpoint(path, map_location=map_location)
            except (CheckpointError, FileNotFoundError) as exc:
                if on_skip is not None:
                    on_skip(path, str(exc))
        return None, None

    def save(self, state: Mapping[str, Any], *, step: int) -> Path:
        """Write ``state`` as the checkpoint for ``step`` atomically; prune old ones; return its path.

        Raises :class:`CheckpointError` (writing nothing) when a tensor in ``state`` is not finite.
        """
        bad = nonfinite_tensors(state)
        if bad:
            raise NonFiniteCheckpoint(f"refusing to write checkpoint {str(self.path_for(step))!r}: "
                                  f"non-finite values (NaN or inf) in {', '.join(bad[:3])}"
                                  f"{' and more' if len(bad) > 3 else ''}; the model diverged "
                                  "(lower the learning rate), the last good checkpoint is kept")
        buf = io.BytesIO()
        torch.save(dict(state), buf)
        payload = buf.getvalue()
        header = _MAGIC + f"{hashlib.sha256(payload).hexdigest()} {len(payload)}\n".encode()
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.path_for(step)
        fd, tmp = tempfile.mkstemp(prefix=".tmp_ckpt_", suffix=".pt", dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(header)
                fh.write(payload)
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
