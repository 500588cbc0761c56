"""The supervised training loop: any task, any of the six distributed optimizers, under mpiexec.

Read top to bottom: build the task and the optimizer, maybe resume, then per step compute the
gradient (whole batch, or micro-batch by micro-batch for NonBlockingSGD), let the optimizer step,
log; every ``eval_every`` steps synchronise the replicas, evaluate and checkpoint.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

from native_coll import faults

from .. import elastic
from ..config import (CommandLine, ConfigError, config_notes, config_to_dict, foreign_checkpoint,
                      format_config, load_config, save_config)
from ..heterogeneity import Heterogeneity
from ..job import Job
from ..job.precision import apply_run_settings, autocast
from ..job.lifecycle import Picked
from ..job.run_config import check_run, fresh_start_problem
from ..job.signals import StopSignals
from ..job.sync import OWN_MODELS, RowLayout, SyncPoint
from ..optim import NonBlockingSGD
from ..optim.averaging import agree
from .config import SupervisedConfig
from .tasks import build_task

__all__ = ["build_local_optimizer", "train", "main"]


def build_local_optimizer(cfg: SupervisedConfig, params) -> torch.optim.Optimizer:
    """The plain torch optimizer that the distributed one wraps."""
    o = cfg.optim
    if o.base == "sgd":
        return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    cls = torch.optim.Adam if o.base == "adam" else torch.optim.AdamW
    return cls(params, lr=o.lr, weight_decay=o.weight_decay)


def _build_optimizer(cfg: SupervisedConfig, model: torch.nn.Module, comm: MPI.Comm):
    """The distributed optimizer ``averaging:`` names, wrapping the local one (collective)."""
    return cfg.averaging.build(build_local_optimizer(cfg, model.parameters()), comm=comm,
                               buffers=model.buffers())


def _lr_lambda(cfg: SupervisedConfig):
    warm, total, kind = cfg.optim.warmup_steps, cfg.train.steps, cfg.optim.schedule

    def factor(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if kind == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))
        return 1.0
    return factor


def train(cfg: SupervisedConfig, *, comm: MPI.Comm | None = None,
          signals: StopSignals | None = None) -> list[dict]:
    """Run one training job (collective over ``comm``); return the evaluation history.
    ``signals``: stop flags the caller installed (default: SIGTERM, SIGINT and SIGUSR1 handlers
    installed for the job).

    Every wait for other ranks is bounded by ``averaging.timeout`` (docs/faults.md): a lost rank
    ends the job with one line naming it (and, under ``python -m wagma_rl.elastic``, the job goes on
    without it from its newest checkpoint).
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    # Bad settings stop every rank alike (the same check on the same config), before any work.
    check_run(cfg.run)
    if cfg.train.time_budget_s < 0:
        raise ConfigError(f"config key 'train.time_budget_s': must be >= 0 seconds (0: no limit), "
                          f"got {cfg.train.time_budget_s}")
    cfg.check()
    with Job(comm, run=cfg.run, timeout=cfg.averaging.timeout, signals=signals) as job:
        return _train(cfg, job)


@dataclasses.dataclass
class _Learner:
    """What a step trains with, built over ``job.comm`` (again over the survivors after a loss)."""

    task: Any
    """This rank's task (its data shard, model and evaluation)."""
    model: torch.nn.Module
    opt: Any
    """The distributed optimizer ``averaging:`` names, wrapping the local one."""
    sched: torch.optim.lr_scheduler.LambdaLR
    slow: Heterogeneity
    """The straggler emulation of this rank."""


@dataclasses.dataclass
class _Progress:
    """Where the run is (its counters and history), and this rank's figures of the current
    progress-line and evaluation intervals."""

    step: int = 0
    samples: int = 0
    """This rank's samples (its share of the resumed run's, plus its own since)."""
    train_s: float = 0.0
    history: list = dataclasses.field(default_factory=list)
    """The evaluation rows, the resumed run's included."""
    checkpoint: Any = None
    """The last checkpoint written (or resumed from)."""
    stopped: bool = False
    loss_sum: float = 0.0
    loss_n: int = 0
    t_log: float = 0.0
    samples_log: int = 0
    """The progress line's interval: losses since the last line, its time and samples."""
    window: list = dataclasses.field(default_factory=lambda: [0.0, 0])
    """The training loss of every (micro-)batch computed since the last evaluation, weighted by
    its samples ([sum of loss * samples, samples]): the eval row's train_loss (the curve the
    optimizers' time-to-loss is read from)."""
    mark: tuple = (0, 0.0, 0.0)
    """This rank's (samples, communication seconds, training seconds) at the last evaluation."""

    def new_intervals(self, opt) -> None:
        """Start the progress-line and evaluation intervals here."""
        self.loss_sum, self.loss_n, self.t_log, self.samples_log = 0.0, 0, time.perf_counter(), self.samples
        self.window, self.mark = [0.0, 0], (self.samples, opt.stats.comm_time_s, self.train_s)


