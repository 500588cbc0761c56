"""Training statistics: windowed episode metrics per worker, per-update figures, and their
reduction over all workers at points where the workers are in step anyway."""
from __future__ import annotations

from collections import deque

import numpy as np
from mpi4py import MPI

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


def _pack(meter: UpdateMeter, episodes: EpisodeWindow, stop: bool):
    """This worker's figures as the three arrays reduced with SUM, MAX and MIN."""
    n = max(meter.n, 1)
    local_sum = np.array([meter.n] + [meter.sums[k] for k in UPDATE_KEYS] + list(episodes.sums()),
                         dtype=np.float64)
    mean_collect = meter.sums["collect_s"] / n
    local_max = np.array([mean_collect, meter.rollout_max, float(stop)])
    local_min = np.array([mean_collect, meter.rollout_min if meter.n else 0.0])
    return local_sum, local_max, local_min


def _unpack(tot: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> dict[str, float]:
    updates = max(tot[0], 1.0)
    out = {k: tot[1 + i] / updates for i, k in enumerate(UPDATE_KEYS)}
    out["frames"] = tot[1 + UPDATE_KEYS.index("frames")]  # a sum, not a mean
    out["preempted"] = tot[1 + UPDATE_KEYS.index("preempted")]  # worker-rollouts cut short
    ep = tot[1 + len(UPDATE_KEYS):]
    out["episodes"] = ep[0]
    for i, k in enumerate(EPISODE_KEYS):
        out[k] = ep[1 + i] / ep[0] if ep[0] > 0 else float("nan")
    out["collect_spread_s"] = hi[0] - lo[0]
    out["rollout_steps_max"], out["rollout_steps_min"] = hi[1], lo[1]
    out["stop"] = bool(hi[2])
    return out


def reduce_stats(sync: Deadline, meter: UpdateMeter, episodes: EpisodeWindow, *,
                 stop: bool = False) -> dict[str, float]:
    """Combine every worker's figures (collective, bounded by ``sync``'s timeout). Returns per-update means over all workers'
    updates, episode metrics over all workers' windows, frames summed, the spread of the workers'
    mean collection times, rollout length extremes, and ``stop`` (true when any worker asked)."""
    tot, hi, lo = _pack(meter, episodes, stop)
    if sync.size > 1:
        sync.allreduce(tot, op=MPI.SUM, what="statistics reduction")
        sync.allreduce(hi, op=MPI.MAX, what="statistics reduction")
        sync.allreduce(lo, op=MPI.MIN, what="statistics reduction")
    return _unpack(tot, hi, lo)


class LaggedStats:
    """The same reduction as :func:`reduce_stats` without a barrier: :meth:`start` posts it
    (non-blocking) and resets the meter, :meth:`finish` collects it at a later point. Every worker
    must start and finish the same reductions in the same order (the trainer does so at WAGMA's
    overlapped global averages, which every worker passes). A worker waits in :meth:`finish` only
    for a peer that has not yet *started* that reduction (bounded by ``sync``'s timeout)."""

    def __init__(self, sync: Deadline):
        self.sync = sync
        self._reqs: list = []
        self._arrays = None
        self.update = 0
        """The update at which the pending reduction was started."""
        self.time = 0.0
        """``time.perf_counter()`` when it was started."""

    @property
    def pending(self) -> bool:
        return self._arrays is not None

    def start(self, meter: UpdateMeter, episodes: EpisodeWindow, *, update: int, now: float) -> None:
        if self.pending:
            raise RuntimeError("LaggedStats.start: finish() the previous reduction first")
        self._arrays = _pack(meter, episodes, False)
        meter.reset()
        self.update, self.time = update, now
        if self.sync.size > 1:
            comm = self.sync.comm
            self._reqs = [comm.Iallreduce(MPI.IN_PLACE, a, op=op)
                          for a, op in zip(self._arrays, (MPI.SUM, MPI.MAX, MPI.MIN))]

    def finish(self) -> dict[str, float]:
        if not self.pending:
            raise RuntimeError("LaggedStats.finish: nothing was started")
        if self._reqs:
            others = [r for r in range(self.sync.size) if r != self.sync.rank]
            self.sync.wait(self._reqs, peers=others, what="lagged statistics reduction")
        out = _unpack(*self._arrays)
        self._reqs, self._arrays = [], None
        return out
