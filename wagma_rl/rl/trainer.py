"""The DD-PPO training loop. Read :func:`train` top to bottom: set up, then per update collect a
rollout, run PPO, let the distributed strategy average, and at points where all workers are in
step reduce statistics, log and checkpoint.

The strategy (``wagma_rl.distrib``) is called at two points only: ``collect_more`` after every
environment step (DD-PPO's preemption ends a rollout there) and ``after_update`` (WAGMA averages
models there). Everything else is the same for every mode.
"""
from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

from wagma_rl.checkpoint import CheckpointError, CheckpointManager, load_checkpoint
from wagma_rl.config import ConfigError, config_to_dict, save_config
from wagma_rl.deadline import Deadline
from wagma_rl.distrib import Strategy, make_strategy
from wagma_rl.exits import JobError, describe_failure, failure_writer, record_stop, release_shm_segments
from wagma_rl.optim.averaging import agree
from wagma_rl.runlock import RunLock, RunLocked
from wagma_rl.tblog import RunLogger

from .config import TrainConfig
from .metrics import EpisodeWindow, LaggedStats, UpdateMeter, reduce_stats
from .policy import PointNavPolicy, count_parameters
from .ppo import GradNormClip, ppo_update
from .resume import choose_checkpoint, resume_problem
from .signals import StopSignals, requeue_slurm_job
from .storage import RolloutStorage
from .trace import TraceWriter

__all__ = ["train", "TrainResult", "build_policy", "make_envs", "obs_to_torch", "resolve_device",
           "check_config"]


@dataclasses.dataclass
class TrainResult:
    """What one worker's :func:`train` call did."""

    run_dir: Path
    updates: int
    frames: int
    checkpoint: Path | None
    stopped_by_signal: bool
    rollout_steps: list[int]
    """This worker's rollout length at every update of this call."""
    last_stats: dict[str, float]
    """The last statistics reduced over all workers."""
    policy: PointNavPolicy
    """The trained policy (identical on every rank: training ends at a global synchronisation)."""


# --------------------------------------------------------------------------------------- helpers
def check_config(cfg: TrainConfig, world_size: int) -> None:
    """Reject settings that cannot work, before any work (raises ConfigError naming the key)."""
    def bad(key: str, why: str) -> None:
        raise ConfigError(f"config key '{key}': {why}")
    if cfg.env.num_envs < 1:
        bad("env.num_envs", f"must be >= 1, got {cfg.env.num_envs}")
    if not 1 <= cfg.ppo.num_mini_batch <= cfg.env.num_envs:
        bad("ppo.num_mini_batch", f"must be between 1 and env.num_envs ({cfg.env.num_envs}) because "
            f"mini-batches split the environments; got {cfg.ppo.num_mini_batch}")
    for key in ("ppo.num_steps", "ppo.ppo_epoch", "run.log_interval", "run.checkpoint_interval",
                "run.total_frames", "distrib.sync_period", "distrib.group_size", "run.torch_threads",
                "distrib.overlap_sync_every"):
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) < 1:
            bad(key, f"must be >= 1, got {getattr(getattr(cfg, section), name)}")
    if not 0.0 < cfg.distrib.sync_frac <= 1.0:
        bad("distrib.sync_frac", f"must be in (0, 1], got {cfg.distrib.sync_frac}")
    if any(r < 0 or r >= world_size for r in cfg.env.slow_ranks):
        bad("env.slow_ranks", f"{cfg.env.slow_ranks} names ranks outside 0..{world_size - 1}")
    for key in ("ppo.lr", "ppo.eps", "distrib.timeout"):
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if not value > 0:
            bad(key, f"must be > 0, got {value}")
    for key in ("policy.hidden_size", "policy.base_planes", "policy.rnn_layers", "policy.ngroups",
                "env.depth_size", "env.max_episode_steps"):
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) < 1:
            bad(key, f"must be >= 1, got {getattr(getattr(cfg, section), name)}")
    if cfg.policy.base_planes % cfg.policy.ngroups:
        bad("policy.ngroups", f"{cfg.policy.ngroups} must divide policy.base_planes ({cfg.policy.base_planes})")
    device = cfg.run.device
    if not (device == "cpu" or device == "cuda" or
            (device.startswith("cuda:") and device[5:].isdigit())):
        bad("run.device", f"{device!r} is not a device this trainer runs on; use cpu, cuda or cuda:N")