def _build(cfg: SupervisedConfig, job: Job) -> _Learner:
    """This rank's task (its data shard of ``job.size``), the model, the distributed optimizer
    over ``job.comm`` and its schedule, and the straggler emulation. Collective: a data problem
    on one rank stops every rank with one line."""
    slow = Heterogeneity(cfg.heterogeneity, rank=job.rank, world_size=job.size)
    torch.manual_seed(cfg.run.seed)
    try:
        task, problem = build_task(cfg, rank=job.rank, world_size=job.size, device=job.device), None
    except (ValueError, FileNotFoundError, ImportError) as exc:
        task, problem = None, str(exc)
    agree(job.deadline, problem, error=ConfigError)
    model = task.model
    opt = _build_optimizer(cfg, model, job.comm)  # NonBlockingSGD averages buffers at syncs only
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg))
    return _Learner(task=task, model=model, opt=opt, sched=sched, slow=slow)


def _state(cfg: SupervisedConfig, learner: _Learner, at: _Progress, *, samples: int) -> dict:
    """What a checkpoint (and the in-memory snapshot) holds at an evaluation (``samples``: all
    ranks')."""
    return {"model": learner.model.state_dict(), "optim": learner.opt.state_dict(),
            "sched": learner.sched.state_dict(), "step": at.step, "samples": samples,
            "train_s": at.train_s, "history": at.history, "config": config_to_dict(cfg)}


def _snapshot(cfg: SupervisedConfig, learner: _Learner, at: _Progress, samples: int) -> dict:
    """:func:`_state`, copied: what the survivors of a loss go on from or save."""
    return copy.deepcopy(_state(cfg, learner, at, samples=samples))


def _restore(learner: _Learner, state: dict, *, size: int, source) -> tuple[int, int, float, list]:
    """Load ``state`` (:func:`_state`'s) into the model, optimizer and schedule; returns (step,
    this rank's samples on ``size`` ranks, train_s, history). ConfigError when it does not fit
    (every rank reads the same state, so every rank refuses it alike)."""
    try:
        learner.model.load_state_dict(state["model"])
        learner.opt.load_state_dict(state["optim"])
        learner.sched.load_state_dict(state["sched"])
    except (RuntimeError, ValueError, KeyError) as exc:
        why = " ".join(part.strip() for part in str(exc).split("\n") if part.strip())
        why = (why[:300] + " ...") if len(why) > 300 else (why or type(exc).__name__)
        raise ConfigError(f"checkpoint {str(source)!r} does not fit this run ({why}); resume "
                          "with the run's own train and optim settings, or start a new run in "
                          "another run.dir") from None
    return state["step"], state["samples"] // size, state["train_s"], list(state["history"])


def _pick_checkpoint(cfg: SupervisedConfig, job: Job) -> Picked:
    """On rank 0, under the run lock: a new run must not write into another run's folder; with
    ``run.auto_resume`` the newest checkpoint is continued from."""
    problem = fresh_start_problem(cfg.run)
    if problem:
        raise ConfigError(problem)
    latest = job.ckpts.latest() if cfg.run.auto_resume else None
    state = job.ckpts.load(latest) if latest else None
    problem = state is not None and foreign_checkpoint(SupervisedConfig, state, latest)
    if problem:  # (an RL run's folder: its model would not load)
        raise ConfigError(problem)
    return latest, state, []


