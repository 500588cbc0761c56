"""Discrete-event models of the trainer's five modes, one function per mode, at the level of one
update of every worker (numpy over the workers, a loop over the updates).

Each worker's rollout comes from the within-rank model of ``Setup.collection``
(:mod:`.collection`: lock-step or VER over its envs' step times), which also says when each
vector step (``num_envs`` frames) ends; a rollout's PPO compute is in proportion to its frames.
Each model follows the protocol as the project implements it:

* ``allreduce`` (``wagma_rl/distrib/average.py``): every worker collects its rollout; a
  barrier at the end of the rollout (everyone waits for the slowest); the PPO update averages the
  gradients ``grad_rounds`` times (epochs x mini-batches), each round waiting for the slowest
  worker's compute of that round and then an MPI allreduce of the model-sized gradient.
* ``preempt`` (``distrib/preempt.py``, ``distrib/counter.py``): as ``allreduce``, but the shared
  counter of finished workers reaches ``ceil(sync_frac P)`` when that many have ended their
  rollouts; from then on a worker that has done at least ``short_frac`` of its vector steps stops
  at the end of its current one (a worker inside a stall finishes it first).
* ``wagma`` (``native_coll/src/wa.h``, ``distrib/average.py``): iteration t's groups are
  ``native_coll.group_of(P, S, t, rank)``; a group activates when its first member arrives; a
  member arriving no later than one message latency after that is fresh, the others take part
  with their published model (stale) and, when they arrive, find the result (late rule, no
  waiting; a member arriving while the group is still reducing waits for the result). The group
  costs the native two-round schedule. A stale contribution is ``1 + (earlier calls this member
  had not returned from at activation)`` iterations behind, as the engine counts it. Every
  ``sync_period``-th iteration is global: a barrier (everyone waits for the slowest) and the
  native schedule over all P.
* ``wagma_overlap`` (``global_mode="overlap"``): as ``wagma``, but a global call returns at once;
  the average completes once the last worker has arrived (plus the native schedule over all P),
  and a worker's next global call waits for that completion (the engine's bound). Every
  ``overlap_sync_every``-th global is followed by the trainer's synchronisation (a barrier and an
  average of all P: a synchronised point).
* ``dpsgd`` (``distrib/average.py``): after its local update a worker handshakes with both ring
  neighbours (waits until both have arrived), then exchanges models with them (so it also waits
  for their handshakes); global average every ``sync_period`` updates as ``local_sgd``.
* ``local_sgd`` (``distrib/average.py``): local updates only; every ``sync_period``-th update a
  barrier and an MPI allreduce of the model.

What the models leave out: learning per frame (how many frames each mode needs to reach a
success rate), contention for shared cores or links, the collective's progress-thread
scheduling, and start-up; the figures are throughput only.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .collection import Rollout, make_collection
from .network import Network
from .rollout import Draw

__all__ = ["Setup", "simulate", "MODES"]

MODES = ("allreduce", "preempt", "wagma", "wagma_overlap", "dpsgd", "local_sgd")


@dataclasses.dataclass
class Setup:
    """The job being simulated (defaults: the project's configs/*_pointnav.yaml, except
    ``num_steps``: DD-PPO's 128 where the configs take 64 for more updates per CPU minute)."""

    workers: int
    updates: int
    network: Network
    group_size: int = 2
    sync_period: int = 10
    overlap_sync_every: int = 4
    """wagma_overlap: every n-th global average is followed by a synchronisation."""
    sync_frac: float = 0.6
    short_frac: float = 0.25
    num_envs: int = 4
    """Envs per worker (env.num_envs)."""
    num_steps: int = 128
    """Steps per env in a full rollout (ppo.num_steps); a full rollout is num_envs x num_steps
    frames."""
    collection: str = "lockstep"
    """How a worker collects inside its rank (rollout.mode): lockstep or ver (see .collection)."""
    max_env_steps: float = 2.0
    """ver: an env holds at most this many times num_steps steps (rollout.max_env_steps)."""
    cutoff: str = "auto"
    """ver: auto (the steps-per-second cut-off rule) or full (rollout.cutoff)."""
    min_frac: float = 0.25
    """ver: the cut-off never ends a rollout below this share of the target (rollout.min_frac)."""
    grad_rounds: int = 4
    """Gradient averages per PPO update in the DD-PPO modes (ppo_epoch x num_mini_batch)."""
    params: int = 169_981
    """Model parameters (float32) averaged: the project's CPU policy (configs/wagma_pointnav.yaml)."""

    @property
    def nbytes(self) -> float:
        return 4.0 * self.params

    @property
    def frames_per_update(self) -> int:
        """Frames one worker collects in a full rollout."""
        return self.num_envs * self.num_steps

    def collector(self, draw: Draw):
        """The within-rank model of this job over ``draw``'s times."""
        return make_collection(self.collection, draw, num_envs=self.num_envs,
                               num_steps=self.num_steps, max_env_steps=self.max_env_steps,
                               cutoff=self.cutoff, min_frac=self.min_frac)


class _Totals:
    """Per-worker time components summed over the run, and the figures derived from them."""

    def __init__(self, p: int):
        self.collect = np.zeros(p)
        self.compute = np.zeros(p)
        self.comm = np.zeros(p)
        self.wait = np.zeros(p)
        self.frames = 0.0
        self.rollout_frames: list[np.ndarray] = []
        self.preempted: list[np.ndarray] = []
        self.cut = 0
        self.staleness: dict[int, int] = {}
        self.late = 0

    def rollout(self, roll: Rollout, stop: np.ndarray, frames: np.ndarray,
                compute: np.ndarray) -> None:
        """Account one update's rollouts (collected until ``stop``) and PPO compute."""
        self.collect += stop
        self.compute += compute
        self.frames += float(frames.sum())
        self.rollout_frames.append(frames)
        self.cut += int(roll.cut.sum())

    def result(self, setup: Setup, wall: float) -> dict:
        p, u = setup.workers, setup.updates
        busy = p * wall
        frames = np.concatenate(self.rollout_frames)
        out = {"update_s": wall / u, "frames_per_s": self.frames / wall,
               "wait_share": float(self.wait.sum() / busy), "comm_share": float(self.comm.sum() / busy),
               "collect_s": float(self.collect.mean() / u), "compute_s": float(self.compute.mean() / u),
               "comm_s": float(self.comm.mean() / u), "wait_s": float(self.wait.mean() / u),
               "late_share": self.late / (p * u),
               "rollout_share": float(frames.mean() / setup.frames_per_update)}
        if setup.collection == "ver":
            out["cut_share"] = self.cut / (p * u)
        if self.staleness:
            total = sum(self.staleness.values())
            out["staleness"] = {str(k): v / total for k, v in sorted(self.staleness.items())}
        if self.preempted:
            out["rollout_steps_mean"] = float(frames.mean() / setup.num_envs)
            out["preempted_share"] = float(np.concatenate(self.preempted).mean())
        return out


def _preempted(roll: Rollout, threshold: int, min_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Where DD-PPO's preemption stops each worker: the counter fills when ``threshold``
    workers have ended their rollouts; a worker still collecting then stops at the first vector
    step that ends from then on, not before ``min_steps``. Returns ``(stop, frames)``."""
    t_thr = np.partition(roll.end, threshold - 1)[threshold - 1]
    times, frames = roll.steps()
    p, n = times.shape
    first = (times < t_thr * (1 - 1e-12)).sum(axis=1) + 1
    k = np.minimum(n, np.maximum(min_steps, first)) - 1
    at = times[np.arange(p), k]
    # workers that ended by then (or end before that step) keep their whole rollout
    return np.minimum(at, roll.end), np.where(at < roll.end, frames[np.arange(p), k], roll.frames)


def _synchronous(setup: Setup, draw: Draw, *, preempt: bool) -> dict:
    p, n, net = setup.workers, setup.num_steps, setup.network
    tot = _Totals(p)
    grad = setup.grad_rounds * net.allreduce(p, setup.nbytes)
    barrier = net.barrier(p)
    threshold = max(1, math.ceil(setup.sync_frac * p - 1e-9))
    min_steps = math.ceil(setup.short_frac * n - 1e-9)
    collector = setup.collector(draw)
    wall = 0.0
    for u in range(setup.updates):
        roll = collector.next(u)
        stop, frames = roll.end, roll.frames
        if preempt and threshold < p:
            stop, frames = _preempted(roll, threshold, min_steps)
        if preempt:
            tot.preempted.append(frames < roll.frames)
        end = stop.max() + barrier
        compute = draw.ppo[u] * frames / setup.frames_per_update
        slowest = compute.max()
        tot.rollout(roll, stop, frames, compute)
        tot.comm += grad
        tot.wait += (end - stop) + (slowest - compute)
        # the end-of-rollout wait is the rollout's; the update VER's cut-off rule sees is the rest
        collector.finish(stop, frames, gap=end - stop + slowest + grad,
                         learn=np.full(p, slowest + grad))
        wall += end + slowest + grad
    return tot.result(setup, wall)


class _Groups:
    """WAGMA's groups per iteration from the native rule, as sorted index arrays (cached)."""

    def __init__(self, p: int, s: int):
        from native_coll import group_of  # the engine's own rule

        self.p, self.s, self._group_of = p, min(s, p), group_of
        pow2 = p & (p - 1) == 0 and self.s & (self.s - 1) == 0
        phases = max(1, math.ceil(math.log2(p) / math.log2(self.s))) if self.s > 1 else 1
        self._period = phases if pow2 else None  # butterfly groups repeat; random ones do not
        self._cache: dict[int, tuple] = {}

    def costs(self, t: int, net, nbytes: float) -> np.ndarray:
        """Each group's collective time at iteration ``t`` on ``net``'s nodes (cached like
        :meth:`at`)."""
        key = ("cost", t % self._period if self._period else t, net, nbytes)
        hit = self._cache.get(key)
        if hit is None:
            order, starts, sizes, _ = self.at(t)
            hit = np.array([net.members(order[a:a + n].tolist(), nbytes)
                            for a, n in zip(starts.tolist(), sizes.tolist())])
            if self._period:
                self._cache[key] = hit
        return hit

    def at(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(order, starts, sizes, gid): ranks sorted by group, group start offsets in ``order``,
        group sizes, and each rank's group index."""
        key = t % self._period if self._period else t
        hit = self._cache.get(key)
        if hit is None:
            gid = np.full(self.p, -1)
            members = []
            for r in range(self.p):
                if gid[r] < 0:
                    m = self._group_of(self.p, self.s, t, r)
                    gid[list(m)] = len(members)
                    members.append(m)
            order = np.fromiter((r for m in members for r in m), dtype=np.int64, count=self.p)
            sizes = np.array([len(m) for m in members])
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            hit = (order, starts, sizes, gid)
            if self._period:
                self._cache[key] = hit
        return hit


def _global(setup: Setup, arrive: np.ndarray, cost: float, tot: _Totals) -> np.ndarray:
    end = arrive.max() + setup.network.barrier(setup.workers)
    tot.wait += end - arrive
    tot.comm += cost
    return np.full(setup.workers, end + cost)


class _Rollouts:
    """The model-averaging modes' side of the within-rank model: each update's rollouts, and when
    every worker starts its next one (which VER's carried steps and cut-off rule need)."""

    def __init__(self, setup: Setup, draw: Draw):
        self.setup, self.draw = setup, draw
        self.collector = setup.collector(draw)
        self.ret = np.zeros(setup.workers)

    def next(self, t: int) -> tuple[Rollout, np.ndarray]:
        """Update ``t``'s rollouts and PPO compute (in proportion to the frames collected)."""
        roll = self.collector.next(t)
        return roll, self.draw.ppo[t] * roll.frames / self.setup.frames_per_update

    def returned(self, roll: Rollout, ret: np.ndarray) -> None:
        """Every worker returns from update ``t`` at ``ret`` and starts collecting again."""
        gap = ret - (self.ret + roll.end)  # the update after the rollout: PPO, averaging, waiting
        self.collector.finish(roll.end, roll.frames, gap=gap, learn=gap)
        self.ret = ret


def _wagma(setup: Setup, draw: Draw, *, overlap: bool = False) -> dict:
    p, net = setup.workers, setup.network
    outstanding = None  # overlap: when the last global average completes
    tot = _Totals(p)
    groups = _Groups(p, setup.group_size)
    glob_cost = net.members(range(p), setup.nbytes)
    ret = np.zeros(p)
    since_global: list[np.ndarray] = []  # return times of the calls since the last global one
    rollouts = _Rollouts(setup, draw)
    for t in range(setup.updates):
        roll, compute = rollouts.next(t)
        arrive = ret + roll.end + compute
        tot.rollout(roll, roll.end, roll.frames, compute)
        if (t + 1) % setup.sync_period == 0 and overlap:
            if outstanding is not None:  # the bound: the previous global must be complete
                held = np.maximum(arrive, outstanding)
                tot.wait += held - arrive
                arrive = held
            tot.staleness[0] = tot.staleness.get(0, 0) + p
            done = arrive.max() + glob_cost  # in the background, once the last worker arrived
            if (t + 1) // setup.sync_period % setup.overlap_sync_every == 0:
                # settle (wait for this global) and the blocking identical average
                tot.wait += done - arrive
                ret = _global(setup, np.full(p, done), glob_cost, tot)
                since_global, outstanding = [], None
            else:
                ret, outstanding = arrive, done
                since_global.append(ret)
        elif (t + 1) % setup.sync_period == 0:
            ret = _global(setup, arrive, glob_cost, tot)
            since_global = []
            tot.staleness[0] = tot.staleness.get(0, 0) + p
        else:
            ret = _group_average(setup, groups, t, arrive, since_global, tot)
            since_global.append(ret)
        rollouts.returned(roll, ret)
    return tot.result(setup, float(ret.max()))


def _group_average(setup: Setup, groups: _Groups, t: int, arrive: np.ndarray,
                   since_global: list[np.ndarray], tot: _Totals) -> np.ndarray:
    """Iteration ``t``'s wait-avoiding group averages; returns every worker's return time."""
    net = setup.network
    order, starts, sizes, gid = groups.at(t)
    act = np.minimum.reduceat(arrive[order], starts)[gid]  # the first member's arrival
    late = arrive > act + net.alpha
    start = np.minimum(arrive, act + net.alpha)  # the late take part through their progress thread
    if net.ppn == 1:
        uniq, which = np.unique(sizes, return_inverse=True)  # S to 2S-1 members per group
        cost_g = np.array([net.group(int(s), setup.nbytes) for s in uniq])[which]
    else:  # the cost depends on how the members spread over the nodes
        cost_g = groups.costs(t, net, setup.nbytes)
    done = (np.maximum.reduceat(start[order], starts) + cost_g)[gid]
    new_ret = np.maximum(arrive, done)
    blocked = new_ret - arrive
    comm = np.minimum(blocked, cost_g[gid])
    tot.comm += comm
    tot.wait += blocked - comm
    # how far behind each late member's published model is (the engine's staleness)
    behind = late.astype(np.int64)
    # A worker's returns increase with k: walk back until no late member is still inside
    # an earlier call at activation.
    for r_k in reversed(since_global):
        inside = late & (r_k > act)
        if not inside.any():
            break
        behind += inside
    stale_of_group = np.maximum.reduceat(behind[order], starts)[gid]
    vals, counts = np.unique(stale_of_group, return_counts=True)
    for v, c in zip(vals.tolist(), counts.tolist()):
        tot.staleness[v] = tot.staleness.get(v, 0) + c
    tot.late += int(late.sum())
    return new_ret


def _periodic(setup: Setup, draw: Draw, *, gossip: bool) -> dict:
    p, net = setup.workers, setup.network
    tot = _Totals(p)
    glob_cost = net.allreduce(p, setup.nbytes)
    data = net.gossip(p, setup.nbytes) - net.alpha  # the exchange after the handshake
    ret = np.zeros(p)
    rollouts = _Rollouts(setup, draw)
    for t in range(setup.updates):
        roll, compute = rollouts.next(t)
        arrive = ret + roll.end + compute
        tot.rollout(roll, roll.end, roll.frames, compute)
        if (t + 1) % setup.sync_period == 0:
            ret = _global(setup, arrive, glob_cost, tot)
        elif gossip and p > 1:
            shake = np.maximum(arrive, np.maximum(np.roll(arrive, 1), np.roll(arrive, -1))) + net.alpha
            # a worker's receives complete once both neighbours have finished their handshakes
            done = np.maximum(shake, np.maximum(np.roll(shake, 1), np.roll(shake, -1))) + data
            tot.comm += data + net.alpha
            tot.wait += done - arrive - data - net.alpha
            ret = done
        else:
            ret = arrive
        rollouts.returned(roll, ret)
    return tot.result(setup, float(ret.max()))


def simulate(mode: str, setup: Setup, collect: np.ndarray | Draw,
             ppo: np.ndarray | None = None) -> dict:
    """Simulate ``mode`` with the ``[updates, workers]`` compute times; returns its figures:
    ``update_s`` (wall per update), ``frames_per_s``, ``wait_share`` and ``comm_share`` (of all
    workers' time), per-worker means per update of ``collect_s`` / ``compute_s`` / ``comm_s`` /
    ``wait_s``, ``late_share`` and the ``staleness`` distribution (wagma), the mean rollout length
    and preempted share (preempt). The times come as a :class:`Draw` or as two arrays (then
    evenly spread within each rollout)."""
    draw = collect if isinstance(collect, Draw) else Draw(np.asarray(collect), np.asarray(ppo))
    if mode in ("allreduce", "preempt"):
        return _synchronous(setup, draw, preempt=(mode == "preempt"))
    if mode in ("wagma", "wagma_overlap"):
        return _wagma(setup, draw, overlap=(mode == "wagma_overlap"))
    if mode in ("dpsgd", "local_sgd"):
        return _periodic(setup, draw, gossip=(mode == "dpsgd"))
    raise ValueError(f"unknown mode {mode!r}; choose from {list(MODES)}")
