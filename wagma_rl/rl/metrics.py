"""Training statistics: windowed episode metrics per worker, per-update figures, and their
reduction over all workers at points where the workers are in step anyway."""
from __future__ import annotations

from collections import deque

import numpy as np

from wagma_rl.job.deadline import Deadline

__all__ = ["EpisodeWindow", "UpdateMeter", "reduce_stats", "LaggedStats"]

EPISODE_KEYS = ("reward", "success", "spl", "distance_to_goal")
UPDATE_KEYS = ("collect_s", "update_s", "comm_s", "wait_s", "value_loss", "policy_loss", "entropy",
               "clip_fraction", "approx_kl", "grad_norm", "staleness", "stale", "rollout_steps",
               "preempted", "frames")


class EpisodeWindow:
    """The last ``window`` finished episodes of one worker's ``num_envs`` environments."""

    def __init__(self, num_envs: int, window: int):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.window: deque = deque(maxlen=window)
        self.finished = 0

    def step(self, rewards: np.ndarray, dones: np.ndarray, infos: dict, *,
             env_ids: np.ndarray | None = None) -> None:
        """Account one step of every env, or of the envs ``env_ids`` (the arrays are then theirs,
        in that order); ``infos`` holds the ended episodes' final metrics."""
        ids = np.arange(len(self.returns)) if env_ids is None else np.asarray(env_ids)
        self.returns[ids] += rewards
        for k in np.flatnonzero(dones):
            i = ids[k]
            self.window.append((self.returns[i], float(infos["success"][k]), float(infos["spl"][k]),
                                float(infos["distance_to_goal"][k])))
            self.returns[i] = 0.0
            self.finished += 1

    def sums(self) -> np.ndarray:
        """[episodes in window, sum reward, sum success, sum spl, sum distance_to_goal]."""
        if not self.window:
            return np.zeros(1 + len(EPISODE_KEYS))
        arr = np.asarray(self.window, dtype=np.float64)
        return np.concatenate([[len(arr)], arr.sum(axis=0)])


class UpdateMeter:
    """Sums of per-update figures since the last reduction."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.n = 0
        self.sums = dict.fromkeys(UPDATE_KEYS, 0.0)
        self.rollout_min = np.inf
        self.rollout_max = 0.0

    def add(self, **values: float) -> None:
        unknown = set(values) - set(UPDATE_KEYS)
        if unknown:
            raise KeyError(f"unknown update statistics {sorted(unknown)}")
        self.n += 1
        for k, v in values.items():
            self.sums[k] += float(v)
        steps = values.get("rollout_steps", 0.0)
        self.rollout_min = min(self.rollout_min, steps)
        self.rollout_max = max(self.rollout_max, steps)


#: Per-worker figures kept apart after the reduction (the per-worker view: means per update, but
#: ``frames`` and ``preempted``, which are sums over the interval).
WORKER_KEYS = ("collect_s", "update_s", "comm_s", "wait_s", "staleness", "stale", "rollout_steps",
               "preempted", "frames")
_SUMMED = ("frames", "preempted")


def _row(meter: UpdateMeter, episodes: EpisodeWindow, stop: bool) -> np.ndarray:
    """This worker's figures as one row: updates, the sums of UPDATE_KEYS, the episode window's
    sums, then rollout length min and max, and the stop flag."""
    return np.array([meter.n, *(meter.sums[k] for k in UPDATE_KEYS), *episodes.sums(),
                     meter.rollout_min if meter.n else 0.0, meter.rollout_max, float(stop)],
                    dtype=np.float64)


def _combine(rows: np.ndarray) -> dict:
    """The statistics of every worker's row (row r from rank r)."""
    tot = rows[:, :-3].sum(axis=0)
    updates = max(tot[0], 1.0)
    out = {k: tot[1 + i] / updates for i, k in enumerate(UPDATE_KEYS)}
    for k in _SUMMED:
        out[k] = tot[1 + UPDATE_KEYS.index(k)]  # frames; worker-rollouts cut short
    ep = tot[1 + len(UPDATE_KEYS):]
    out["episodes"] = ep[0]
    for i, k in enumerate(EPISODE_KEYS):
        out[k] = ep[1 + i] / ep[0] if ep[0] > 0 else float("nan")
    per = np.maximum(rows[:, 0], 1.0)
    workers = {k: rows[:, 1 + UPDATE_KEYS.index(k)] / (1.0 if k in _SUMMED else per) for k in WORKER_KEYS}
    out["collect_spread_s"] = float(workers["collect_s"].max() - workers["collect_s"].min())
    out["rollout_steps_min"], out["rollout_steps_max"] = rows[:, -3].min(), rows[:, -2].max()
    out["stop"] = bool(rows[:, -1].max())
    out["workers"] = workers
    return out


def reduce_stats(deadline: Deadline, meter: UpdateMeter, episodes: EpisodeWindow, *,
                 stop: bool = False) -> dict:
    """Combine every worker's figures (one allgather, bounded by ``deadline``'s timeout). Returns
    per-update means over all workers' updates, episode metrics over all workers' windows, frames
    summed, the spread of the workers' mean collection times, rollout length extremes, ``stop``
    (true when any worker asked) and ``workers``: each of WORKER_KEYS per worker (an array
    indexed by rank), for the per-worker view."""
    return _combine(deadline.allgather(_row(meter, episodes, stop), what="statistics reduction"))


class LaggedStats:
    """The same reduction as :func:`reduce_stats` without a barrier: :meth:`start` posts it
    (non-blocking) and resets the meter, :meth:`finish` collects it at a later point. Every worker
    must start and finish the same reductions in the same order (the trainer does so at WAGMA's
    overlapped global averages, which every worker passes). A worker waits in :meth:`finish` only
    for a peer that has not yet *started* that reduction (bounded by ``deadline``'s timeout)."""

    def __init__(self, deadline: Deadline):
        self.deadline = deadline
        self._reqs: list = []
        self._row: np.ndarray | None = None  # (the send buffer: alive until the gather is done)
        self._rows: np.ndarray | None = None
        self.update = 0
        """The update at which the pending reduction was started."""
        self.time = 0.0
        """``time.perf_counter()`` when it was started."""

    @property
    def pending(self) -> bool:
        return self._rows is not None

    def start(self, meter: UpdateMeter, episodes: EpisodeWindow, *, update: int, now: float) -> None:
        if self.pending:
            raise RuntimeError("LaggedStats.start: finish() the previous reduction first")
        self._row = row = _row(meter, episodes, False)
        self._rows = np.empty((self.deadline.size, row.size))
        self._rows[self.deadline.rank] = row
        meter.reset()
        self.update, self.time = update, now
        if self.deadline.size > 1:
            self._reqs = [self.deadline.comm.Iallgather(row, self._rows)]

    def finish(self) -> dict:
        if not self.pending:
            raise RuntimeError("LaggedStats.finish: nothing was started")
        if self._reqs:
            others = [r for r in range(self.deadline.size) if r != self.deadline.rank]
            self.deadline.wait(self._reqs, peers=others, what="lagged statistics reduction")
        out = _combine(self._rows)
        self._reqs, self._row, self._rows = [], None, None
        return out