def _train(cfg: SupervisedConfig, job: Job) -> list[dict]:
    latest, state = job.start(lambda: _pick_checkpoint(cfg, job))
    apply_run_settings(cfg.run.precision, cudnn_benchmark=cfg.run.cudnn_benchmark)
    learner = _build(cfg, job)
    at = _Progress(checkpoint=latest)
    if state is not None:  # before the log opens: a checkpoint that does not fit is a refusal
        at.step, at.samples, at.train_s, at.history = _restore(learner, state, size=job.size,
                                                               source=latest)
    job.open_log()
    job.after_loss(state, step=int((state or {}).get("step", 0)))
    _log_start(cfg, job, learner, resumed=latest if state is not None else None, step=at.step)
    # The state of the last two evaluations (replicas identical there) kept in memory: with Open
    # MPI's fault tolerance, to go on from in place when ranks are lost (docs/mpi.md); under the
    # elastic supervisor, what the lowest survivor saves when ranks are lost, on its timeout or at
    # once on the supervisor's dead verdict (Job.rescue, docs/faults.md). Optimizers whose
    # replicas differ between averages (not in the background, whose state waits for the average
    # in flight) keep each rank's own state of its last step too.
    rescuing = elastic.elastic_dir() is not None
    sync = SyncPoint(job, checkpoint_every=cfg.run.checkpoint_interval, at=at.step, aligned=True,
                     keep_synced=faults.fault_tolerant() or rescuing,
                     own_models=cfg.averaging.name in OWN_MODELS and not cfg.averaging.background)
    if rescuing:
        job.rescue = lambda exc: _rescue(job, sync.snapshot, exc)
    micro = cfg.averaging.micro_batches if isinstance(learner.opt, NonBlockingSGD) else 1
    at.new_intervals(learner.opt)
    learner.model.train()
    if at.step >= cfg.train.steps:
        job.log.info(f"nothing to train: the run is at step {at.step}, train.steps is "
                     f"{cfg.train.steps}; raise train.steps to go on")
    evaluate_now = False  # a loss met in an evaluation: it runs again over the survivors
    while at.step < cfg.train.steps or evaluate_now:
        try:
            if not evaluate_now:
                _train_step(cfg, learner, at, micro=micro)
                sync.keep_own(_own_state, learner, at)
                if at.step % cfg.run.log_interval == 0 and job.rank == 0:
                    _log_progress(job, learner.opt, at, micro=micro)
            evaluate_now = False
            if at.step % cfg.train.eval_every == 0 or at.step >= cfg.train.steps:
                if _evaluation_point(cfg, job, sync, learner, at):
                    break
        except Exception as exc:
            if not (sync.in_place and faults.is_failure(exc)):
                raise
            # Ranks were lost: shrink, agree on the state to go on from (docs/mpi.md), go on.
            learner, evaluate_now = _continue_in_place(cfg, job, sync, at, exc)

    job.end(stopped=at.stopped, finished=not at.stopped, at=f"step {at.step}",
            frames=at.samples * job.size, update=at.step, checkpoint=at.checkpoint)
    learner.opt.close()
    return at.history


def _log_start(cfg: SupervisedConfig, job: Job, learner: _Learner, *, resumed, step: int) -> None:
    """The run's first lines: config notes, where it resumed, the config and what trains."""
    log, size = job.log, job.size
    for line in config_notes(cfg) + cfg.averaging.notes(size):
        log.info(line)
    if getattr(learner.opt, "exchange_note", ""):
        log.info(learner.opt.exchange_note)
    if resumed is not None:
        log.info(f"resumed from {resumed} at step {step}")
    if job.rank == 0:
        save_config(cfg, job.run_dir / "config.yaml")
        log.text("config", json.dumps(config_to_dict(cfg), indent=1))
        log.info(f"{cfg.train.task} on {size} rank{'s' if size > 1 else ''} with "
                 f"{type(learner.opt).__name__}: "
                 f"{sum(p.numel() for p in learner.model.parameters())} parameters, "
                 f"{learner.task.schedule.n} training items per rank")


def _train_step(cfg: SupervisedConfig, learner: _Learner, at: _Progress, *, micro: int) -> None:
    """One optimizer step (:func:`_one_step`) and the schedule's, counted."""
    t0 = time.perf_counter()
    loss, used = _one_step(learner.task, learner.opt, learner.slow, step=at.step, micro=micro,
                           window=at.window, precision=cfg.run.precision)
    learner.sched.step()
    at.step += 1
    at.samples += used
    at.loss_sum, at.loss_n = at.loss_sum + loss, at.loss_n + 1
    at.train_s += time.perf_counter() - t0


def _log_progress(job: Job, opt, at: _Progress, *, micro: int) -> None:
    """Rank 0's progress line and TensorBoard points of the interval since the last one."""
    now = time.perf_counter()
    st = opt.stats
    fields = {"step": at.step, "loss": at.loss_sum / at.loss_n, "lr": opt.param_groups[0]["lr"],
              "samples_per_s": (at.samples - at.samples_log) * job.size / max(now - at.t_log, 1e-9),
              "comm_s": st.comm_time_s, "staleness": st.staleness}
    if micro > 1:
        fields["carried_micro_batches"] = opt.last_round.carried
    job.log.scalars({k: v for k, v in fields.items() if k != "step"}, at.step, prefix="train/")
    job.log.progress(fields)
    at.loss_sum, at.loss_n, at.t_log, at.samples_log = 0.0, 0, now, at.samples


