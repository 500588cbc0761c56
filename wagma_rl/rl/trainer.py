"""The DD-PPO training loop. Read :func:`_train` top to bottom: set up, then per update collect a
rollout, run PPO, let the distributed strategy average, and at points where all workers are in
step reduce statistics, log and checkpoint (:func:`sync_point`, :func:`stats_point`).

The strategy (``wagma_rl.distrib``) is called at two points only: ``collect_more`` after every
environment step (DD-PPO's preemption ends a rollout there) and ``after_update`` (WAGMA averages
models there). Everything else is the same for every mode. The run's counters live in one
:class:`RunState`; what the synchronised points work with, in one :class:`Run`. Around the loop,
the run folder, lock, bounded waits, log, agreed checkpoints, signals and exit policy are the
:class:`wagma_rl.job.Job` the supervised jobs use too, and the synchronised points' statistics
gather, stop, checkpoint cadence and the state kept for the survivors of a loss are their
:class:`wagma_rl.job.sync.SyncPoint`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any

import torch
from mpi4py import MPI

from native_coll import faults
from wagma_rl.config import ConfigError, config_notes, config_to_dict, save_config
from wagma_rl.distrib import Strategy
from wagma_rl.heterogeneity import Heterogeneity, HeterogeneousVectorEnv, SlowWorker
from wagma_rl.job import Job
from wagma_rl.job.lifecycle import Picked
from wagma_rl.job.precision import apply_run_settings, autocast
from wagma_rl.job.signals import StopSignals
from wagma_rl.job.sync import OWN_MODELS, SyncPoint
from wagma_rl.job.tblog import RunLogger

from .collect import collect_rollout, make_collector
from .config import DDPPOConfig
from .metrics import (EpisodeWindow, LaggedStats, UpdateMeter, combine_stats, env_summary,
                      measure_names, measure_scalars, stats_layout, stats_row)
from .policy import PointNavPolicy, count_parameters
from .ppo import ppo_update
from .resume import choose_checkpoint
from .in_place import continue_in_place, cpu_copy, own_state, rescue
from .learner import Start, build_learner
from .setup import (Collection, check_config, decide_collection, make_envs, obs_to_torch,
                    rng_state)
from .storage import RolloutStorage
from .trace import TraceWriter

__all__ = ["train", "TrainResult", "RunState", "Run", "collect_rollout", "sync_point",
           "stats_point", "save_checkpoint", "log_stats"]


@dataclasses.dataclass
class TrainResult:
    """What one worker's :func:`train` call did."""

    run_dir: Path
    updates: int
    frames: int
    checkpoint: Path | None
    stopped_by_signal: bool
    rollout_steps: list[int]
    """This worker's rollout length at every update of this call (per env; VER: the mean)."""
    rollout_frames: list[int]
    """This worker's frames (steps over all its envs) at every update of this call."""
    env_steps: list[list[int]]
    """The steps each of this worker's envs contributed at every update of this call."""
    last_stats: dict[str, float]
    """The last statistics reduced over all workers."""
    policy: PointNavPolicy
    """The trained policy (identical on every rank: training ends at a global synchronisation)."""