def resolve_device(name: str, comm: MPI.Comm) -> tuple[torch.device, str | None]:
    """The torch device for this rank and a warning (or None). ``cuda`` picks the GPU by the rank's
    index on its node, so several ranks per node spread over the node's GPUs."""
    if not name.startswith("cuda"):
        return torch.device(name), None
    if not torch.cuda.is_available():
        return torch.device("cpu"), f"device={name} requested but CUDA is not available: using the CPU"
    if ":" in name:
        return torch.device(name), None
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local = node.Get_rank()
    node.Free()
    return torch.device(f"cuda:{local % torch.cuda.device_count()}"), None


def build_policy(cfg: TrainConfig) -> PointNavPolicy:
    """The actor-critic the config describes."""
    p = cfg.policy
    return PointNavPolicy(depth_size=cfg.env.depth_size, use_depth=p.use_depth,
                          hidden_size=p.hidden_size, rnn_type=p.rnn_type, rnn_layers=p.rnn_layers,
                          base_planes=p.base_planes, resnet_layers=tuple(p.resnet_layers),
                          ngroups=p.ngroups)


def make_envs(cfg: TrainConfig, *, rank: int, num_envs: int, split: str, seed: int,
              episodes: str | None = None, heterogeneity: bool = True, **more: Any):
    """The vector environment of worker ``rank`` (its slow-down applied when it is a slow rank)."""
    import envs  # imported here so config errors are reported before the simulator loads

    kwargs: dict[str, Any] = dict(scenes=cfg.env.scenes, split=split, seed=seed,
                                  depth_size=cfg.env.depth_size,
                                  max_episode_steps=cfg.env.max_episode_steps)
    if heterogeneity:
        kwargs.update(slowdown=cfg.env.slowdown if rank in cfg.env.slow_ranks else 1.0,
                      step_delay_s=cfg.env.step_delay_s, step_delay_prob=cfg.env.step_delay_prob)
    if episodes:
        kwargs["episodes"] = episodes
    kwargs.update(cfg.env.options)
    kwargs.update(more)
    return envs.make_vector_env(cfg.env.backend, num_envs, **kwargs)


