"""Per-update, per-worker timing traces: one small CSV file per rank in ``<run dir>/trace/``.

Every update appends one line (about 100 bytes, one buffered write; the file is flushed at the
job's synchronised points and on close), so tracing is on by default (``run.trace``). The
simulator (``python -m wagma_rl.scale --rollout trace:PATH``) replays these files.

Columns (see :data:`FIELDS`): ``update`` (index, from 0, continuing across resumes), ``time``
(Unix time at the end of the update), ``collect_s`` (rollout time without the end-of-rollout
wait), ``steps`` / ``num_steps`` (steps collected / asked for), ``update_s`` (local PPO compute,
without communication or waiting), ``comm_s``, ``wait_s`` (waiting for peers, the end-of-rollout
wait included), ``staleness``, ``stale`` (stale contributions in the average), ``late`` (1 when
this worker's own contribution was stale), ``preempted``, ``synced``, ``frames`` (collected in
this update), ``episodes``, ``success_sum``, ``spl_sum`` (this worker's window of finished
episodes after the update: how many, and their summed success and SPL), ``group`` (the partners
of this update, ``;``-separated; empty for a global or gradient average).

The window columns make the job's success at *every* update recoverable without any
communication (:func:`job_series`): the trainer reduces the windows only where the workers are in
step (every update in the DD-PPO modes, every global average in WAGMA's), and at those updates the
two agree exactly. Traces written before these columns existed (:data:`FIELDS_V1`) still read;
their window columns are NaN.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

__all__ = ["TraceWriter", "read_trace", "job_series", "chrome_trace", "FIELDS"]

FIELDS = ("update", "time", "collect_s", "steps", "num_steps", "update_s", "comm_s", "wait_s",
          "staleness", "stale", "late", "preempted", "synced", "frames", "episodes", "success_sum",
          "spl_sum", "group")
# The columns before 2026-11-28 (no frames or episode window).
FIELDS_V1 = ("update", "time", "collect_s", "steps", "num_steps", "update_s", "comm_s", "wait_s",
             "staleness", "stale", "late", "preempted", "synced", "group")


class TraceWriter:
    """Appends this worker's per-update figures to ``<run_dir>/trace/rank_<rank>.csv``.

    A resumed run appends to the same file. ``enabled=False`` makes every call a no-op.
    """

    def __init__(self, run_dir: str | Path, *, rank: int, num_steps: int, enabled: bool = True):
        self.num_steps = num_steps
        self._file = None
        self.path: Path | None = None
        if not enabled:
            return
        path = Path(run_dir) / "trace" / f"rank_{rank:05d}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists() or path.stat().st_size == 0
        self._file = open(path, "a", buffering=1 << 16)
        if new:
            self._file.write(",".join(FIELDS) + "\n")
        self.path = path

    def add(self, update: int, *, collect_s: float, update_s: float, steps: int, sync,
            frames: int = 0, episodes=None) -> None:
        """Record update ``update``; ``sync`` is the strategy's ``SyncInfo`` for it, ``frames``
        what it collected, ``episodes`` this worker's finished-episode window after it (an
        :class:`~wagma_rl.rl.metrics.EpisodeWindow`, summed only when the trace is written; none:
        no episodes)."""
        if self._file is None:
            return
        group = ";".join(str(r) for r in sync.group)
        sums = episodes.sums() if episodes is not None else (0, 0.0, 0.0, 0.0)
        count, success, spl = sums[0], sums[2], sums[3]  # [episodes, reward, success, spl, ...]
        self._file.write(
            f"{update},{time.time():.4f},{collect_s:.5f},{steps},{self.num_steps},{update_s:.5f},"
            f"{sync.comm_s:.6f},{sync.wait_s:.5f},{sync.staleness:g},{sync.stale},{int(sync.late)},"
            f"{int(sync.preempted)},{int(sync.synced)},{int(frames)},{int(count)},"
            f"{float(success)!r},{float(spl)!r},{group}\n")
        if sync.synced:
            self._file.flush()  # cheap here: everyone is in step anyway

    def close(self) -> None:
        """Flush and close the file (safe to call twice)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def read_trace(path: str | Path) -> dict[str, np.ndarray]:
    """Read a trace folder (every ``rank_*.csv`` in it) or one rank's file.

    Returns arrays indexed ``[rank, update]`` for the numeric columns (the updates every rank
    recorded; a resumed run's repeated update indices keep their last record), ``group`` as a
    ``[rank][update]`` list of tuples, and ``other_s``: the rest of the loop's time per update
    (statistics, logging, checkpoints: the time between two records less the four timed parts;
    the first update gets the rank's median). Raises ``ValueError`` naming the file when it is not a trace.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such trace folder or file (the trainer writes RUN_DIR/trace "
                         "with run.trace=true)")
    files = sorted(path.glob("rank_*.csv")) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"{path}: no trace files (expected {path}/rank_*.csv written by the "
                         "trainer with run.trace=true)")
    per_rank = []
    for f in files:
        lines = f.read_text().splitlines()
        header = tuple(lines[0].split(",")) if lines else ()
        if header not in (FIELDS, FIELDS_V1):
            raise ValueError(f"{f}: not a trainer trace (its header is not {','.join(FIELDS)})")
        rows: dict[int, list[str]] = {}
        for line in lines[1:]:
            parts = line.split(",")
            if len(parts) == len(header):  # a line cut by a crash is skipped
                named = dict(zip(header, parts))
                rows[int(parts[0])] = [named.get(name, "nan") for name in FIELDS]
        per_rank.append([rows[k] for k in sorted(rows)])
    n = min(len(r) for r in per_rank)
    if n == 0:
        raise ValueError(f"{path}: a rank's trace holds no complete update")
    out: dict[str, np.ndarray] = {}
    for i, name in enumerate(FIELDS[:-1]):
        out[name] = np.array([[float(row[i]) for row in rows[:n]] for rows in per_rank])
    out["group"] = [[tuple(int(x) for x in row[-1].split(";") if x) for row in rows[:n]]
                    for rows in per_rank]
    timed = out["collect_s"] + out["update_s"] + out["comm_s"] + out["wait_s"]
    other = np.zeros_like(timed)
    if n > 1:
        other[:, 1:] = np.maximum(np.diff(out["time"], axis=1) - timed[:, 1:], 0.0)
        other[:, 0] = np.median(other[:, 1:], axis=1)
    out["other_s"] = other
    return out


def job_series(path: str | Path) -> dict[str, np.ndarray]:
    """The job's figures at every update from a trace folder (every rank's file): ``update``,
    ``frames`` (the job's frames once every rank finished that update), ``wall_s`` (from the
    earliest rank's first update start to the last rank's end of that update), ``end`` (that
    end as a Unix time, the ranks' own clocks), ``success`` and
    ``spl`` (over every worker's episode window after that update, as the trainer reduces them:
    NaN where no worker has finished an episode). Raises ``ValueError`` for a trace written
    before the window columns existed."""
    tr = read_trace(path)
    if np.isnan(tr["episodes"]).any():
        raise ValueError(f"{path}: this trace has no episode columns (written before 2026-11-28); "
                         "the job's success per update needs a newer run")
    episodes = tr["episodes"].sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        success = np.where(episodes > 0, tr["success_sum"].sum(axis=0) / episodes, np.nan)
        spl = np.where(episodes > 0, tr["spl_sum"].sum(axis=0) / episodes, np.nan)
    first = tr["time"][:, 0] - (tr["collect_s"] + tr["update_s"] + tr["comm_s"]
                                + tr["wait_s"])[:, 0]
    end = tr["time"].max(axis=0)
    return {"update": tr["update"][0], "frames": np.cumsum(tr["frames"].sum(axis=0)),
            "wall_s": end - first.min(), "end": end, "success": success, "spl": spl}


#: The parts of an update, in the order the loop runs them (the end-of-rollout wait is counted in
#: ``wait_s`` and drawn with the wait after the average).
_PARTS = ("collect_s", "update_s", "comm_s", "wait_s")


def chrome_trace(path: str | Path) -> dict:
    """The per-rank timeline of a trace folder in the Chrome trace-event format (opens in
    Perfetto, ui.perfetto.dev, and in chrome://tracing): one process per rank, one slice per part
    of every update (collect, update, communicate, wait), placed back from the update's recorded
    end, with the update's figures as the slice's arguments. Times are each rank's own clock."""
    tr = read_trace(path)
    ranks, updates = tr["update"].shape
    t0 = float(tr["time"].min() - (tr["collect_s"] + tr["update_s"] + tr["comm_s"] + tr["wait_s"]).max())
    events: list[dict] = []
    for r in range(ranks):
        events.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}})
        for u in range(updates):
            start = tr["time"][r, u] - sum(tr[p][r, u] for p in _PARTS)
            args = {k: float(tr[k][r, u]) for k in ("update", "steps", "staleness", "stale", "late",
                                                      "preempted", "synced")}
            args["group"] = list(tr["group"][r][u])
            for part in _PARTS:
                dur = float(tr[part][r, u])
                if dur > 0:
                    events.append({"name": part[:-2], "ph": "X", "pid": r, "tid": 0,
                                   "ts": round((start - t0) * 1e6, 1), "dur": round(dur * 1e6, 1),
                                   "args": args})
                start += dur
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def main(argv: list[str] | None = None) -> int:
    """``python -m wagma_rl.rl.trace RUN_DIR/trace OUT.json``: export the timeline."""
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(prog="python -m wagma_rl.rl.trace",
                                 description="Export a run's per-rank timeline (RUN_DIR/trace) for "
                                             "Perfetto (ui.perfetto.dev) or chrome://tracing.")
    ap.add_argument("trace", help="the run's trace folder (RUN_DIR/trace) or one rank's file")
    ap.add_argument("out", help="the JSON file to write")
    args = ap.parse_args(argv)
    try:
        doc = chrome_trace(args.trace)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps(doc))
    slices = sum(e["ph"] == "X" for e in doc["traceEvents"])
    print(f"wrote {args.out}: {slices} slices on {len({e['pid'] for e in doc['traceEvents']})} "
          "ranks; open it in https://ui.perfetto.dev or chrome://tracing")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