@dataclasses.dataclass
class RunState:
    """The run's counters. ``frames`` changes in :meth:`count_frames` only."""

    update: int
    """Updates done, those of the runs this one resumes included."""
    frames: int
    """Frames all workers collected: exact at a synchronised point; in between every worker adds
    the same estimate (exact when rollouts are full), so all agree on when the budget is spent."""
    wall_before: float
    """Wall-clock seconds of the runs this one resumes."""
    t_start: float
    """``time.perf_counter()`` when this call's loop started."""
    synced_frames: int = 0
    """Frames counted by the statistics reduced so far (synchronised and stats points)."""
    logged_frames: int = 0
    logged_time: float = 0.0
    """``synced_frames`` and the time at the last TensorBoard scalars (their fps starts there)."""
    log_update: int = 0
    """Update of the last progress line."""
    checkpoint: Path | None = None
    """The last checkpoint written (or resumed from)."""
    stats: dict[str, float] = dataclasses.field(default_factory=dict)
    """The last statistics reduced at a synchronised point."""
    rollout_steps: list[int] = dataclasses.field(default_factory=list)
    """This worker's rollout length at every update of this call (per env; VER: the mean)."""
    rollout_frames: list[int] = dataclasses.field(default_factory=list)
    """This worker's frames at every update of this call."""
    env_steps: list[list[int]] = dataclasses.field(default_factory=list)
    """The steps each of this worker's envs contributed at every update of this call."""
    recovery: tuple[float | None, str] = (None, "")
    """When the loss this launch (or this process, in place) goes on after was met, and what it
    was; the first update's line reports the recovery time (None: nothing to report)."""
    uncounted: int = 0
    """This rank's frames of its completed updates that no reduction has counted yet."""
    lagging: int = 0
    """Of those, the frames the lagged reduction in flight counts (:func:`stats_point`)."""
    counts: int = 0
    """Reductions that counted frames in this call (the same on every rank)."""
    last_count: tuple[int, int] = (0, 0)
    """``synced_frames`` before the last of them and this rank's frames in it: a survivor whose
    last count failed (a rank died inside it) is one count behind the others, and all go back to
    its count."""

    def __post_init__(self) -> None:
        self.synced_frames = self.logged_frames = self.frames
        self.logged_time = self.t_start
        self.log_update = self.update

    def count_frames(self, *, estimate: int = 0, counted: float = 0.0, synced: bool = False,
                     own: int | None = None) -> None:
        """Add ``counted`` frames that reduced statistics report to ``synced_frames`` (``own``:
        this rank's frames among them, given with every reduction that counts frames); at a
        synchronised point set ``frames`` to that exact count, else advance it by ``estimate``."""
        if own is not None:
            self.last_count = (self.synced_frames, own)
            self.counts += 1
            self.uncounted -= own
        self.synced_frames = int(self.synced_frames + counted)
        self.frames = self.synced_frames if synced else self.frames + estimate

    def wall_s(self, at: float) -> float:
        """Training wall-clock seconds at ``time.perf_counter()`` value ``at``, resumes included."""
        return self.wall_before + at - self.t_start


@dataclasses.dataclass
class Run:
    """What the synchronised points read and write besides the counters (built once; after a loss
    in place, :func:`continue_in_place` replaces the learner and the log)."""

    cfg: DDPPOConfig
    job: Job
    sync: SyncPoint
    """The synchronised points' statistics gather, checkpoint cadence and the state kept in memory
    for the survivors of a loss (:attr:`SyncPoint.snapshot`: the checkpoint contents of the last
    synchronised update; :attr:`SyncPoint.kept`: this rank's own model and optimizer after its
    last completed update)."""
    log: RunLogger
    strategy: Strategy
    optimizer: Any
    policy: PointNavPolicy
    meter: UpdateMeter
    episodes: EpisodeWindow
    lagged: LaggedStats
    collection: Collection