def obs_to_torch(obs: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(depth (N, H, W, 1), goal (N, 2)) float32 tensors on ``device``."""
    depth = torch.as_tensor(np.asarray(obs["depth"], dtype=np.float32), device=device)
    goal = torch.as_tensor(np.asarray(obs["pointgoal_with_gps_compass"], dtype=np.float32),
                           device=device)
    return depth, goal


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------ the loop
def train(cfg: TrainConfig, *, comm: MPI.Comm | None = None, resume: str | Path | None = None,
          signals: StopSignals | None = None) -> TrainResult:
    """Train a PointNav agent with DD-PPO on every rank of ``comm``; collective.

    ``resume``: a checkpoint file or run folder to continue from (see
    :func:`wagma_rl.rl.resume.choose_checkpoint`). ``signals``: stop flags (default: SIGTERM,
    SIGINT and SIGUSR1 handlers). Every wait for other ranks is bounded by ``distrib.timeout``. A
    failure a user can cause is written to ``log.txt`` as ``stopped: <why>`` before it propagates.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    rank, world = comm.Get_rank(), comm.Get_size()
    check_config(cfg, world)
    lock = RunLock(cfg.run_dir())
    try:
        return _train(cfg, comm, resume, signals, lock)
    except BaseException as exc:
        kind, line = describe_failure(exc)
        if kind == "crash":
            line = f"rank {rank}: {line}"
        # (Not into the log of another live run that holds the folder.)
        if (kind == "crash" or failure_writer(exc, rank, world)) and \
                not (isinstance(exc, JobError) and RunLocked.marker in str(exc)):
            record_stop(cfg.run_dir(), line)
        raise
    finally:
        lock.release()


def _train(cfg: TrainConfig, comm: MPI.Comm, resume, signals: StopSignals | None,
           lock: RunLock) -> TrainResult:
    rank, world = comm.Get_rank(), comm.Get_size()
    # Bounded from here on: a rank that never arrives is named (rank, host, pid) after the timeout.
    job = Deadline(comm, timeout=cfg.distrib.timeout)
    release_shm_segments(comm)  # every rank is past MPI_Init now (see wagma_rl.exits)
    torch.set_num_threads(cfg.run.torch_threads)
    run_dir = Path(cfg.run_dir())
    device, device_warning = resolve_device(cfg.run.device, comm)

    # Rank 0 locks the run folder and picks the checkpoint, so every rank resumes from the same
    # file; a problem there is raised on every rank together, so none is left waiting.
    found: tuple[Path | None, list[str], str | None] = (None, [], None)
    ckpt = None
    if rank == 0:
        skipped: list[str] = []
        try:
            lock.acquire()
            path, ckpt = choose_checkpoint(
                cfg, resume, on_skip=lambda p, why: skipped.append(f"skipped checkpoint: {why}"))
            found = (path, skipped, None)
        except (FileNotFoundError, CheckpointError, JobError, OSError) as exc:
            found = (None, skipped, describe_failure(exc)[1])
    ckpt_path, skipped, problem = job.bcast_obj(found, what="start-up (run folder and checkpoint)")
    if problem:
        raise JobError(problem)
    if ckpt_path is not None and rank != 0:
        try:
            ckpt, problem = load_checkpoint(ckpt_path), None
        except (FileNotFoundError, CheckpointError) as exc:
            problem = f"{exc} (rank 0 could read it: is the run folder on a shared file system?)"
        agree(job, problem, error=JobError)
    elif ckpt_path is not None:
        agree(job, None, error=JobError)

    # --- environments first: a bad scene set or backend is a config error, reported before any
    # collective (every rank raises the same one, so none is left waiting)
    start_update = int(ckpt["update"]) if ckpt is not None else 0
    env_seed = cfg.run.seed + 1000 * rank + 7 * start_update  # new episodes after a resume
    try:
        envs = make_envs(cfg, rank=rank, num_envs=cfg.env.num_envs, split=cfg.env.split,
                         seed=env_seed)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"env ({cfg.env.backend}, scenes={cfg.env.scenes!r}): {exc}") from exc
    except TypeError as exc:  # an option the environment does not take
        raise ConfigError(f"env.options {cfg.env.options!r}: {exc}; see envs.make_vector_env for "
                          "the options it takes") from exc
    obs, _ = envs.reset(seed=env_seed)

    log = RunLogger(run_dir, enabled=(rank == 0), tensorboard=cfg.run.tensorboard)
    ckpts = CheckpointManager(run_dir, keep_last=cfg.run.keep_checkpoints)
    if rank == 0:
        save_config(cfg, run_dir / "config.yaml")
    if device_warning:
        log.info(device_warning)
    for line in skipped:
        log.info(line)
    if lock.stale:
        log.info(f"took over the lock of a run that ended without releasing it ({lock.stale})")

    # --- model, optimizer, strategy (the wrapper broadcasts rank 0's parameters)
    _seed(cfg.run.seed + 1000 * rank)
    policy = build_policy(cfg).to(device)
    if ckpt is not None:
        problem = resume_problem(ckpt, ckpt_path, cfg, policy)
        if problem:  # every rank read the same file, so every rank raises here
            raise ConfigError(problem)
        policy.load_state_dict(ckpt["model"])
    inner = torch.optim.Adam(policy.parameters(), lr=cfg.ppo.lr, eps=cfg.ppo.eps)
    grad_clip = GradNormClip(policy.parameters(), cfg.ppo.max_grad_norm).attach(inner)
    strategy: Strategy = make_strategy(
        # A group cannot be larger than the job (a one-process run averages with itself).
        cfg.distrib.mode, comm=comm, group_size=min(cfg.distrib.group_size, world),
        sync_period=cfg.distrib.sync_period, late=cfg.distrib.late,
        global_mode=cfg.distrib.global_mode, overlap_sync_every=cfg.distrib.overlap_sync_every,
        sync_frac=cfg.distrib.sync_frac,
        short_rollout_frac=cfg.distrib.short_rollout_frac, timeout=cfg.distrib.timeout)
    optimizer = strategy.wrap_optimizer(inner)

    update, frames, wall_before = 0, 0, 0.0
    if ckpt is not None:
        strategy.load_state_dict(ckpt["optimizer"])
        for group in optimizer.param_groups:  # the config, not the checkpoint, sets the rate
            group["lr"] = cfg.ppo.lr
        update, frames, wall_before = int(ckpt["update"]), int(ckpt["frames"]), float(ckpt["wall_s"])
        rngs = ckpt.get("rng") or []
        if len(rngs) == world:
            _set_rng_state(rngs[rank])
        else:  # another world size: fresh streams, still different per rank and per resume
            _seed(cfg.run.seed + 1000 * rank + update)
        log.info(f"resumed from {ckpt_path}: update {update}, frames {frames}")

    # --- rollout storage
    num_steps, num_envs = cfg.ppo.num_steps, cfg.env.num_envs
    storage = RolloutStorage(num_steps=num_steps, num_envs=num_envs,
                             depth_shape=tuple(np.asarray(obs["depth"]).shape[1:]),
                             num_recurrent_layers=policy.num_recurrent_layers,
                             hidden_size=policy.hidden_size, device=device)
    depth, goal = obs_to_torch(obs, device)
    storage.set_first(depth=depth, goal=goal)
    episodes = EpisodeWindow(num_envs, cfg.run.stats_window)
    meter = UpdateMeter()
    trace = TraceWriter(run_dir, rank=rank, num_steps=num_steps, enabled=cfg.run.trace)

    log.info(f"training {cfg.distrib.mode} on {world} ranks x {num_envs} envs, device {device}, "
             f"policy {count_parameters(policy)} parameters, run folder {run_dir}")
    log.text("config", "```\n" + "\n".join(f"{k}: {v}" for k, v in config_to_dict(cfg).items()) + "\n```")

    signals = signals if signals is not None else StopSignals(announce=rank == 0).install()
    t_start = time.perf_counter()
    last = {"update": update, "frames": frames, "time": t_start, "log_update": update,
            "ckpt_update": update}
    synced_frames = frames  # frames agreed at the last synchronised point (or stats point)
    lagged = LaggedStats(job)
    rollout_steps: list[int] = []
    stats: dict[str, float] = {}
    ckpt_file = ckpt_path
    stopped = False

    def save_checkpoint() -> Path | None:
        """All ranks hand in their RNG state; rank 0 writes (replicas are identical here) and
        every rank learns the outcome (a failed write stops all of them with one message)."""
        rngs = job.allgather_obj(_rng_state(), what="checkpoint gather")
        outcome: tuple[Path | None, str | None] = (None, None)
        if rank == 0:
            state = {"model": {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()},
                     "optimizer": strategy.state_dict(), "update": update, "frames": frames,
                     "wall_s": wall_before + time.perf_counter() - t_start,
                     "config": config_to_dict(cfg), "world_size": world, "mode": cfg.distrib.mode,
                     "rng": rngs}
            try:
                outcome = (ckpts.save(state, step=frames), None)
                log.info(f"checkpoint {outcome[0]}")
            except (CheckpointError, OSError) as exc:
                outcome = (None, describe_failure(exc))
        path, problem = job.bcast_obj(outcome, what="checkpoint")
        if problem:
            raise JobError(problem[1], kind=problem[0])
        return path

    def log_stats(stats: dict, *, at_update: int, at_time: float, final: bool) -> None:
        """Scalars for TensorBoard and, every log_interval updates, a progress line."""
        fps = (synced_frames - last["frames"]) / max(at_time - last["time"], 1e-9)
        log.scalars(_tensorboard_scalars(stats, fps, optimizer, strategy.name,
                                         wall_before + at_time - t_start, at_update), synced_frames)
        last.update(frames=synced_frames, time=at_time)
        if final or stats["stop"] or at_update - last["log_update"] >= cfg.run.log_interval:
            last["log_update"] = at_update
            log.progress({"update": at_update, "frames": synced_frames, "fps": round(fps, 1),
                          "success": stats["success"], "spl": stats["spl"], "reward": stats["reward"],
                          "dist": stats["distance_to_goal"], "collect_s": stats["collect_s"],
                          "update_s": stats["update_s"], "comm_s": stats["comm_s"],
                          "wait_s": stats["wait_s"]})

    def finish_lagged() -> None:
        """Log the statistics a stats point started (they cover the updates before it)."""
        nonlocal synced_frames
        if lagged.pending:
            stats = lagged.finish()
            synced_frames = int(synced_frames + stats["frames"])
            log_stats(stats, at_update=lagged.update, at_time=lagged.time, final=False)

    def at_stats_point() -> None:
        """Where every worker passes in step without waiting (WAGMA's overlapped global
        averages): statistics started here are collected at the next such point, never waited
        for (stop signals and checkpoints wait for a synchronised point)."""
        finish_lagged()
        lagged.start(meter, episodes, update=update, now=time.perf_counter())

    def at_synced_point(final: bool) -> bool:
        """Reduce statistics, log, checkpoint; return True when the run must stop (collective)."""
        nonlocal stats, frames, synced_frames, ckpt_file
        finish_lagged()
        stats = reduce_stats(job, meter, episodes, stop=signals.stop)
        meter.reset()
        frames = synced_frames = int(synced_frames + stats["frames"])
        final = final or frames >= cfg.run.total_frames
        log_stats(stats, at_update=update, at_time=time.perf_counter(), final=final)
        if final or stats["stop"] or update - last["ckpt_update"] >= cfg.run.checkpoint_interval:
            last["ckpt_update"] = update
            ckpt_file = save_checkpoint()
        return stats["stop"]

    synced = True
    try:
        while frames < cfg.run.total_frames:
            if cfg.ppo.linear_lr_decay:
                for group in optimizer.param_groups:
                    group["lr"] = cfg.ppo.lr * max(0.0, 1.0 - frames / cfg.run.total_frames)

            # 1. Collect a rollout (the strategy may end it early: DD-PPO's preemption).
            t0 = time.perf_counter()
            policy.eval()
            for step in range(num_steps):
                cur = storage.current()
                actions, log_probs, values, hidden = policy.act(
                    cur["depth"], cur["goal"], cur["prev_actions"], cur["masks"], cur["h"])
                obs, rewards, terminated, truncated, infos = envs.step(actions.cpu().numpy())
                dones = np.logical_or(terminated, truncated)
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
            t1 = time.perf_counter()

            # 2. PPO on the local rollout (DD-PPO modes average gradients inside optimizer.step).
            policy.train()
            losses = ppo_update(policy, optimizer, storage, gamma=cfg.ppo.gamma, lam=cfg.ppo.lam,
                                clip=cfg.ppo.clip, ppo_epoch=cfg.ppo.ppo_epoch,
                                num_mini_batch=cfg.ppo.num_mini_batch,
                                value_coef=cfg.ppo.value_coef, entropy_coef=cfg.ppo.entropy_coef,
                                grad_clip=grad_clip, normalize_advantage=cfg.ppo.normalize_advantage,
                                clip_value=cfg.ppo.clip_value_loss)
            steps_done = storage.step
            storage.after_update()

            # 3. The strategy's turn (WAGMA: one wait-avoiding group / global model average).
            sync = strategy.after_update()
            span = time.perf_counter() - t1
            update += 1
            rollout_steps.append(steps_done)
            collect_s = (t1 - t0) - sync.rollout_wait_s
            update_s = span - sync.comm_s - (sync.wait_s - sync.rollout_wait_s)
            trace.add(update - 1, collect_s=collect_s, update_s=update_s, steps=steps_done, sync=sync)
            meter.add(collect_s=collect_s, update_s=update_s,
                      comm_s=sync.comm_s, wait_s=sync.wait_s, staleness=sync.staleness,
                      stale=sync.stale, rollout_steps=steps_done, preempted=float(sync.preempted),
                      frames=steps_done * num_envs, **losses)
            # Between synchronised points every worker advances by the same estimate (exact
            # when rollouts are full), so all of them agree on when the budget is spent.
            frames += steps_done * num_envs * world

            # 4. Where all workers are in step: statistics, progress, checkpoints, stop signals.
            synced = sync.synced
            if synced and at_synced_point(final=False):
                stopped = True
                break
            if sync.stats_point:
                at_stats_point()
        if not synced:
            # WAGMA ended between global averages: make the replicas identical for the checkpoint.
            strategy.synchronize()
            stopped = at_synced_point(final=True)
    finally:
        # `scontrol requeue` (below) ends the job with SIGTERM to every rank while it still tears
        # down. A rank killed before MPI_Finalize leaves MPICH's shared-memory segment behind, named
        # after the job step, and the requeued job (same job and step id) would hang on it in
        # MPI_Init: after a requeue request every rank ignores SIGTERM and finishes. SIG_IGN, not
        # a Python handler, because Python drops its handlers before mpi4py's MPI_Finalize runs.
        signals.uninstall(ignore_term=stopped and signals.requeue)
        trace.close()

    if stopped and signals.requeue and rank == 0:
        log.info(requeue_slurm_job())
    elif stopped:
        log.info("stopped by signal after saving the checkpoint")
    log.info(f"done: update {update}, frames {frames}")
    log.close()
    strategy.close()
    job.free()
    envs.close()
    return TrainResult(run_dir=run_dir, updates=update, frames=frames, checkpoint=ckpt_file,
                       stopped_by_signal=stopped, rollout_steps=rollout_steps, last_stats=stats,
                       policy=policy)


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
