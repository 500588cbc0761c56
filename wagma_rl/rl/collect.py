"""Rollout collection: how a worker turns its environments' steps into a rollout.

Three collectors with one interface, made by :func:`make_collector` for the run's
:class:`Collection` (``rollout.mode`` and ``env.device``, decided once per run by
:func:`wagma_rl.rl.setup.decide_collection`):

* :class:`LockstepCollector` (DD-PPO): every env steps together; the worker waits for its slowest
  env at each step; the strategy may end the rollout early (preemption).
* :class:`VERCollector` (variable experience rollouts, Wijmans et al. 2022): each env steps on its
  own in a worker process; inference is batched over the envs that are ready; an env contributes
  as many steps as it produced before the rank's cut-off; the envs keep stepping while the rank
  learns (the step in flight at the cut-off opens the next rollout).

* :class:`DeviceCollector` (batch simulation): lock-step over the device simulator
  (``env.device``), whose observations, rewards and dones are tensors on the rank's device; they
  go into the rollout storage without a host copy and episode statistics are read once per update.

All call the strategy's ``collect_more`` once per ``num_envs`` frames, so DD-PPO's preemption,
the allreduce modes' end-of-rollout barrier and WAGMA work with either. Both time their envs'
steps into an :class:`EnvStepTimes` when given one (the per-worker view's env step times and
stalls): lock-step collection each vector step (its envs step together), VER each env's step from
its action sent to its result read.
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import torch

from wagma_rl.distrib import Strategy

from .graphed import GraphedAct
from .metrics import EnvStepTimes, EpisodeWindow
from .policy import PointNavPolicy
from .setup import Collection, obs_to_torch
from .storage import RolloutStorage

__all__ = ["Collected", "LockstepCollector", "VERCollector", "DeviceCollector", "CutoffRule",
           "make_collector", "collect_rollout"]


@dataclasses.dataclass(frozen=True)
class Collected:
    """What one rollout collection produced."""

    frames: int
    """Steps this worker collected (over all its envs)."""
    agreed_frames: int
    """The frame count every worker adds for this rollout without communicating (exact for
    lock-step rollouts without preemption; the nominal ``num_steps * num_envs`` for VER), so
    all agree on when the budget is spent between synchronised points."""
    env_steps: np.ndarray
    """Steps each env contributed."""
    cut_short: bool = False
    """VER: the cut-off rule ended this rollout before ``num_steps * num_envs`` steps."""


def collect_rollout(policy: PointNavPolicy, envs, storage: RolloutStorage, strategy: Strategy,
                    episodes: EpisodeWindow, device: torch.device, *,
                    env_times: EnvStepTimes | None = None) -> None:
    """Step the environments into ``storage`` until the strategy ends the rollout (at
    ``num_steps``, or earlier: DD-PPO's preemption), then store the bootstrap value.
    ``env_times``: where each vector step's time goes (every env's step took that long)."""
    policy.eval()
    num_steps = storage.num_steps
    for step in range(num_steps):
        cur = storage.current()
        actions, log_probs, values, hidden = policy.act(
            cur["depth"], cur["goal"], cur["prev_actions"], cur["masks"], cur["h"])
        chosen = actions.cpu().numpy()
        sent = time.perf_counter()
        obs, rewards, terminated, truncated, infos = envs.step(chosen)
        took = time.perf_counter() - sent
        dones = np.logical_or(terminated, truncated)
        if env_times is not None:  # an env's reset inside the step held every env
            env_times.observe(took, ended=dones.any())
        episodes.step(np.asarray(rewards, dtype=np.float64), dones, infos)
        depth, goal = obs_to_torch(obs, device)
        storage.insert(actions=actions, log_probs=log_probs, values=values,
                       rewards=torch.as_tensor(np.asarray(rewards, dtype=np.float32), device=device),
                       next_depth=depth, next_goal=goal, next_hidden=hidden,
                       next_masks=torch.as_tensor(~dones, dtype=torch.float32, device=device))
        if not strategy.collect_more(step + 1, num_steps):
            break
    cur = storage.current()
    storage.values[storage.step] = policy.act(
        cur["depth"], cur["goal"], cur["prev_actions"], cur["masks"], cur["h"])[2]


class LockstepCollector:
    """DD-PPO's collection: :func:`collect_rollout` over a vector env's lock-step ``step``
    (``env_times``: see :func:`collect_rollout`)."""

    def __init__(self, envs, *, num_steps: int, env_times: EnvStepTimes | None = None):
        self.envs, self.num_steps, self.env_times = envs, num_steps, env_times

    def storage_steps(self) -> int:
        """Slots per env the rollout storage needs."""
        return self.num_steps

    def collect(self, policy: PointNavPolicy, storage: RolloutStorage, strategy: Strategy,
                episodes: EpisodeWindow, device: torch.device) -> Collected:
        collect_rollout(policy, self.envs, storage, strategy, episodes, device,
                        env_times=self.env_times)
        frames = storage.frames
        return Collected(frames=frames, agreed_frames=frames, env_steps=storage.lengths.numpy().copy())

    def observe_update(self, seconds: float) -> None:
        """Lock-step collection does not adapt to the update time."""


class DeviceCollector:
    """Lock-step collection from a device batch simulator (:func:`on_device` envs): one policy
    forward per step for all envs, the simulator's tensors stored as they are, and each ended
    episode's (return, success, spl, distance) kept in a device buffer that is read once, after
    the rollout, into the :class:`EpisodeWindow`. Nothing is read back per step; per-env step
    times do not exist in a batch simulator, so ``env_times`` stays empty."""

    def __init__(self, envs, *, num_steps: int, cuda_graph: bool = False):
        self.envs, self.num_steps = envs, int(num_steps)
        self.returns: torch.Tensor | None = None
        self.cuda_graph = bool(cuda_graph)
        self.graphed: GraphedAct | None = None
        """``cuda_graph``: the policy's step replayed from a CUDA graph (:mod:`.graphed`)."""

    def _act(self, policy: PointNavPolicy, device: torch.device):
        """``policy.act``, or its CUDA-graph replay (``cuda_graph`` on a GPU)."""
        if not (self.cuda_graph and device.type == "cuda"):
            return policy.act
        if self.graphed is None or self.graphed.policy is not policy:
            self.graphed = GraphedAct(policy)
        return self.graphed

    def storage_steps(self) -> int:
        """Slots per env the rollout storage needs."""
        return self.num_steps

    def collect(self, policy: PointNavPolicy, storage: RolloutStorage, strategy: Strategy,
                episodes: EpisodeWindow, device: torch.device) -> Collected:
        policy.eval()
        n = storage.num_envs
        if self.returns is None:
            self.returns = torch.zeros(n, dtype=torch.float64, device=device)
        # Per step and env: ended?, then the ended episode's return, success, spl, distance.
        record = torch.zeros(self.num_steps, n, 5, dtype=torch.float64, device=device)
        steps = 0
        act = self._act(policy, device)
        for step in range(self.num_steps):
            cur = storage.current()
            actions, log_probs, values, hidden = act(
                cur["depth"], cur["goal"], cur["prev_actions"], cur["masks"], cur["h"])
            obs, rewards, terminated, truncated, infos = self.envs.step(actions)
            dones = terminated | truncated
            self.returns += rewards.to(device)
            row = record[step]
            row[:, 0] = dones
            row[:, 1] = self.returns
            row[:, 2] = infos["success"]
            row[:, 3] = infos["spl"]
            row[:, 4] = infos["distance_to_goal"]
            self.returns.masked_fill_(dones.to(device), 0.0)
            storage.insert(actions=actions, log_probs=log_probs, values=values,
                           rewards=rewards.to(device),
                           next_depth=obs["depth"].to(device),
                           next_goal=obs["pointgoal_with_gps_compass"].to(device),
                           next_hidden=hidden, next_masks=(~dones).to(device, torch.float32))
            steps = step + 1
            if not strategy.collect_more(steps, self.num_steps):
                break
        cur = storage.current()
        storage.values[storage.step] = act(
            cur["depth"], cur["goal"], cur["prev_actions"], cur["masks"], cur["h"])[2]
        host = record[:steps].cpu().numpy()  # the one read of the rollout
        ended = host[..., 0] > 0
        episodes.add_finished(host[..., 1:][ended])
        frames = storage.frames
        return Collected(frames=frames, agreed_frames=frames,
                         env_steps=storage.lengths.numpy().copy())

    def observe_update(self, seconds: float) -> None:
        """Lock-step collection does not adapt to the update time."""


