"""The within-rank layer: how each worker's envs turn into its rollout, lock-step or VER.

The rank-level times (:mod:`.rollout`) say how long a worker's full rollout takes at nominal env
speed: ``even`` per step plus the rank's own stalls (``lumps`` at some vector steps). Inside the
rank, env ``i``'s step takes ``even * f_i + stall`` (:meth:`Draw.env_steps`: slow envs and env
stalls, the trainer's ``heterogeneity.slow_envs`` / ``env_slowdown`` / ``env_stall_*``). Two
collection modes, as ``wagma_rl/rl/collect.py`` implements them (``rollout.mode``):

* ``lockstep`` (:class:`Lockstep`, DD-PPO): every env steps together and the rank waits for its
  slowest env at every step, so vector step ``k`` takes ``max_i(even f_i + stall_ik) + lump_k``
  and a full rollout ``num_steps`` of them.
* ``ver`` (:class:`Ver`, variable experience rollouts): each env steps on its own and is given its
  next action as soon as its step is in (inference is not timed); the rollout ends at the event
  that brings ``num_steps * num_envs`` steps, or earlier at the cut-off rule
  (``wagma_rl.rl.collect.CutoffRule``: stop once ``R (t + L) < S``, ``S`` steps collected in ``t``
  seconds, ``R`` the step rate of the envs with room, ``sum 1 / max(tau_i, in flight_i)`` over
  each env's smoothed observed step time ``tau_i``, ``L`` the smoothed update time; never below
  ``min_frac`` of the target, nor before an update time was observed); an env holds at most
  ``ceil(max_env_steps * num_steps)`` steps. The steps in flight at the cut (and a fresh one for
  every full env) go on while the rank learns and open the next rollout; their observed time
  includes the learning, as in the trainer. The rank's own stalls pause the whole rank after the
  vector step (every ``num_envs`` steps) they belong to, as the trainer's ``rank_step`` does (the
  envs' own clocks stop too, an approximation of at most one env step per stall).

Preemption looks at the vector-step ends (:meth:`Rollout.steps`): the trainer asks the strategy
once per ``num_envs`` steps in both modes. Not modelled: inference time and its batching wait
(``rollout.min_batch``), and the CPU the env processes take from the learner.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Callable

import numpy as np

from .rollout import Draw

__all__ = ["Rollout", "Lockstep", "Ver", "make_collection", "COLLECTIONS"]

COLLECTIONS = ("lockstep", "ver")
SMOOTHING = 0.2  # the cut-off rule's exponential smoothing (wagma_rl.rl.collect.CutoffRule)


@dataclasses.dataclass
class Rollout:
    """One update's rollouts of every worker, times relative to each worker's start."""

    end: np.ndarray
    """``[workers]``: when the rollout ends unless preempted (all steps, or VER's cut-off)."""
    frames: np.ndarray
    """``[workers]``: frames collected by then."""
    cut: np.ndarray
    """``[workers]``: whether VER's cut-off rule ended it before the target."""
    _steps: Callable[[], tuple[np.ndarray, np.ndarray]]

    def steps(self) -> tuple[np.ndarray, np.ndarray]:
        """``(times, frames)``, both ``[workers, num_steps]``: when vector step ``k`` (every
        ``num_envs`` frames) is over, and the frames by then (``inf`` for a step the rollout
        does not reach)."""
        return self._steps()


class Lockstep:
    """DD-PPO's collection: every vector step waits for the rank's slowest env."""

    def __init__(self, draw: Draw, *, num_envs: int, num_steps: int):
        self.draw, self.n, self.envs = draw, num_steps, num_envs
        self.frames = float(num_envs * num_steps)

    def next(self, u: int) -> Rollout:
        """Update ``u``'s rollouts."""
        p = self.draw.collect.shape[1]
        full = np.full(p, self.frames)
        per_step = self.envs * np.arange(1, self.n + 1, dtype=float)[None, :].repeat(p, axis=0)
        if not self.draw.envs_differ:  # every env at the rank's pace: the drawn times as they are
            return Rollout(self.draw.collect[u], full, np.zeros(p, bool),
                           lambda: (self.draw.step_ends(u, self.n), per_step))
        even, lumps = self.draw.step_parts(u, self.n)
        slowest = self.draw.env_steps(u, even, self.envs, self.n).max(axis=1)
        ends = np.cumsum(slowest + lumps, axis=1)
        return Rollout(ends[:, -1], full, np.zeros(p, bool), lambda: (ends, per_step))

    def finish(self, stop: np.ndarray, frames: np.ndarray, *, gap: np.ndarray,
               learn: np.ndarray) -> None:
        """Lock-step rollouts leave nothing running into the next update."""


class Ver:
    """Variable experience rollouts (see the module doc); keeps each env's step in flight, the
    cut-off rule's smoothed step and update times from one update to the next."""

    def __init__(self, draw: Draw, *, num_envs: int, num_steps: int, max_env_steps: float = 2.0,
                 cutoff: str = "auto", min_frac: float = 0.25):
        p = draw.collect.shape[1]
        self.draw, self.n, self.envs = draw, num_steps, num_envs
        self.capacity = int(math.ceil(max_env_steps * num_steps))
        self.target = num_steps * num_envs
        self.min_frames = int(math.ceil(min_frac * self.target)) if cutoff == "auto" else None
        self.in_flight: tuple[np.ndarray, np.ndarray] | None = None  # (sent, done) per env
        self.tau = np.full((p, num_envs), np.nan)  # the rule's smoothed step times
        self.learn = np.full(p, np.nan)  # the rule's smoothed update time
        self._last: dict = {}

    def next(self, u: int) -> Rollout:
        """Update ``u``'s rollouts (after :meth:`finish` of the previous one)."""
        d, n, envs, cap = self.draw, self.n, self.envs, self.capacity
        even, lumps = d.step_parts(u, n)
        dur = d.env_steps(u, even, envs, cap + 1)  # column cap: a full env's step after the cut
        p = even.shape[0]
        if self.in_flight is None:  # the first rollout: every env sent its first step at 0
            sent, done = np.zeros((p, envs)), dur[:, :, 0]
        else:
            sent, done = self.in_flight
        first = np.maximum(done, 0.0)  # a step that ended while the rank learned is read at 0
        ends = np.cumsum(np.concatenate([first[:, :, None], dur[:, :, 1:cap]], axis=2), axis=2)
        starts = np.concatenate([sent[:, :, None], ends[:, :, :-1]], axis=2)
        # the rule's smoothed step time after each env's j-th step (j = 0: before this rollout)
        tau = np.empty((p, envs, cap + 1))
        tau[:, :, 0] = self.tau
        for j in range(cap if self.min_frames is not None else 0):
            prev, obs = tau[:, :, j], ends[:, :, j] - starts[:, :, j]
            tau[:, :, j + 1] = np.where(np.isnan(prev), obs,
                                        (1 - SMOOTHING) * prev + SMOOTHING * obs)

        # every arrival in time order, up to the event that completes the target
        m_max = min(envs * cap, self.target + envs - 1)
        flat = ends.reshape(p, envs * cap)
        order = np.argsort(flat, axis=1, kind="stable")[:, :m_max]
        t = np.take_along_axis(flat, order, axis=1)
        env_of = order // cap
        # arrivals at the same time come back together: the rank acts after the last of them
        last = np.empty((p, m_max), bool)
        last[:, :-1] = t[:, :-1] < t[:, 1:]
        last[:, -1] = True
        idx = np.where(last, np.arange(m_max)[None, :], m_max)
        batch_end = np.minimum.accumulate(idx[:, ::-1], axis=1)[:, ::-1]  # [p, m]: 0-based
        # the rank's own stalls: a pause after each vector step (every `envs` arrivals)
        paused = np.concatenate([np.zeros((p, 1)), np.cumsum(lumps, axis=1)], axis=1)  # [p, n+1]
        m1 = np.arange(1, m_max + 1)  # 1-based arrival counts
        after = t + paused[:, np.minimum(m1 // envs, n)]  # the rank's clock after event m

        stop_at = batch_end[:, self.target - 1]  # the event batch completing the target
        cut = np.zeros(p, bool)
        if self.min_frames is not None and not np.isnan(self.learn).all():
            at = self._cutoff(t, env_of, last, after, stop_at, tau, starts)
            cut = (at >= 0) & (at < stop_at)
            stop_at = np.where(cut, at, stop_at)

        rows = np.arange(p)
        end, frames = after[rows, stop_at], (stop_at + 1).astype(float)
        self._last = dict(t=t, ends=ends, starts=starts, dur=dur, env_of=env_of, tau=tau,
                          batch_end=batch_end, after=after)

        def steps() -> tuple[np.ndarray, np.ndarray]:
            k = np.arange(1, n + 1) * envs - 1  # the arrival completing vector step k (0-based)
            ok = k[None, :] < m_max
            at = batch_end[:, np.minimum(k, m_max - 1)]
            times = t[rows[:, None], at] + paused[:, 1:]  # its batch, then the rank's stall
            reached = ok & (at <= stop_at[:, None])
            return np.where(reached, times, np.inf), np.where(reached, at + 1.0, np.inf)

        return Rollout(end, frames, cut, steps)

    def _cutoff(self, t, env_of, last, after, stop_at, tau, starts) -> np.ndarray:
        """The first event (0-based; -1: none) at which the cut-off rule ends each worker's
        rollout, in chunks of events so that workers already cut stop costing time."""
        p, m_max = t.shape
        envs, cap = self.envs, self.capacity
        lo, hi = self.min_frames - 1, int(stop_at.max()) + 1
        at = np.full(p, -1)
        if lo >= hi:
            return at
        onehot = env_of[:, :, None] == np.arange(envs)[None, None, :]
        had = onehot[:, :lo].sum(axis=1)  # [p, envs]: steps each env had in before event lo
        lane = (np.arange(envs) * (cap + 1))[None, None, :]
        tau_flat = tau.reshape(p, -1)
        starts_flat = np.concatenate([starts, np.full((p, envs, 1), np.inf)], axis=2).reshape(p, -1)
        for a in range(lo, hi, 128):
            b = min(a + 128, hi)
            c = had[:, None, :] + np.cumsum(onehot[:, a:b], axis=1)  # [p, k, envs] after each event
            had = c[:, -1]
            k = b - a
            flat = (c + lane).reshape(p, -1)
            tau_k = np.take_along_axis(tau_flat, flat, axis=1).reshape(p, k, envs)
            unknown = np.isnan(tau_k)
            if unknown.any():  # an env not yet observed counts at the others' mean, as in the rule
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    tau_k = np.where(unknown, np.nanmean(tau_k, axis=2, keepdims=True), tau_k)
            since = np.take_along_axis(starts_flat, flat, axis=1).reshape(p, k, envs)
            room = c < cap
            # a step in flight for longer than the env's mean counts at its own time
            slow = np.maximum(np.maximum(tau_k, t[:, a:b, None] - since), 1e-9)
            rate = np.where(room, 1.0 / slow, 0.0).sum(axis=2)
            rate = np.where(np.isnan(rate), np.inf, rate)  # no step time observed yet
            m1 = np.arange(a + 1, b + 1)[None, :]
            stops = last[:, a:b] & (m1 <= stop_at[:, None] + 1) & (
                rate * (after[:, a:b] + self.learn[:, None]) < m1)
            hit = stops.any(axis=1) & (at < 0)
            at[hit] = a + np.argmax(stops[hit], axis=1)
            if ((at >= 0) | (stop_at < b)).all():
                break
        return at

    def finish(self, stop: np.ndarray, frames: np.ndarray, *, gap: np.ndarray,
               learn: np.ndarray) -> None:
        """The rank stopped collecting after ``frames`` frames at ``stop`` and starts its next
        rollout ``gap`` seconds later, ``learn`` of them the update the cut-off rule observes:
        carry every env's step in flight (a full env's fresh one) into the next rollout."""
        last = self._last
        p, envs, cap = last["ends"].shape
        rows = np.arange(p)
        m = frames.astype(int) - 1
        cut_t = last["t"][rows, m]  # the envs' clock at the cut (the rank's stalls not counted)
        seen = np.arange(last["t"].shape[1])[None, :] <= m[:, None]
        had = np.stack([((last["env_of"] == e) & seen).sum(axis=1) for e in range(envs)], axis=1)
        full = had >= cap
        j = np.minimum(had, cap - 1)
        sent = np.take_along_axis(last["starts"], j[:, :, None], axis=2)[:, :, 0]
        done = np.take_along_axis(last["ends"], j[:, :, None], axis=2)[:, :, 0]
        sent = np.where(full, cut_t[:, None], sent)
        done = np.where(full, cut_t[:, None] + last["dur"][:, :, cap], done)
        shift = cut_t[:, None] + gap[:, None]
        self.in_flight = (sent - shift, done - shift)
        self.tau = np.take_along_axis(last["tau"], had[:, :, None], axis=2)[:, :, 0]
        self.learn = np.where(np.isnan(self.learn), learn,
                              (1 - SMOOTHING) * self.learn + SMOOTHING * learn)


def make_collection(mode: str, draw: Draw, *, num_envs: int, num_steps: int,
                    max_env_steps: float = 2.0, cutoff: str = "auto", min_frac: float = 0.25):
    """The within-rank model ``mode`` (``lockstep`` or ``ver``) over ``draw``'s times."""
    if mode == "lockstep":
        return Lockstep(draw, num_envs=num_envs, num_steps=num_steps)
    if mode == "ver":
        return Ver(draw, num_envs=num_envs, num_steps=num_steps, max_env_steps=max_env_steps,
                   cutoff=cutoff, min_frac=min_frac)
    raise ValueError(f"unknown collection mode {mode!r}; choose from {list(COLLECTIONS)}")
