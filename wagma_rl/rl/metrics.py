"""Training statistics: windowed episode metrics per worker, per-update figures, env step times
and stalls, and their reduction over all workers at points where the workers are in step anyway."""
from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from wagma_rl.bounded_comm import BoundedComm
from wagma_rl.job.sync import RowLayout

__all__ = ["EpisodeWindow", "EnvStepTimes", "UpdateMeter", "reduce_stats", "LaggedStats",
           "stats_layout", "stats_row", "combine_stats",
           "env_summary", "episode_measures", "measure_names", "measure_scalars", "STALL_FACTOR",
           "STALL_FLOOR_S"]

EPISODE_KEYS = ("reward", "success", "spl", "distance_to_goal")
UPDATE_KEYS = ("collect_s", "update_s", "comm_s", "wait_s", "value_loss", "policy_loss", "entropy",
               "clip_fraction", "approx_kl", "grad_norm", "staleness", "stale", "rollout_steps",
               "preempted", "cut_short", "frames")


#: ``infos`` keys that describe an episode or a step, not a measure of it.
NOT_MEASURES = ("episode_id", "counted", "elapsed_steps")


def episode_measures(infos: dict, k: int) -> dict[str, float]:
    """Every measure env ``k``'s ``infos`` report (a vector env's arrays) as ``{name: float}``:
    ``success``, ``spl``, ``distance_to_goal`` and whatever else is numeric (habitat's
    ``soft_spl``, ``collisions.count``, ...; the embedded simulator's ``path_length``), all but
    :data:`NOT_MEASURES`."""
    out = {}
    for name, values in infos.items():
        if name in NOT_MEASURES or name.startswith("_"):
            continue
        arr = np.asarray(values)
        if arr.ndim == 1 and len(arr) > k and (np.issubdtype(arr.dtype, np.number)
                                               or arr.dtype == bool):
            out[name] = float(arr[k])
    return out


def measure_names(infos: dict) -> tuple[str, ...]:
    """The measures beyond reward, success, SPL and distance to goal that a vector env's
    ``infos`` report (habitat's ``soft_spl``, ``collisions.count``, ...), sorted: what an
    :class:`EpisodeWindow` is to keep (every rank must pass the same names)."""
    return tuple(sorted(k for k in episode_measures(infos, 0) if k not in EPISODE_KEYS))


def measure_scalars(stats: dict, prefix: str = "metrics/") -> dict[str, float]:
    """TensorBoard scalars of :func:`reduce_stats`'s other measures (``metrics/soft_spl``, ...),
    those no episode reported yet left out."""
    return {f"{prefix}{k}": float(v) for k, v in stats.get("measures", {}).items()
            if not np.isnan(v)}


class EpisodeWindow:
    """The last ``window`` finished episodes of one worker's ``num_envs`` environments: reward,
    success, SPL, distance to goal and the other ``measures`` (names as :func:`measure_names`
    gives them; an episode whose info lacks one counts as not reporting it)."""

    def __init__(self, num_envs: int, window: int, *, measures: tuple[str, ...] = ()):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.window: deque = deque(maxlen=window)
        self.measures = tuple(measures)
        self.extra: deque = deque(maxlen=window)  # the measures of the episodes in ``window``
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
            self.extra.append([float(infos[m][k]) if m in infos else np.nan
                               for m in self.measures])
            self.returns[i] = 0.0
            self.finished += 1

    def add_finished(self, records: np.ndarray) -> None:
        """Append finished episodes, rows of (return, success, spl, distance_to_goal) in the order
        they ended (the device rollout reads them once per update)."""
        for row in np.asarray(records, dtype=np.float64).reshape(-1, len(EPISODE_KEYS)):
            self.window.append(tuple(float(v) for v in row))
            self.extra.append([np.nan] * len(self.measures))
        self.finished += len(records)

    def sums(self) -> np.ndarray:
        """[episodes in window, sum reward, sum success, sum spl, sum distance_to_goal]."""
        if not self.window:
            return np.zeros(1 + len(EPISODE_KEYS))
        arr = np.asarray(self.window, dtype=np.float64)
        return np.concatenate([[len(arr)], arr.sum(axis=0)])

    def measure_sums(self) -> np.ndarray:
        """[sum, count] of each of :attr:`measures` over the episodes in the window that
        report it."""
        if not self.extra or not self.measures:
            return np.zeros(2 * len(self.measures))
        arr = np.asarray(self.extra, dtype=np.float64).reshape(-1, len(self.measures))
        return np.stack([np.nansum(arr, axis=0), np.sum(~np.isnan(arr), axis=0)], 1).reshape(-1)


#: An env step is a stall when it takes more than STALL_FACTOR times its env's running median step
#: time and more than STALL_FLOOR_S seconds (shorter pauses are scheduling noise or, in VER, a
#: result read late because the worker was running inference for other envs).
STALL_FACTOR = 5.0
STALL_FLOOR_S = 0.1
_EXACT_STEPS = 8  # an env's running median is exact over its first steps, then tracks