# ------------------------------------------------------------------------------------ the loop
def train(cfg: DDPPOConfig, *, comm: MPI.Comm | None = None, resume: str | Path | None = None,
          signals: StopSignals | None = None) -> TrainResult:
    """Train a PointNav agent with DD-PPO on every rank of ``comm``; collective.

    ``resume``: a checkpoint file or run folder to continue from (see
    :func:`wagma_rl.rl.resume.choose_checkpoint`). ``signals``: stop flags (default: SIGTERM,
    SIGINT and SIGUSR1 handlers). Every wait for other ranks is bounded by ``averaging.timeout``. A
    failure a user can cause is written to ``log.txt`` as ``stopped: <why>`` before it propagates.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    check_config(cfg, comm.Get_size())
    with Job(comm, run=cfg.run, timeout=cfg.averaging.timeout, signals=signals) as job:
        return _train(cfg, job, resume)


def _train(cfg: DDPPOConfig, job: Job, resume) -> TrainResult:
    ckpt_path, ckpt = job.start(lambda: _pick_checkpoint(cfg, resume))
    apply_run_settings(cfg.run.precision, cudnn_benchmark=cfg.run.cudnn_benchmark)
    # --- environments first: a bad scene set or backend is a config error, reported before any
    # collective (every rank raises the same one, so none is left waiting)
    collection = decide_collection(cfg, job.device)
    envs, obs, first_infos, env_note = _start_envs(cfg, job, collection, ckpt)
    log = job.open_log()
    if env_note:
        log.info(env_note)
    # --- model, optimizer, strategy (the wrapper broadcasts rank 0's parameters), resumed state
    policy, strategy, optimizer, start = build_learner(cfg, job.comm, job.device, ckpt, ckpt_path, log)
    if job.rank == 0:  # only now: a refused resume must leave the run folder's config as it was
        save_config(cfg, job.run_dir / "config.yaml")
    run = _make_run(cfg, job, collection, policy, strategy, optimizer, first_infos, update=start.update)
    collector, storage = _rollout_parts(run, envs, obs)
    trace = TraceWriter(job.run_dir, rank=job.rank, num_steps=cfg.ppo.num_steps, enabled=cfg.run.trace)
    state = _start_state(run, start, ckpt, ckpt_path)
    stopped = False
    try:
        while state.frames < cfg.run.total_frames:
            try:
                _decay_lr(run, state)
                # 1. Collect a rollout (the strategy may end it early: DD-PPO's preemption; VER's
                #    cut-off may too).
                t0 = time.perf_counter()
                with autocast(job.device, cfg.run.precision):
                    got = collector.collect(run.policy, storage, run.strategy, run.episodes, job.device)
                t1 = time.perf_counter()

                # 2. PPO on the local rollout (DD-PPO modes average every mini-batch's gradients).
                run.policy.train()
                losses = ppo_update(run.policy, run.optimizer, storage, **_ppo_options(cfg))
                storage.after_update()

                # 3. The strategy's turn (WAGMA: one wait-avoiding group / global model average).
                sync = run.strategy.after_update()
                _account_update(run, state, collector, trace, got, sync, losses, t0=t0, t1=t1)

                # 4. Where all workers are in step: statistics, progress, checkpoints, stop signals.
                if _in_step(run, state, sync):
                    stopped = True
                    break
            except Exception as exc:
                if not faults.is_failure(exc):
                    raise
                # Open MPI with fault tolerance: ranks were lost; go on without them, here.
                stopped = _go_on_in_place(run, state, storage, exc)
    finally:
        trace.close()
    return _finish(run, state, envs, stopped=stopped)


def _start_envs(cfg: DDPPOConfig, job: Job, collection: Collection, ckpt: dict | None):
    """This rank's training environments (new episodes after a resume) and their first
    observation and infos, with the line they add to the log (or None)."""
    start_update = int(ckpt["update"]) if ckpt is not None else 0
    seed = cfg.run.seed + 1000 * job.rank + 7 * start_update
    envs, note = _make_train_envs(cfg, collection, rank=job.rank, world_size=job.size, seed=seed,
                                  first_step=start_update * cfg.ppo.num_steps, device=job.device)
    obs, first_infos = envs.reset(seed=seed)
    return envs, obs, first_infos, note


def _start_state(run: Run, start: Start, ckpt: dict | None, ckpt_path: Path | None) -> RunState:
    """The counters at the start, the first state kept for the survivors of a loss (the replicas
    are identical here: broadcast or resumed), the rescue that saves it, and the lines the start
    adds to the log (a relaunch after lost ranks, nothing left to train)."""
    state = RunState(update=start.update, frames=start.frames, wall_before=start.wall_before,
                     t_start=time.perf_counter(), checkpoint=ckpt_path)
    run.sync.remember(checkpoint_state, run, state)
    run.job.rescue = lambda exc: rescue(run.job, run.sync, exc)
    state.recovery = run.job.after_loss(ckpt, step=int((ckpt or {}).get("frames", 0)))
    total = run.cfg.run.total_frames
    if state.frames >= total:
        run.log.info(f"nothing to train: the run has {state.frames} frames, run.total_frames is "
                     f"{total}; raise run.total_frames to go on")
    return state


def _go_on_in_place(run: Run, state: RunState, storage: RolloutStorage, exc: BaseException) -> bool:
    """Ranks were lost and the survivors go on without them (:func:`continue_in_place`); returns
    True when the run must stop (the loss was met in the budget's last update: the end's
    synchronised point, the survivors' own models averaged first)."""
    state.recovery = continue_in_place(run, state, exc)
    storage.after_update()  # a rollout the loss cut short is dropped; the next one starts where
    # the environments are
    if state.frames < run.cfg.run.total_frames:
        return False
    run.strategy.synchronize()
    return sync_point(run, state, final=True)


def _finish(run: Run, state: RunState, envs, *, stopped: bool) -> TrainResult:
    """Say how the job ended (:meth:`Job.end`), close the strategy and the envs; the result."""
    job = run.job
    job.end(stopped=stopped, finished=state.frames >= run.cfg.run.total_frames,
            at=f"update {state.update}", frames=state.frames, update=state.update,
            checkpoint=state.checkpoint)
    run.log.info(f"done: update {state.update}, frames {state.frames}")
    run.strategy.close()
    envs.close()
    return TrainResult(run_dir=job.run_dir, updates=state.update, frames=state.frames,
                       checkpoint=state.checkpoint, stopped_by_signal=stopped,
                       rollout_steps=state.rollout_steps, rollout_frames=state.rollout_frames,
                       env_steps=state.env_steps, last_stats=state.stats, policy=run.policy)


def _make_run(cfg: DDPPOConfig, job: Job, collection: Collection, policy: PointNavPolicy,
              strategy: Strategy, optimizer, first_infos: dict, *, update: int) -> Run:
    """What the loop's points work with (``update``: where the run starts), and the run's first
    lines in the log."""
    # The measures beyond success, SPL and distance that the envs report (habitat's soft_spl,
    # the embedded simulator's path_length, ...); the device simulator's infos are tensors.
    measures = measure_names(first_infos) if collection.simulator is None else ()
    num_envs, world, log = cfg.env.num_envs, job.size, job.log
    for line in config_notes(cfg):
        log.info(line)
    if getattr(optimizer, "exchange_note", ""):
        log.info(optimizer.exchange_note)
    log.info(f"training {cfg.averaging.name} on {world} rank{'s' if world > 1 else ''} x {num_envs} envs "
             f"({collection.describe()}), device {job.device}, precision {cfg.run.precision}, "
             f"policy {count_parameters(policy)} parameters, run folder {job.run_dir}")
    log.text("config", "```\n" + "\n".join(f"{k}: {v}" for k, v in config_to_dict(cfg).items()) + "\n```")
    sync = SyncPoint(job, checkpoint_every=cfg.run.checkpoint_interval, at=update, aligned=False,
                     keep_synced=True, own_models=cfg.averaging.name in OWN_MODELS)
    return Run(cfg=cfg, job=job, log=log, strategy=strategy, optimizer=optimizer, policy=policy,
               meter=UpdateMeter(num_envs),
               episodes=EpisodeWindow(num_envs, cfg.run.stats_window, measures=measures),
               lagged=LaggedStats(job.deadline), collection=collection, sync=sync)


def _rollout_parts(run: Run, envs, obs: dict) -> tuple[Any, RolloutStorage]:
    """The rank's collector (as the run's collection decides) and its rollout storage, holding
    the first observation."""
    cfg, device = run.cfg, run.job.device
    collector = make_collector(run.collection, envs, num_steps=cfg.ppo.num_steps,
                               max_env_steps=cfg.rollout.max_env_steps, cutoff=cfg.rollout.cutoff,
                               min_frac=cfg.rollout.min_frac, min_batch=cfg.rollout.min_batch,
                               env_times=run.meter.env_times)
    storage = RolloutStorage(num_steps=collector.storage_steps(), num_envs=cfg.env.num_envs,
                             depth_shape=tuple(obs["depth"].shape[1:]),
                             num_recurrent_layers=run.policy.num_recurrent_layers,
                             hidden_size=run.policy.hidden_size, device=device)
    depth, goal = obs_to_torch(obs, device)
    storage.set_first(depth=depth, goal=goal)
    return collector, storage


# ------------------------------------------------------------------------------ one update's parts
def _decay_lr(run: Run, state: RunState) -> None:
    """``ppo.linear_lr_decay``: the learning rate falls linearly to 0 over the frame budget."""
    cfg = run.cfg
    if cfg.ppo.linear_lr_decay:
        for group in run.optimizer.param_groups:
            group["lr"] = cfg.ppo.lr * max(0.0, 1.0 - state.frames / cfg.run.total_frames)


def _ppo_options(cfg: DDPPOConfig) -> dict[str, Any]:
    """:func:`ppo_update`'s settings from the ``ppo`` section (and the run's precision)."""
    p = cfg.ppo
    return dict(gamma=p.gamma, lam=p.lam, clip=p.clip, ppo_epoch=p.ppo_epoch,
                num_mini_batch=p.num_mini_batch, value_coef=p.value_coef,
                entropy_coef=p.entropy_coef, max_grad_norm=p.max_grad_norm,
                normalize_advantage=p.normalize_advantage, clip_value=p.clip_value_loss,
                precision=cfg.run.precision)


def _account_update(run: Run, state: RunState, collector, trace: TraceWriter, got, sync,
                    losses: dict[str, float], *, t0: float, t1: float) -> None:
    """After an update (collection from ``t0``, PPO and the strategy's turn from ``t1``): its
    times in the trace and the meter, the counters, this rank's own state where a loss is survived
    in place, and after a loss the first update's recovery line."""
    span = time.perf_counter() - t1
    collector.observe_update(span - sync.rollout_wait_s)
    collect_s = (t1 - t0) - sync.rollout_wait_s
    update_s = span - sync.comm_s - (sync.wait_s - sync.rollout_wait_s)
    num_envs, world = run.cfg.env.num_envs, run.job.size
    steps_done = round(got.frames / num_envs)  # per env (the mean, for VER)
    trace.add(state.update, collect_s=collect_s, update_s=update_s, steps=steps_done, sync=sync,
              frames=got.frames, episodes=run.episodes)
    run.meter.add(collect_s=collect_s, update_s=update_s,
                  comm_s=sync.comm_s, wait_s=sync.wait_s, staleness=sync.staleness,
                  stale=sync.stale, rollout_steps=got.frames / num_envs,
                  preempted=float(sync.preempted), cut_short=float(got.cut_short),
                  frames=got.frames, **losses)
    state.update += 1
    state.rollout_steps.append(steps_done)
    state.rollout_frames.append(got.frames)
    state.env_steps.append(got.env_steps.tolist())
    state.count_frames(estimate=got.agreed_frames * world)
    state.uncounted += got.frames
    run.sync.keep_own(own_state, run, state)
    lost_at, since = state.recovery
    if lost_at is not None:  # the first update since the supervisor relaunched the job
        run.log.info(f"first update on {world} rank{'s' if world > 1 else ''} "
                     f"{time.time() - lost_at:.1f} s after {since}")
        run.log.scalars({"elastic/recovery_s": time.time() - lost_at}, state.frames)
        state.recovery = (None, "")


def _in_step(run: Run, state: RunState, sync) -> bool:
    """Where the strategy left the workers in step after an update (``sync``, its report): the
    synchronised point, or the stats point; returns True when the run must stop."""
    if sync.synced and sync_point(run, state, final=False):
        return True
    if sync.stats_point:
        stats_point(run, state)
    if not sync.synced and state.frames >= run.cfg.run.total_frames:
        # The agreed estimate says the budget is spent between WAGMA's global averages: make the
        # replicas identical and count exactly. VER's rollouts may have been shorter than the
        # estimate: then the loop goes on for the frames left.
        run.strategy.synchronize()
        return sync_point(run, state, final=False)
    return False


# ------------------------------------------------------------- the points where workers are in step
def sync_point(run: Run, state: RunState, *, final: bool) -> bool:
    """Where every replica is identical and every worker at the same update: reduce statistics,
    log, checkpoint; return True when the run must stop (a stop signal on any rank). Collective."""
    _finish_lagged(run, state)
    rows, stop = run.sync.gather(stats_layout(run.episodes.measures), stats_row(run.meter, run.episodes),
                                 where=f"update {state.update}", what="statistics reduction")
    stats = combine_stats(rows, run.episodes.measures)
    run.meter.reset()
    state.stats = stats
    state.count_frames(counted=stats["frames"], synced=True, own=state.uncounted)
    run.sync.remember(checkpoint_state, run, state)
    final = final or state.frames >= run.cfg.run.total_frames
    log_stats(run, state, stats, at_update=state.update, at_time=time.perf_counter(), final=final)
    if final:
        _check_replicas(run)
    if run.sync.checkpoint_due(state.update, final=final, stop=stop):
        state.checkpoint = save_checkpoint(run, state)
    return stop


def stats_point(run: Run, state: RunState) -> None:
    """Where every worker passes in step without waiting (WAGMA's overlapped global averages):
    statistics started here are collected at the next such point, never waited for (stop signals
    and checkpoints wait for a synchronised point)."""
    _finish_lagged(run, state)
    state.lagging = int(run.meter.sums["frames"])  # (the lagged reduction counts the meter's)
    run.lagged.start(run.meter, run.episodes, update=state.update, now=time.perf_counter())


def _finish_lagged(run: Run, state: RunState) -> None:
    """Log the statistics a stats point started (they cover the updates before it)."""
    if run.lagged.pending:
        stats = run.lagged.finish()
        state.count_frames(counted=stats["frames"], own=state.lagging)
        log_stats(run, state, stats, at_update=run.lagged.update, at_time=run.lagged.time, final=False)


def log_stats(run: Run, state: RunState, stats: dict, *, at_update: int, at_time: float,
              final: bool) -> None:
    """Scalars for TensorBoard (the job's and every worker's) and, every log_interval updates, a
    progress line."""
    span = max(at_time - state.logged_time, 1e-9)
    fps = (state.synced_frames - state.logged_frames) / span
    scalars = _tensorboard_scalars(stats, fps, run.optimizer, run.strategy.name,
                                   state.wall_s(at_time), at_update)
    if run.collection.ver:  # worker-rollouts VER's cut-off rule ended early
        scalars["rollout/cut_short"] = stats["cut_short"]
    scalars.update(measure_scalars(stats))
    run.log.scalars(scalars, state.synced_frames)
    # Who straggles, waits or falls behind: every worker's figures of this interval (the slowest
    # env's index goes into the text line, not into a chart).
    per = {k: v for k, v in stats["workers"].items() if k not in ("frames", "env_step_max_env")}
    per["fps"] = stats["workers"]["frames"] / span
    run.log.workers(per, state.synced_frames, slowest_by="collect_s",
                    note=env_summary(stats["workers"]))
    state.logged_frames, state.logged_time = state.synced_frames, at_time
    if final or stats["stop"] or at_update - state.log_update >= run.cfg.run.log_interval:
        state.log_update = at_update
        run.log.progress({"update": at_update, "frames": state.synced_frames, "fps": round(fps, 1),
                          "success": stats["success"], "spl": stats["spl"],
                          "reward": stats["reward"], "dist": stats["distance_to_goal"],
                          "collect_s": stats["collect_s"], "update_s": stats["update_s"],
                          "comm_s": stats["comm_s"], "wait_s": stats["wait_s"]})


def save_checkpoint(run: Run, state: RunState) -> Path | None:
    """All ranks hand in their RNG state; rank 0 writes the state of this synchronised update
    (replicas are identical here) and every rank learns the outcome. Collective."""
    rngs = run.job.deadline.allgather_obj(rng_state(), what="checkpoint gather")
    return run.job.save(lambda: dict(run.sync.snapshot or checkpoint_state(run, state), rng=rngs),
                        step=state.frames)


def checkpoint_state(run: Run, state: RunState) -> dict[str, Any]:
    """What a checkpoint holds, copied off the live model and optimizer (on the CPU), the
    per-rank RNG streams left out."""
    return {"model": cpu_copy(run.policy.state_dict()), "optimizer": cpu_copy(run.strategy.state_dict()),
            "update": state.update, "frames": state.frames,
            "wall_s": state.wall_s(time.perf_counter()), "config": config_to_dict(run.cfg),
            "world_size": run.job.size, "mode": run.cfg.averaging.name}


def _check_replicas(run: Run) -> None:
    """At the end every replica must be the same model: compare their digests (rank 0 logs it)."""
    digest = hashlib.sha256()
    for value in run.policy.state_dict().values():
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    digests = run.job.deadline.allgather_obj(digest.hexdigest()[:16], what="replica check")
    if len(set(digests)) == 1:
        run.log.info(f"replicas identical on all {run.job.size} rank{'s' if run.job.size > 1 else ''} "
                     f"(sha256 {digests[0]})")
    else:
        groups: dict[str, list[int]] = {}
        for r, d in enumerate(digests):
            groups.setdefault(d, []).append(r)
        run.log.info("replicas differ at the end: " +
                     "; ".join(f"ranks {v} sha256 {k}" for k, v in groups.items()))


# ------------------------------------------------------------------------------------ set-up
def _pick_checkpoint(cfg: DDPPOConfig, resume) -> Picked:
    """On rank 0, under the run lock: the checkpoint to continue from, its contents, and a line
    for each checkpoint skipped as unreadable."""
    skipped: list[str] = []
    path, ckpt = choose_checkpoint(
        cfg, resume, on_skip=lambda p, why: skipped.append(f"skipped checkpoint: {why}"))
    return path, ckpt, skipped


def _make_train_envs(cfg: DDPPOConfig, collection: Collection, *, rank: int, world_size: int,
                     seed: int, first_step: int, device: torch.device):
    """This worker's training environments, built for ``collection``, as slow as the
    ``heterogeneity`` section makes this rank and its envs (their stall schedules continued from
    vector step ``first_step``), and a line for the run's log (None: nothing to say); a bad
    backend, scene set or option is a ConfigError."""
    slow = Heterogeneity(cfg.heterogeneity, rank=rank, world_size=world_size,
                         num_envs=cfg.env.num_envs)
    process = collection.process
    more: dict[str, Any] = {}
    note = None
    if cfg.env.backend == "habitat":
        import envs.habitat  # (no habitat import: the placement rule only)

        # habitat-baselines' DD-PPO rule: a rank's envs render on the rank's own GPU, unless
        # env.options chooses one (the note says so).
        options, note = envs.habitat.renderer_gpu(
            (device.index or 0) if device.type == "cuda" else None, cfg.env.options)
        more.update(options)
    if process:
        # Each env sleeps its own delays in its worker; in VER the rank's slowdown too (no
        # lock-step step in this process to stretch).
        more.update(workers="process", timeout=cfg.averaging.timeout,
                    wrap_worker=SlowWorker(slow, first_step=first_step,
                                           rank_slowdown=collection.ver))
    if collection.simulator is not None:  # the batch simulator on that device
        more["device"] = collection.simulator
    try:
        venv = make_envs(cfg, rank=rank, world_size=world_size, num_envs=cfg.env.num_envs,
                         split=cfg.env.split, seed=seed, **more)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"env ({cfg.env.backend}, scenes={cfg.env.scenes!r}): {exc}") from exc
    except TypeError as exc:  # an option the environment does not take
        raise ConfigError(f"env.options {cfg.env.options!r}: {exc}; see envs.make_vector_env for "
                          "the options it takes") from exc
    if not process and collection.ver:
        import envs  # the batched env stepped through VER's asynchronous calls (all together)

        venv = envs.InProcessAsync(venv)
    return HeterogeneousVectorEnv(venv, slow, first_step=first_step, envs_inside=process), note