class CutoffRule:
    """When a VER rollout should end early: the steps-per-second rule.

    A rollout of S steps collected in t seconds and learned in L seconds yields S / (t + L) steps
    per second. Collecting on at the rate R of the envs that still have room raises that figure
    exactly while R * (t + L) > S, so the rule ends the rollout once R * (t + L) < S (never below
    ``min_frames``, nor before an update time has been measured). R comes from each env's measured
    step times (exponential means, so a stalled env's rate falls while it stalls), L from the
    measured update times (communication and waiting included).
    """

    def __init__(self, num_envs: int, *, min_frames: int, smoothing: float = 0.2):
        self.step_s = np.full(num_envs, np.nan)
        self.update_s: float | None = None
        self.min_frames, self.smoothing = int(min_frames), float(smoothing)

    def observe_steps(self, env_ids: np.ndarray, seconds: np.ndarray) -> None:
        """Account the round-trip times (action sent to result read) of the envs ``env_ids``."""
        old = self.step_s[env_ids]
        self.step_s[env_ids] = np.where(np.isnan(old), seconds,
                                        (1 - self.smoothing) * old + self.smoothing * seconds)

    def observe_update(self, seconds: float) -> None:
        """Account one update's time (PPO, averaging, waiting)."""
        self.update_s = seconds if self.update_s is None else \
            (1 - self.smoothing) * self.update_s + self.smoothing * seconds

    def rate(self, has_room: np.ndarray, *, now_waiting: np.ndarray | None = None) -> float:
        """Steps per second the envs with room produce. ``now_waiting``: seconds each env's step
        has been in flight; a step running longer than the env's mean is taken at its own time
        (a stall lowers the rate as it happens, not only after it ends)."""
        tau = self.step_s.copy()
        known = ~np.isnan(tau)
        if not known.any():
            return math.inf
        tau[~known] = np.nanmean(tau)
        if now_waiting is not None:
            tau = np.maximum(tau, now_waiting)
        return float(np.sum(1.0 / np.maximum(tau[has_room], 1e-9)))

    def should_stop(self, *, frames: int, elapsed_s: float, has_room: np.ndarray,
                    now_waiting: np.ndarray | None = None) -> bool:
        """Whether collecting on would lower steps per second of collect + learn."""
        if frames < self.min_frames or self.update_s is None:
            return False
        return self.rate(has_room, now_waiting=now_waiting) * (elapsed_s + self.update_s) < frames


