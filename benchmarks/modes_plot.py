"""Line plots of TensorBoard scalars as PNG, drawn with Pillow (no plotting library needed).

    python benchmarks/modes_plot.py runs/wagma_pointnav --out docs/train_curve.png
        success and SPL of one run against frames (the learning curve in docs/results/training.md)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from PIL import Image, ImageDraw, ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from wagma_rl.job.tblog import read_scalars  # noqa: E402

__all__ = ["line_plot", "plot_run"]

COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189),
          (140, 86, 75)]


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 10 ** -len(str(int(1 / raw)))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    start = (lo // step) * step
    ticks, t = [], start
    while t <= hi + 1e-9:
        if t >= lo - 1e-9:
            ticks.append(round(t, 10))
        t += step
    return ticks


def _fmt(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:g}M"
    if abs(v) >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def line_plot(series: dict[str, Sequence[tuple[float, float]]], path: str | Path, *, title: str,
              xlabel: str, ylabel: str, size: tuple[int, int] = (720, 440),
              ylim: tuple[float, float] | None = None) -> Path:
    """Draw ``{label: [(x, y), ...]}`` as lines into a PNG at ``path``; return the path."""
    w, h = size
    left, right, top, bottom = 70, 20, 40, 60
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    pts = [p for s in series.values() for p in s]
    if not pts:
        raise ValueError("nothing to plot")
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = ylim if ylim else (min(p[1] for p in pts), max(p[1] for p in pts))
    if x1 <= x0:
        x1 = x0 + 1
    if y1 <= y0:
        y1 = y0 + 1

    def sx(x):
        return left + (x - x0) / (x1 - x0) * (w - left - right)

    def sy(y):
        return h - bottom - (y - y0) / (y1 - y0) * (h - top - bottom)

    d.rectangle([left, top, w - right, h - bottom], outline=(0, 0, 0))
    for t in _nice_ticks(x0, x1):
        d.line([sx(t), h - bottom, sx(t), h - bottom + 4], fill=(0, 0, 0))
        d.line([sx(t), top, sx(t), h - bottom], fill=(230, 230, 230))
        d.text((sx(t) - 12, h - bottom + 8), _fmt(t), fill=(0, 0, 0), font=font)
    for t in _nice_ticks(y0, y1):
        d.line([left - 4, sy(t), left, sy(t)], fill=(0, 0, 0))
        d.line([left, sy(t), w - right, sy(t)], fill=(230, 230, 230))
        d.text((8, sy(t) - 6), _fmt(t), fill=(0, 0, 0), font=font)
    d.text((left, 12), title, fill=(0, 0, 0), font=font)
    d.text(((w - left) // 2, h - 22), xlabel, fill=(0, 0, 0), font=font)
    d.text((8, top - 16), ylabel, fill=(0, 0, 0), font=font)
    # The legend goes to the top-right corner unless the curves end high; then to the bottom.
    tail = [p[1] for p in pts if p[0] >= x0 + 0.7 * (x1 - x0)]
    legend_top = top + 8 if sum(tail) / len(tail) < (y0 + y1) / 2 else \
        h - bottom - 8 - 14 * len(series)
    for i, (label, s) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        xy = [(sx(x), sy(y)) for x, y in s]
        if len(xy) > 1:
            d.line(xy, fill=color, width=2)
        elif xy:
            d.ellipse([xy[0][0] - 2, xy[0][1] - 2, xy[0][0] + 2, xy[0][1] + 2], fill=color)
        ly = legend_top + 14 * i
        d.line([w - right - 150, ly + 6, w - right - 130, ly + 6], fill=color, width=3)
        d.text((w - right - 125, ly), label, fill=(0, 0, 0), font=font)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def plot_run(run_dir: str | Path, out: str | Path) -> Path:
    """Success and SPL of one run against frames."""
    s = read_scalars(run_dir)
    return line_plot({"success": s["metrics/success"], "SPL": s["metrics/spl"]}, out,
                     title=f"{Path(run_dir).name}: training success / SPL (windowed, all workers)",
                     xlabel="frames", ylabel="", ylim=(0.0, 1.0))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    print(plot_run(args.run_dir, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