class EnvStepTimes:
    """The step times of one worker's ``num_envs`` envs since the last reduction, and its stalls.

    A collector calls :meth:`observe` with the seconds each step took. A step is a *stall* when it
    takes more than :data:`STALL_FACTOR` times its env's running median step time and more than
    :data:`STALL_FLOOR_S`. The running median is the median of the env's first 8 steps, then moves
    10% up after a longer step and 10% down after a shorter one: it settles at the median of the
    env's recent steps, a few stalls barely move it, and an env that is slow at every step is
    slow, not stalled (it shows as the slowest env of :meth:`figures`). A step that ended an
    episode is timed but not judged, nor does it move the median: the env's next episode starts
    inside it, and resets take from as long as a step to far longer (a new scene loaded).
    """

    def __init__(self, num_envs: int):
        self.num_envs = int(num_envs)
        self.median_s = np.full(self.num_envs, np.nan)
        """Each env's running median step time (NaN before its first judged step)."""
        self.steps = np.zeros(self.num_envs, dtype=np.int64)
        """Each env's judged steps since the start (the running median's age)."""
        self._first = np.zeros((self.num_envs, _EXACT_STEPS))  # each env's first step times
        self.reset()

    def reset(self) -> None:
        """Start a new interval (the running medians go on)."""
        self.sum_s = np.zeros(self.num_envs)
        self.count = np.zeros(self.num_envs, dtype=np.int64)
        self.stalls = 0
        self.stalled_s = 0.0

    def observe(self, seconds, env_ids=None, *, ended=False) -> None:
        """Account one step of each env ``env_ids`` (distinct), which took ``seconds`` (one
        figure, or one per env); ``env_ids`` None: every env, stepping together. ``ended``: which
        of these steps ended an episode (one flag, or one per env)."""
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids, dtype=np.int64)
        secs = np.broadcast_to(np.asarray(seconds, dtype=np.float64), ids.shape)
        self.sum_s[ids] += secs
        self.count[ids] += 1
        judged = ~np.broadcast_to(np.asarray(ended, dtype=bool), ids.shape)
        ids, secs = ids[judged], secs[judged]
        ref = self.median_s[ids]
        stalled = secs > np.maximum(STALL_FACTOR * ref, STALL_FLOOR_S)  # NaN (no median): never
        self.stalls += int(stalled.sum())
        self.stalled_s += float(secs[stalled].sum())
        young = self.steps[ids] < _EXACT_STEPS
        for i, x in zip(ids[young], secs[young]):  # (an env's first steps only)
            n = self.steps[i]
            self._first[i, n] = x
            self.median_s[i] = np.median(self._first[i, :n + 1])
        ref, x = ref[~young], secs[~young]
        self.median_s[ids[~young]] = np.where(x > ref, ref * 1.1, np.where(x < ref, ref / 1.1, ref))
        self.steps[ids] += 1

    def figures(self) -> np.ndarray:
        """This interval as ENV_KEYS: the median over the envs of their mean step time (ms), the
        slowest env's mean step time (ms) and its index (-1: none is slower than the others, as
        when they step together), the stalled steps, and the seconds they took summed over the
        envs and divided by their number (the time lost to stalls per env; in lock-step
        collection, the time the worker spent in stalled steps). NaN times: no step timed."""
        timed = self.count > 0
        if not timed.any():
            return np.array([np.nan, np.nan, -1.0, self.stalls, self.stalled_s / self.num_envs])
        mean_ms = 1e3 * self.sum_s[timed] / self.count[timed]
        slow = int(np.argmax(mean_ms))
        env = np.flatnonzero(timed)[slow] if mean_ms[slow] > mean_ms.min() else -1
        return np.array([np.median(mean_ms), mean_ms[slow], env, self.stalls,
                         self.stalled_s / self.num_envs])


class UpdateMeter:
    """Sums of per-update figures since the last reduction, and the step times of this worker's
    ``num_envs`` envs over the same span (:attr:`env_times`, for its collector to fill)."""

    def __init__(self, num_envs: int = 1):
        self.env_times = EnvStepTimes(num_envs)
        self.reset()

    def reset(self) -> None:
        self.env_times.reset()
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
_SUMMED = ("frames", "preempted", "cut_short")
#: The per-worker env figures of an interval (:meth:`EnvStepTimes.figures`).
ENV_KEYS = ("env_step_ms", "env_step_max_ms", "env_step_max_env", "stalls", "stall_s")


def stats_layout(measures: tuple[str, ...] = ()) -> RowLayout:
    """The fields of a worker's statistics row: its updates, the sums of UPDATE_KEYS, the episode
    window's count and sums of EPISODE_KEYS, the env figures (ENV_KEYS: the same whatever the
    number of envs), rollout length min and max, the stop flag, and the sum and count of each of
    the other ``measures``."""
    return RowLayout(("updates", *UPDATE_KEYS, "episodes", *EPISODE_KEYS, *ENV_KEYS,
                      "rollout_min", "rollout_max", "stop"), {"measures": 2 * len(measures)})


