"""Run logging: TensorBoard scalars, a plain-text log file and progress lines on stdout.

Only one process of a distributed job should write (rank 0): construct :class:`RunLogger` with
``enabled=False`` everywhere else and every call becomes a no-op, so callers never branch on rank.
:func:`read_scalars` reads the event files back (for tests, plots and reports).
"""
from __future__ import annotations

import importlib.util
import math
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, TextIO

import numpy as np

__all__ = ["RunLogger", "read_scalars", "scalar_events", "format_progress"]


def format_progress(fields: Mapping[str, Any]) -> str:
    """Format ``{"frames": 1200, "fps": 310.2, ...}`` as ``frames=1200 fps=310.2 ...``."""
    parts = []
    for key, value in fields.items():
        if isinstance(value, float):
            if math.isnan(value):
                text = "nan"
            elif value != 0.0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
                text = f"{value:.3e}"
            else:
                text = f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
        else:
            text = str(value)
        parts.append(f"{key}={text}")
    return " ".join(parts)


class RunLogger:
    """TensorBoard + text log + stdout for one run folder.

    ``enabled``: False turns every method into a no-op (non-zero ranks). ``tensorboard``: write
    event files under ``run_dir/tb``. ``echo``: also print log lines to ``stream`` (stdout).
    The log file ``run_dir/log.txt`` is appended to, so a resumed run keeps one continuous log.
    """

    def __init__(self, run_dir: str | Path, *, enabled: bool = True, tensorboard: bool = True,
                 echo: bool = True, log_name: str = "log.txt", tb_subdir: str = "tb",
                 stream: TextIO | None = None):
        self.run_dir = Path(run_dir)
        self.enabled = bool(enabled)
        self.echo = echo
        self.stream = stream if stream is not None else sys.stdout
        self._writer = None
        self._layout = False  # the per-worker charts' layout, written once
        self._log = None
        self._write_failed = False
        if not self.enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.run_dir / log_name, "a", buffering=1)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
            self._writer = SummaryWriter(log_dir=str(self.run_dir / tb_subdir), flush_secs=10)

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Record one scalar ``tag`` at ``step`` (NaN values are skipped)."""
        if self._writer is None:
            return
        value = float(value)
        if math.isnan(value):
            return
        self._writer.add_scalar(tag, value, global_step=int(step))

    def scalars(self, values: Mapping[str, float], step: int, *, prefix: str = "") -> None:
        """Record every ``{tag: value}`` at ``step``, tags prefixed with ``prefix``."""
        for tag, value in values.items():
            self.scalar(prefix + tag, value, step)

    def image(self, tag: str, image, step: int) -> None:
        """Record an RGB image (uint8 ``(H, W, 3)``) ``tag`` at ``step``."""
        if self._writer is not None:
            self._writer.add_image(tag, image, global_step=int(step), dataformats="HWC")

    def video(self, tag: str, frames, step: int, *, fps: int = 10) -> bool:
        """Record ``frames`` (uint8 ``(T, H, W, 3)``) as video ``tag`` at ``step``; TensorBoard's
        ``add_video`` encodes with ``moviepy.editor`` (moviepy before 2.0; not a dependency), and
        without it records nothing but a printed line: then nothing is tried here. Returns
        whether the video was recorded."""
        if self._writer is None or not _video_encoder():
            return False
        clip = np.asarray(frames, dtype=np.uint8).transpose(0, 3, 1, 2)[None]  # (1, T, 3, H, W)
        self._writer.add_video(tag, clip, global_step=int(step), fps=fps)
        return True

    def text(self, tag: str, text: str, step: int = 0) -> None:
        """Record a text entry in TensorBoard (e.g. the resolved config)."""
        if self._writer is not None:
            self._writer.add_text(tag, text, global_step=int(step))

    def workers(self, values: Mapping[str, Sequence[float]], step: int, *,
                slowest_by: str, note: str | None = None) -> str | None:
        """The per-worker view: every ``{metric: per-rank values}`` as ``worker/<rank>/<metric>``
        (one multi-line chart per metric on TensorBoard's Custom Scalars tab), and the worker
        with the largest ``slowest_by`` named: scalars ``workers/slowest_rank`` and
        ``workers/slowest_vs_median``, and a ``workers`` text entry (``note`` appended to it),
        whose line is returned."""
        if not self.enabled:
            return None
        if self._writer is not None and not self._layout:
            self._writer.add_custom_scalars({"workers": {
                m: ["Multiline", [rf"worker/\d+/{m}$"]] for m in values}})
            self._layout = True
        for metric, per in values.items():
            for rank, value in enumerate(per):
                self.scalar(f"worker/{rank}/{metric}", value, step)
        key = [float(v) for v in values[slowest_by]]
        slow = max(range(len(key)), key=key.__getitem__)
        median = sorted(key)[len(key) // 2]
        ratio = key[slow] / median if median > 0 else float("nan")
        self.scalars({"workers/slowest_rank": slow, "workers/slowest_vs_median": ratio}, step)
        head = (f"slowest worker: rank {slow} ({slowest_by} {key[slow]:.3g}, {ratio:.2f}x the "
                f"median of {len(key)})")
        others = ", ".join(f"{m} {float(per[slow]):.3g}" for m, per in values.items()
                           if m != slowest_by)
        line = "; ".join(part for part in (head, others, note) if part)
        self.text("workers", line, step)
        return line

    def info(self, message: str) -> None:
        """Append a time-stamped line to the log file and echo it."""
        if not self.enabled:
            return
        line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}"
        if self._log is not None:
            try:
                self._log.write(line + "\n")
            except OSError as exc:
                # A full disk must not stop rank 0 alone (its peers would then wait for it): say
                # it once and go on; the next checkpoint fails on every rank with the reason.
                if not self._write_failed:
                    print(f"warning: cannot write {self.run_dir / 'log.txt'}: {exc.strerror}",
                          file=sys.stderr, flush=True)
                self._write_failed = True
        if self.echo:
            print(line, file=self.stream, flush=True)

    def progress(self, fields: Mapping[str, Any]) -> None:
        """Log one progress line built from ``fields`` (see :func:`format_progress`)."""
        self.info(format_progress(fields))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()
        if self._log is not None:
            try:
                self._log.flush()
            except OSError:
                self._write_failed = True

    def close(self) -> None:
        """Flush and close the event and log files (idempotent)."""
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
        if self._log is not None:
            try:
                self._log.close()
            except OSError:
                self._write_failed = True
            self._log = None

    def __enter__(self) -> "RunLogger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def scalar_events(path: str | Path) -> Iterator[tuple[str, float, int, float]]:
    """Every scalar event in the event files under ``path`` (a run folder, whose ``tb`` subfolder
    is read, or an event-file folder), file by file in name order: ``(tag, wall time, step,
    value)``; the wall time is when the run logged it (Unix seconds)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = Path(path)
    if (path / "tb").is_dir():
        path = path / "tb"
    for f in sorted(p for p in path.rglob("events.out.tfevents.*") if p.is_file()):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for e in acc.Scalars(tag):
                yield tag, e.wall_time, e.step, e.value


def read_scalars(path: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Read every scalar from the event files under ``path``: ``{tag: [(step, value), ...]}``.

    ``path`` may be a run folder (its ``tb`` subfolder is read) or an event-file folder. Values are
    sorted by step; when several event files hold the same tag (a resumed run) they are merged.
    """
    out: dict[str, list[tuple[int, float]]] = {}
    for tag, _, step, value in scalar_events(path):
        out.setdefault(tag, []).append((step, value))
    for tag in out:
        out[tag].sort(key=lambda sv: sv[0])
    return out


def _video_encoder() -> bool:
    """Whether TensorBoard's ``add_video`` can encode here: it imports ``moviepy.editor``, which
    moviepy 2 removed (the Habitat venv has moviepy 2.2)."""
    try:
        return importlib.util.find_spec("moviepy.editor") is not None
    except ModuleNotFoundError:  # no moviepy at all
        return False