def _evaluation_point(cfg: SupervisedConfig, job: Job, sync: SyncPoint, learner: _Learner,
                      at: _Progress) -> bool:
    """Where the replicas are synchronised: evaluate (with the stop folded in), log, checkpoint
    by the cadence, keep the state for the survivors of a loss; returns True when the job ends
    here (a stop, its targets or its time budget). Collective."""
    task, log, step = learner.task, job.log, at.step
    now = (at.samples, learner.opt.stats.comm_time_s, at.train_s)
    row, workers, at.stopped = _evaluate(learner.opt, task, sync, step=step, samples=at.samples,
                                         train_s=at.train_s, window=at.window,
                                         interval=tuple(a - b for a, b in zip(now, at.mark)))
    at.mark = now
    log.workers(workers, step, slowest_by="compute_s")
    at.window = [0.0, 0]
    at.history.append(row)
    log.scalars({task.metric: row[task.metric], "train_loss": row["train_loss"], "samples": row["samples"],
                 "samples_per_s": row["samples_per_s"], "comm_s": row["comm_s"]}, step, prefix="eval/")
    log.progress({"eval_step": step, **{k: v for k, v in row.items() if k != "step"}})
    if job.rank == 0:
        with open(job.run_dir / "history.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
    done = _done(cfg, task, row)  # the same on every rank: all stop together
    if sync.checkpoint_due(step, final=step >= cfg.train.steps or bool(done), stop=at.stopped):
        # The replicas were just synchronised: rank 0 writes, every rank learns the outcome.
        at.checkpoint = job.save(lambda: _state(cfg, learner, at, samples=row["samples"]), step=step)
    sync.remember(_snapshot, cfg, learner, at, row["samples"], mine=at.samples)
    if sync.keeps_own:  # (synchronised: the evaluated model is this rank's own now)
        sync.kept = dict(sync.snapshot, samples=at.samples)
    if done:
        log.info(f"{done} at step {step}")
    return bool(done or at.stopped)


def _own_state(learner: _Learner, at: _Progress) -> dict:
    """This rank's own state after its step ``at.step`` (a copy on the device): what it goes on
    from in place after a loss (``samples``: this rank's own count)."""
    return copy.deepcopy({"model": learner.model.state_dict(), "optim": learner.opt.state_dict(),
                          "sched": learner.sched.state_dict(), "step": at.step,
                          "samples": at.samples, "train_s": at.train_s})


def _continue_in_place(cfg: SupervisedConfig, job: Job, sync: SyncPoint, at: _Progress,
                       exc: BaseException) -> tuple[_Learner, bool]:
    """After ranks were lost under Open MPI's fault tolerance (docs/mpi.md): shrink the job, agree
    on the state to go on from (the last evaluation every survivor holds, or for
    :data:`OWN_MODELS` each survivor's own state of its last step), rebuild the learner over the
    survivors and restore it. Returns the learner and whether the evaluation the loss cut short
    runs again. Collective over the survivors."""
    done = at.step  # this rank's completed steps
    gone = job.shrink(exc)
    snap, mine = sync.common(key="step")  # (mine: my samples at it)
    kept, own_steps = sync.kept, sync.keeps_own
    held = job.deadline.allgather_obj(
        (done, kept["step"] if own_steps and kept else None,
         kept["samples"] - mine if own_steps and kept else None),
        what="agreeing on the steps and samples to go on from")
    rank, size = job.rank, job.size
    learner = _build(cfg, job)
    own = own_steps and all(h[1] is not None for h in held)
    state, how = _keep_own(job, snap, kept, held) if own else (snap, "from the last evaluation")
    at.step, _, at.train_s, at.history = _restore(learner, state, size=size, source="memory")
    # The samples counted at that evaluation shared out again (rank 0 takes the rest), with this
    # rank's own since when it keeps its state.
    base = int(snap["samples"])
    share = base // size + (base % size if rank == 0 else 0)
    at.samples = share + (held[rank][2] if own else 0)
    if own:  # this rank's own model (the optimizer's start broadcast rank 0's)
        learner.model.load_state_dict(kept["model"])
        if hasattr(learner.opt, "publish"):  # WAGMA: peers average with this model from here
            learner.opt.publish()
        at.train_s = kept["train_s"]
        sync.kept = dict(kept, optim=state["optim"], sched=state["sched"], step=at.step,
                         samples=at.samples)
    sync.restart(snap, mine=share)
    dropped = max(d - (k if own else at.step) for d, k, _ in held)
    evaluate_now = (at.step % cfg.train.eval_every == 0 or at.step >= cfg.train.steps) and \
        (not at.history or at.history[-1]["step"] != at.step)
    learner.model.train()
    at.new_intervals(learner.opt)
    job.log.info(f"lost {', '.join(str(p) for p in gone)}: continuing in place on {size} "
                 f"rank{'s' if size > 1 else ''} from step {at.step}; {how} ({dropped} completed "
                 f"step{'s' if dropped != 1 else ''} dropped)")
    return learner, evaluate_now


def _keep_own(job: Job, snap: dict, kept: dict, held: list[tuple]) -> tuple[dict, str]:
    """After a loss in place, for an optimizer of :data:`OWN_MODELS`: the state this
    survivor restores (its own model and inner optimizer state from ``kept``; the step, the
    averaging schedule and the learning-rate schedule of the survivor at the lowest completed
    step, sent by it; the samples counted at the last evaluation ``snap`` plus every survivor's
    since, in ``samples``) and the log line's account. ``held``: every survivor's (completed
    steps, kept step, own samples since ``snap``). Collective over the survivors."""
    steps = [h[1] for h in held]
    root = steps.index(min(steps))
    schedule = job.deadline.bcast_obj(
        ({k: v for k, v in kept["optim"]["wrapper"].items() if k != "outer"}, kept["sched"])
        if job.rank == root else None, root=root, what="the averaging schedule to go on with")
    since = sum(h[2] for h in held)
    optim = dict(kept["optim"], wrapper=dict(kept["optim"]["wrapper"], **schedule[0]))
    state = dict(snap, model=kept["model"], optim=optim, sched=schedule[1], step=min(steps),
                 samples=int(snap["samples"]) + since)
    how = (f"each survivor keeps its own model of its last completed step (steps "
           f"{', '.join(map(str, steps))} on the new ranks 0-{len(steps) - 1}): "
           f"{snap['samples']} samples counted at step {snap['step']} + {since} the survivors "
           "trained on since; the lost ranks' since are dropped")
    return state, how


def _rescue(job: Job, snap: dict | None, exc: BaseException) -> str | None:
    """Job.rescue: the lowest survivor saves the last evaluation's state (``snap``) as a
    checkpoint and prepares the loss record (:meth:`Job.save_for_survivors`)."""
    if snap is None:
        return None
    step, samples = int(snap["step"]), int(snap["samples"])
    return job.save_for_survivors(exc, snap, step=step, update=step, frames=samples,
                                  point="evaluation", what=f"step {step}, {samples} samples",
                                  saved=f"step {step} ({samples} samples)")


def _one_step(task, opt, slow: Heterogeneity, *, step: int, micro: int,
              window: list, precision: str = "fp32") -> tuple[float, int]:
    """One optimizer step on this rank's batch of ``step``: its gradient (for NonBlockingSGD
    micro-batch by micro-batch, until the round ends), the step, zeroed gradients. Adds the
    batches' loss to ``window``; returns the last loss and the samples the step used.
    ``precision`` (``run.precision``): bf16 runs the forward pass and the loss under autocast;
    the parameters, gradients and averages stay float32."""
    batch = task.batch(step)
    parts = [batch] if micro == 1 else task.split(batch, micro)
    for part in parts:
        t_c = time.perf_counter()
        with autocast(task.device, precision):
            loss = task.loss(part)
        loss.backward()
        window[0] += loss.item() * task.size(part)
        window[1] += task.size(part)
        slow.sleep(time.perf_counter() - t_c, step=step, fraction=1.0 / micro)
        if micro > 1 and not opt.micro_step():
            break
    opt.step()
    opt.zero_grad()
    used = task.size(batch) if micro == 1 else opt.last_round.counts[opt.rank] * task.size(parts[0])
    return loss.item(), used


def _done(cfg: SupervisedConfig, task, row: dict) -> str | None:
    """Why the job ends at the evaluation ``row`` (its targets reached, its time budget spent: the
    slowest rank's training time), or None."""
    t = cfg.train
    if (t.target_metric or t.target_loss) and \
            (not t.target_metric or row[task.metric] >= t.target_metric) and \
            (not t.target_loss or row["train_loss"] <= t.target_loss):
        return (f"reached the targets ({task.metric} {row[task.metric]:.2f}, training loss "
                f"{row['train_loss']:.4f})")
    if t.time_budget_s and row["train_s"] >= t.time_budget_s:
        return (f"spent the time budget ({row['train_s']:.1f} s of training, "
                f"train.time_budget_s={t.time_budget_s:g})")
    return None


#: A rank's row in the evaluation's gather (:func:`_evaluate`): its training loss window, the stop
#: flag, its samples, training and communication seconds so far, its figures since the last
#: evaluation and its last staleness; then the sums of its validation shard (``evaluation``).
EVAL_FIELDS = ("loss_sum", "loss_n", "stop", "samples", "train_s", "comm_s", "interval_samples",
               "interval_comm_s", "interval_train_s", "staleness")


def _evaluate(opt, task, sync: SyncPoint, *, step: int, samples: int, train_s: float, window: list,
              interval: tuple[float, float, float]) -> tuple[dict, dict, bool]:
    """Synchronise the replicas, evaluate on every rank's validation shard, combine (collective:
    one gather of a row per rank, :data:`EVAL_FIELDS`). Returns the evaluation row, the per-worker
    view (every rank's samples/s, compute and communication seconds over ``interval``, its
    samples, communication and training seconds since the last evaluation, and its last
    staleness: arrays indexed by rank) and whether any rank stops here (a signal, or on rank 0
    ranks that rejoin: all stop at this step together).

    ``window`` is ``[sum of loss * samples, samples]`` of the training batches since the last
    evaluation; its mean over all ranks is the row's ``train_loss``.
    """
    opt.synchronize()
    local = np.asarray(task.evaluate(), dtype=np.float64)
    layout = RowLayout(EVAL_FIELDS, {"evaluation": local.size})
    rows, stop = sync.gather(layout, {
        "loss_sum": window[0], "loss_n": window[1], "samples": samples, "train_s": train_s,
        "comm_s": opt.stats.comm_time_s, "interval_samples": interval[0],
        "interval_comm_s": interval[1], "interval_train_s": interval[2],
        "staleness": opt.stats.staleness, "evaluation": local}, where=f"step {step}", what="evaluation")
    c = layout.columns(rows)
    total = c["samples"].sum()
    wall = float(c["train_s"].max())  # the slowest rank's training time is the job's wall time
    row = {"step": step, "samples": int(total), "train_s": wall,
           "samples_per_s": total / max(wall, 1e-9), "comm_s": float(c["comm_s"].mean()),
           "train_loss": c["loss_sum"].sum() / max(c["loss_n"].sum(), 1)}
    row.update(task.summarize(c["evaluation"].sum(axis=0)))
    d_samples, d_comm, d_train = c["interval_samples"], c["interval_comm_s"], c["interval_train_s"]
    workers = {"compute_s": d_train - d_comm, "comm_s": d_comm,
               "samples_per_s": d_samples / np.maximum(d_train, 1e-9), "staleness": c["staleness"]}
    return row, workers, stop


def main(argv: list[str] | None = None, *, signals: StopSignals | None = None) -> list[dict]:
    """Command line: ``python -m wagma_rl.supervised --config FILE [key=value ...]``; with
    ``--print-config`` / ``--explain-config`` rank 0 prints the resolved config and nothing runs
    (the history is then empty). ``signals``: as :func:`train`'s."""
    ap = CommandLine(prog="python -m wagma_rl.supervised",
                     description="Supervised training (ResNet / Transformer) with a distributed "
                                 "optimizer; run under mpiexec.")
    ap.add_argument("--config", help="YAML file under configs/ (e.g. configs/resnet_shapes.yaml)")
    ap.add_argument("--print-config", action="store_true",
                    help="print the resolved config (defaults, then the file, then the overrides) "
                         "as YAML and exit: nothing runs, no run folder is made")
    ap.add_argument("--explain-config", action="store_true",
                    help="as --print-config, with each key's meaning as a comment above it")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. averaging.name=allreduce train.steps=200")
    args = ap.parse_args(argv)  # overrides before, between or after the flags
    printing = args.print_config or args.explain_config
    if args.config is None and not printing:
        ap.error("the following arguments are required: --config")
    cfg = load_config(SupervisedConfig, args.config, args.overrides)
    if printing:
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(format_config(cfg, explain=args.explain_config), end="", flush=True)
        return []
    return train(cfg, signals=signals)