class VERCollector:
    """Variable experience rollouts over an env pool with ``step_async``/``step_wait_any``
    (:class:`envs.ProcessVectorEnv`).

    A rollout ends once the envs produced ``num_steps * num_envs`` steps (each env at most
    ``max_env_steps`` of them), when the strategy ends it (preemption), or at the
    :class:`CutoffRule` (``cutoff="auto"``; ``clock``: its time source, seconds). Ready envs
    are batched for inference: they wait until ``min_batch`` of them are ready, at most half a
    typical env step, and never while no other env is stepping. Every env is then given its next action, which is
    also the bootstrap value of its segment; it simulates that step while the rank learns, and
    the step opens the env's segment of the next rollout (its action, log-probability and value
    are the previous policy's: PPO's ratio accounts for it as for any behaviour policy).

    ``env_times``: where each env's step times go, from its action sent to its result read. A
    step sent before the rank learned is not timed, there nor in the cut-off rule: it was read only
    after the update.
    """

    def __init__(self, envs, *, num_steps: int, max_env_steps: float = 2.0,
                 cutoff: str = "auto", min_frac: float = 0.25, min_batch: int = 0,
                 env_times: EnvStepTimes | None = None, clock=time.perf_counter):
        if max_env_steps < 1.0:
            raise ValueError(f"rollout.max_env_steps must be >= 1 (an env may hold at least "
                             f"ppo.num_steps steps), got {max_env_steps}")
        if cutoff not in ("auto", "full"):
            raise ValueError(f"rollout.cutoff must be 'auto' or 'full', got {cutoff!r}")
        for call in ("step_async", "step_wait_any"):
            if not hasattr(envs, call):
                raise ValueError(f"rollout.mode=ver needs an env pool with {call}() "
                                 "(env.workers=process)")
        self.envs, self.num_steps, self.clock = envs, int(num_steps), clock
        self.num_envs = int(envs.num_envs)
        self.capacity = int(math.ceil(max_env_steps * num_steps))
        self.target = self.num_steps * self.num_envs
        self.rule = CutoffRule(self.num_envs, min_frames=int(math.ceil(min_frac * self.target))) \
            if cutoff == "auto" else None
        if min_batch < 0:
            raise ValueError(f"rollout.min_batch must be >= 0 (0: half the envs), got {min_batch}")
        self.min_batch = min(self.num_envs, int(min_batch) or max(1, math.ceil(self.num_envs / 2)))
        self.step_s = CutoffRule(self.num_envs, min_frames=0)  # step times, for the batch wait
        self.sent_at = np.zeros(self.num_envs)
        self.ready_at = np.zeros(self.num_envs)
        self.rank_step = getattr(envs, "rank_step", None)  # the rank's emulated stalls
        self.env_times = env_times
        self.cut_short = 0
        """Rollouts the cut-off rule ended before ``num_steps * num_envs`` steps."""

    def storage_steps(self) -> int:
        """Slots per env the rollout storage needs."""
        return self.capacity

    def observe_update(self, seconds: float) -> None:
        """Tell the cut-off rule how long the update after a rollout took."""
        if self.rule is not None:
            self.rule.observe_update(seconds)

    def collect(self, policy: PointNavPolicy, storage: RolloutStorage, strategy: Strategy,
                episodes: EpisodeWindow, device: torch.device) -> Collected:
        if storage.num_steps != self.capacity:
            raise ValueError(f"VER needs a storage of {self.capacity} steps per env, got "
                             f"{storage.num_steps}")
        policy.eval()
        envs, n = self.envs, self.num_envs
        idle = ~np.asarray(envs.in_flight, dtype=bool)
        # Steps sent before the update: their round trips hold the update's time. They are not
        # timed (neither the per-worker view nor the cut-off rule's and the batch wait's step
        # times would be right), and while they stay in flight they count as waiting only since
        # this rollout began (a step the update outlasted is not a stalled one).
        untimed = ~idle
        self._dispatch(policy, storage, idle & self._room(storage), idle, device)
        start = self.clock()
        self.sent_at[untimed] = start
        frames = reported = 0
        ended_by_strategy = cut_short = False
        while True:
            waiting = idle & self._room(storage)  # ready, not yet sent their next action
            if not envs.in_flight.any():
                if not waiting.any():
                    break  # every env is full
                self._dispatch(policy, storage, waiting, idle, device)
                continue
            within = None
            if waiting.any():  # wake up in time to send the waiting envs' actions
                within = max(0.0, self._batch_wait() - (self.clock() - self.ready_at[waiting].min()))
            ids, obs, rewards, terminated, truncated, infos = envs.step_wait_any(within=within)
            now = self.clock()
            if len(ids):
                dones = np.logical_or(terminated, truncated)
                timed = ~untimed[ids]
                took = now - self.sent_at[ids[timed]]
                self.step_s.observe_steps(ids[timed], took)
                if self.rule is not None:
                    self.rule.observe_steps(ids[timed], took)
                if self.env_times is not None:
                    self.env_times.observe(took, ids[timed], ended=dones[timed])
                untimed[ids] = False
                episodes.step(np.asarray(rewards, dtype=np.float64), dones, infos, env_ids=ids)
                depth, goal = obs_to_torch(obs, device)
                storage.complete(
                    rewards=torch.as_tensor(np.asarray(rewards, np.float32), device=device),
                    next_depth=depth, next_goal=goal,
                    next_masks=torch.as_tensor(~dones, dtype=torch.float32, device=device),
                    env_ids=ids)
                idle[ids] = True
                self.ready_at[ids] = now
                frames += len(ids)
            # Keep the ready envs busy: their steps belong to this rollout or, after the cut, open
            # the next one. Batched: a forward pass per ready env would cost more than waiting.
            waiting = idle & self._room(storage)
            if waiting.sum() >= self.min_batch or (waiting.any() and (
                    not envs.in_flight.any()
                    or now - self.ready_at[waiting].min() >= self._batch_wait())):
                self._dispatch(policy, storage, waiting, idle, device)
            while reported < frames // n and not ended_by_strategy:
                reported += 1  # one "vector step" for the strategy and the rank's stall schedule
                if self.rank_step is not None:
                    self.rank_step(0.0)
                ended_by_strategy = not strategy.collect_more(reported, self.num_steps)
            if ended_by_strategy:
                break
            if self.rule is not None and self.rule.should_stop(
                    frames=frames, elapsed_s=self.clock() - start,
                    has_room=self._room(storage),
                    now_waiting=np.where(envs.in_flight, self.clock() - self.sent_at, 0.0)):
                self.cut_short += 1
                cut_short = True
                break
        if not ended_by_strategy:
            strategy.end_rollout(frames // n, self.num_steps)
        # Every idle env's next step (and its bootstrap value) goes on while the rank learns.
        self._dispatch(policy, storage, idle.copy(), idle, device)
        return Collected(frames=frames, agreed_frames=self.target,
                         env_steps=storage.lengths.numpy().copy(), cut_short=cut_short)

    def _batch_wait(self) -> float:
        """How long a ready env may wait for others: half the envs' median step time (0 before
        any was measured)."""
        known = self.step_s.step_s[~np.isnan(self.step_s.step_s)]
        return 0.5 * float(np.median(known)) if known.size else 0.0

    @staticmethod
    def _room(storage: RolloutStorage) -> np.ndarray:
        return (storage.lengths < storage.num_steps).numpy()

    def _dispatch(self, policy: PointNavPolicy, storage: RolloutStorage, which: np.ndarray,
                  idle: np.ndarray, device: torch.device) -> None:
        """Batched inference for the envs ``which`` (a mask), their actions recorded as pending
        steps and sent to the pool."""
        ids = np.flatnonzero(which)
        if ids.size == 0:
            return
        cur = storage.current(ids)
        with torch.no_grad():
            actions, log_probs, values, hidden = policy.act(
                cur["depth"], cur["goal"], cur["prev_actions"], cur["masks"], cur["h"])
        storage.act(actions=actions, log_probs=log_probs, values=values, next_hidden=hidden,
                    env_ids=ids)
        self.envs.step_async(actions.cpu().numpy(), ids)
        self.sent_at[ids] = self.clock()
        idle[ids] = False


def make_collector(collection: Collection, envs, *, num_steps: int, max_env_steps: float = 2.0,
                   cutoff: str = "auto", min_frac: float = 0.25, min_batch: int = 0,
                   env_times: EnvStepTimes | None = None):
    """The collector of ``collection`` (:func:`wagma_rl.rl.setup.decide_collection`): lock-step,
    lock-step over a device batch simulator (:class:`DeviceCollector`) or VER (``env_times``:
    where it times its envs' steps)."""
    if collection.simulator is not None:
        return DeviceCollector(envs, num_steps=num_steps, cuda_graph=collection.graphed)
    if collection.ver:
        return VERCollector(envs, num_steps=num_steps, max_env_steps=max_env_steps, cutoff=cutoff,
                            min_frac=min_frac, min_batch=min_batch, env_times=env_times)
    return LockstepCollector(envs, num_steps=num_steps, env_times=env_times)