def stats_row(meter: UpdateMeter, episodes: EpisodeWindow) -> dict[str, Any]:
    """This worker's figures since the last reduction, by :func:`stats_layout`'s fields (the stop
    flag left to the caller)."""
    return {"updates": meter.n, **meter.sums, **dict(zip(("episodes", *EPISODE_KEYS), episodes.sums())),
            **dict(zip(ENV_KEYS, meter.env_times.figures())),
            "rollout_min": meter.rollout_min if meter.n else 0.0, "rollout_max": meter.rollout_max,
            "measures": episodes.measure_sums()}


def _row(meter: UpdateMeter, episodes: EpisodeWindow, stop: bool) -> np.ndarray:
    """This worker's row (:func:`stats_layout`) as an array."""
    return stats_layout(episodes.measures).pack({**stats_row(meter, episodes), "stop": stop})


def combine_stats(rows: np.ndarray, measures: tuple[str, ...] = ()) -> dict:
    """The statistics of every worker's row (row r from rank r; :func:`stats_layout`);
    ``measures``: the names of the other measures (``measures`` in the result: each one's mean
    over the episodes that report it, NaN without any)."""
    layout = stats_layout(measures)
    columns, total = layout.columns(rows), layout.totals(rows)
    updates = max(total["updates"], 1.0)
    out = {k: total[k] / updates for k in UPDATE_KEYS}
    for k in _SUMMED:
        out[k] = total[k]  # frames; worker-rollouts cut short
    episodes = out["episodes"] = total["episodes"]
    for k in EPISODE_KEYS:
        out[k] = total[k] / episodes if episodes > 0 else float("nan")
    per = np.maximum(columns["updates"], 1.0)
    workers = {k: columns[k] / (1.0 if k in _SUMMED else per) for k in WORKER_KEYS}
    workers.update({k: columns[k] for k in ENV_KEYS})
    out["collect_spread_s"] = float(workers["collect_s"].max() - workers["collect_s"].min())
    out["rollout_steps_min"], out["rollout_steps_max"] = columns["rollout_min"].min(), columns["rollout_max"].max()
    out["stop"] = bool(columns["stop"].max())
    out["workers"] = workers
    extra = total["measures"].reshape(-1, 2)
    out["measures"] = {m: (s / c if c > 0 else float("nan")) for m, (s, c) in zip(measures, extra)}
    return out




def reduce_stats(deadline: BoundedComm, meter: UpdateMeter, episodes: EpisodeWindow, *,
                 stop: bool = False) -> dict:
    """Combine every worker's figures (one allgather, bounded by ``deadline``'s timeout). Returns
    per-update means over all workers' updates, episode metrics over all workers' windows, frames
    summed, the spread of the workers' mean collection times, rollout length extremes, ``stop``
    (true when any worker asked) and ``workers``: each of WORKER_KEYS and ENV_KEYS per worker (an
    array indexed by rank), for the per-worker view. (The trainer's synchronised points gather
    the same row through :meth:`wagma_rl.job.sync.SyncPoint.gather`, which folds the stop in,
    and combine it with :func:`combine_stats`.)"""
    return combine_stats(deadline.allgather(_row(meter, episodes, stop), what="statistics reduction"),
                         episodes.measures)


def env_summary(workers: dict) -> str | None:
    """A line naming the slowest env of all workers (against the median worker's median env step
    time) and the worker with the most stalls, from :func:`reduce_stats`' ``workers``; None when
    no env step was timed."""
    slowest = np.asarray(workers["env_step_max_ms"], dtype=np.float64)
    if np.isnan(slowest).all():
        return None
    rank = int(np.nanargmax(slowest))
    median = float(np.nanmedian(workers["env_step_ms"]))
    env = int(workers["env_step_max_env"][rank])
    who = f"rank {rank} env {env}" if env >= 0 else f"rank {rank} (its envs step together)"
    ms = slowest[rank]
    figure = f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"  # 0.412, 31.4, 1250 (not 1.25e+03)
    ratio = ms / median if median > 0 else float("nan")
    line = f"slowest env: {who}, {figure} ms/step, {ratio:.1f}x the median"
    stalls = np.asarray(workers["stalls"], dtype=np.float64)
    if stalls.max() > 0:
        most = int(np.argmax(stalls))
        line += (f"; most stalls: rank {most}, {stalls[most]:.0f} env steps "
                 f"({float(workers['stall_s'][most]):.3g} s per env)")
    return line


class LaggedStats:
    """The same reduction as :func:`reduce_stats` without a barrier: :meth:`start` posts it
    (non-blocking) and resets the meter, :meth:`finish` collects it at a later point. Every worker
    must start and finish the same reductions in the same order (the trainer does so at WAGMA's
    overlapped global averages, which every worker passes). A worker waits in :meth:`finish` only
    for a peer that has not yet *started* that reduction (bounded by ``deadline``'s timeout)."""

    def __init__(self, deadline: BoundedComm):
        self.deadline = deadline
        self._reqs: list = []
        self._row: np.ndarray | None = None  # (the send buffer: alive until the gather is done)
        self._rows: np.ndarray | None = None
        self._measures: tuple[str, ...] = ()
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
        self._measures = episodes.measures
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
        out = combine_stats(self._rows, self._measures)
        self._reqs, self._row, self._rows = [], None, None
        return out