def _tensorboard_scalars(stats: dict[str, float], fps: float, optimizer, mode: str, wall_s: float,
                         update: int) -> dict[str, float]:
    out = {
        "metrics/reward": stats["reward"], "metrics/success": stats["success"],
        "metrics/spl": stats["spl"], "metrics/distance_to_goal": stats["distance_to_goal"],
        "metrics/episodes_in_window": stats["episodes"],
        "perf/fps": fps, "perf/wall_s": wall_s, "perf/update": float(update),
        "losses/value": stats["value_loss"], "losses/policy": stats["policy_loss"],
        "losses/entropy": stats["entropy"], "losses/clip_fraction": stats["clip_fraction"],
        "losses/approx_kl": stats["approx_kl"], "losses/grad_norm": stats["grad_norm"],
        "train/lr": float(optimizer.param_groups[0]["lr"]),
        "time/collect_s": stats["collect_s"], "time/update_s": stats["update_s"],
        "time/communicate_s": stats["comm_s"], "time/wait_s": stats["wait_s"],
        "time/collect_spread_s": stats["collect_spread_s"],
        "rollout/steps_mean": stats["rollout_steps"], "rollout/steps_min": stats["rollout_steps_min"],
        "rollout/steps_max": stats["rollout_steps_max"], "rollout/preempted": stats["preempted"],
    }
    if mode == "wagma":
        out["wagma/staleness"] = stats["staleness"]
        out["wagma/stale_contributions"] = stats["stale"]
    return out
