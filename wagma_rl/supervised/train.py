"""The supervised training loop: any task, any of the six distributed optimizers, under mpiexec.

Read top to bottom: build the task and the optimizer, maybe resume, then per step compute the
gradient (whole batch, or micro-batch by micro-batch for NonBlockingSGD), let the optimizer step,
log; every ``eval_every`` steps synchronise the replicas, evaluate and checkpoint.
"""
from __future__ import annotations

import copy
import json
import math
import time

import numpy as np
import torch
from mpi4py import MPI

from native_coll import faults

from .. import elastic
from ..config import (CommandLine, ConfigError, config_notes, config_to_dict, foreign_checkpoint,
                      format_config, load_config, save_config)
from ..heterogeneity import Heterogeneity
from ..job import Job
from ..bounded_comm import Deadline
from ..job.precision import apply_precision, autocast
from ..job.lifecycle import Picked
from ..job.run_config import check_run, fresh_start_problem
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


def train(cfg: SupervisedConfig, *, comm: MPI.Comm | None = None) -> list[dict]:
    """Run one training job (collective over ``comm``); return the evaluation history.

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
    with Job(comm, run=cfg.run, timeout=cfg.averaging.timeout) as job:
        return _train(cfg, job)


def _build(cfg: SupervisedConfig, job: Job):
    """This rank's task (its data shard of ``job.size``), the model, the distributed optimizer
    over ``job.comm`` and its schedule, and the straggler emulation: (task, model, opt, sched,
    slow). Collective: a data problem on one rank stops every rank with one line."""
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
    return task, model, opt, sched, slow


def _state(cfg: SupervisedConfig, model, opt, sched, *, step: int, samples: int, train_s: float,
           history: list) -> dict:
    """What a checkpoint (and the in-memory snapshot) holds at an evaluation."""
    return {"model": model.state_dict(), "optim": opt.state_dict(), "sched": sched.state_dict(),
            "step": step, "samples": samples, "train_s": train_s, "history": history,
            "config": config_to_dict(cfg)}


def _restore(model, opt, sched, state: dict, *, size: int, source) -> tuple[int, int, float, list]:
    """Load ``state`` (:func:`_state`'s) into the model, optimizer and schedule; returns (step,
    this rank's samples on ``size`` ranks, train_s, history). ConfigError when it does not fit
    (every rank reads the same state, so every rank refuses it alike)."""
    try:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        sched.load_state_dict(state["sched"])
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
    rank, size, run_dir = job.rank, job.size, job.run_dir
    latest, state = job.start(lambda: _pick_checkpoint(cfg, job))
    apply_precision(cfg.run.precision)
    task, model, opt, sched, slow = _build(cfg, job)
    step, samples, train_s, history = 0, 0, 0.0, []
    if state is not None:  # before the log opens: a checkpoint that does not fit is a refusal
        step, samples, train_s, history = _restore(model, opt, sched, state, size=size,
                                                   source=latest)
    log = job.open_log()
    job.after_loss(state, step=int((state or {}).get("step", 0)))
    for line in config_notes(cfg) + cfg.averaging.notes(size):
        log.info(line)
    if state is not None:
        log.info(f"resumed from {latest} at step {step}")
    # Open MPI with fault tolerance: the state of the last two evaluations (replicas identical
    # there) kept in memory, to go on from in place when ranks are lost (docs/mpi.md). Under the
    # elastic supervisor the newest one is what the lowest survivor saves when ranks are lost,
    # on its timeout or at once on the supervisor's dead verdict (Job.rescue, docs/faults.md).
    keep = faults.fault_tolerant()
    snapshots: tuple[dict | None, dict | None] = (None, None)
    owned: tuple[int | None, int | None] = (None, None)  # this rank's samples at each of them
    # Optimizers whose replicas differ between averages (not in the background, whose state
    # waits for the average in flight): every survivor keeps its own state of its last step.
    own_steps = keep and cfg.averaging.name in OWN_MODEL_OPTIMIZERS and not cfg.averaging.background
    kept: dict | None = None
    if elastic.elastic_dir() is not None:
        job.rescue = lambda exc: _rescue(job, snapshots[0], exc)
    if rank == 0:
        save_config(cfg, run_dir / "config.yaml")
        log.text("config", json.dumps(config_to_dict(cfg), indent=1))
        log.info(f"{cfg.train.task} on {size} rank{'s' if size > 1 else ''} with "
                 f"{type(opt).__name__}: "
                 f"{sum(p.numel() for p in model.parameters())} parameters, "
                 f"{task.schedule.n} training items per rank")

    micro = cfg.averaging.micro_batches if isinstance(opt, NonBlockingSGD) else 1
    loss_sum, loss_n, t_log, samples_log = 0.0, 0, time.perf_counter(), samples
    # The training loss of every (micro-)batch computed since the last evaluation, weighted by its
    # samples: the eval row's train_loss (the curve the optimizers' time-to-loss is read from).
    window = [0.0, 0]
    model.train()
    stopped, checkpoint = False, latest
    mark = (samples, opt.stats.comm_time_s, train_s)  # this rank's figures at the last evaluation
    if step >= cfg.train.steps:
        log.info(f"nothing to train: the run is at step {step}, train.steps is "
                 f"{cfg.train.steps}; raise train.steps to go on")
    evaluate_now = False  # a loss met in an evaluation: it runs again over the survivors
    while step < cfg.train.steps or evaluate_now:
        try:
            if not evaluate_now:
                t0 = time.perf_counter()
                loss, used = _one_step(task, opt, slow, step=step, micro=micro, window=window,
                                       precision=cfg.run.precision)
                sched.step()
                step += 1
                samples += used
                loss_sum, loss_n = loss_sum + loss, loss_n + 1
                train_s += time.perf_counter() - t0
                if own_steps:
                    kept = _own_state(model, opt, sched, step=step, samples=samples, train_s=train_s)

                if step % cfg.run.log_interval == 0 and rank == 0:
                    now = time.perf_counter()
                    st = opt.stats
                    fields = {"step": step, "loss": loss_sum / loss_n, "lr": opt.param_groups[0]["lr"],
                              "samples_per_s": (samples - samples_log) * size / max(now - t_log, 1e-9),
                              "comm_s": st.comm_time_s, "staleness": st.staleness}
                    if micro > 1:
                        fields["carried_micro_batches"] = opt.last_round.carried
                    log.scalars({k: v for k, v in fields.items() if k != "step"}, step, prefix="train/")
                    log.progress(fields)
                    loss_sum, loss_n, t_log, samples_log = 0.0, 0, now, samples
            evaluate_now = False

            last = step >= cfg.train.steps
            if step % cfg.train.eval_every == 0 or last:
                job.check_rejoin(f"step {step}")
                now = (samples, opt.stats.comm_time_s, train_s)
                row, workers = _evaluate(opt, task, job.deadline, step=step, samples=samples,
                                         train_s=train_s, window=window, stop=job.stop_requested,
                                         interval=tuple(a - b for a, b in zip(now, mark)))
                mark = now
                stopped = bool(row.pop("stop", False))
                log.workers(workers, step, slowest_by="compute_s")
                window = [0.0, 0]
                history.append(row)
                log.scalars({task.metric: row[task.metric], "train_loss": row["train_loss"], "samples": row["samples"],
                             "samples_per_s": row["samples_per_s"], "comm_s": row["comm_s"]}, step, prefix="eval/")
                log.progress({"eval_step": step, **{k: v for k, v in row.items() if k != "step"}})
                if rank == 0:
                    with open(run_dir / "history.jsonl", "a") as fh:
                        fh.write(json.dumps(row) + "\n")
                done = _done(cfg, task, row)  # the same on every rank: all stop together
                every = cfg.run.checkpoint_interval
                if last or done or stopped or (every and step % every == 0):
                    # The replicas were just synchronised: rank 0 writes, every rank learns the outcome.
                    checkpoint = job.save(lambda: _state(cfg, model, opt, sched, step=step,
                                                         samples=row["samples"], train_s=train_s,
                                                         history=history), step=step)
                if keep or job.rescue is not None:
                    snapshots = (copy.deepcopy(_state(cfg, model, opt, sched, step=step,
                                                      samples=row["samples"], train_s=train_s,
                                                      history=history)), snapshots[0])
                    owned = (samples, owned[0])
                    if own_steps:  # (synchronised: the evaluated model is this rank's own now)
                        kept = dict(snapshots[0], samples=samples)
                if done:
                    log.info(f"{done} at step {step}")
                if done or stopped:
                    break
        except Exception as exc:
            if not (keep and faults.is_failure(exc)):
                raise
            # Ranks were lost: shrink, agree on the state to go on from (docs/mpi.md), go on.
            done = step  # this rank's completed steps
            gone = job.shrink(exc)
            snap = job.common_snapshot(snapshots, key="step")
            mine = owned[[s is snap for s in snapshots].index(True)]  # my samples at it
            held = job.deadline.allgather_obj(
                (done, kept["step"] if own_steps and kept else None,
                 kept["samples"] - mine if own_steps and kept else None),
                what="agreeing on the steps and samples to go on from")
            rank, size, log = job.rank, job.size, job.log
            task, model, opt, sched, slow = _build(cfg, job)
            own = own_steps and all(h[1] is not None for h in held)
            state, how = _keep_own(job, snap, kept, held) if own else (snap, "from the last evaluation")
            step, _, train_s, history = _restore(model, opt, sched, state, size=size, source="memory")
            # The samples counted at that evaluation shared out again (rank 0 takes the rest),
            # with this rank's own since when it keeps its state.
            base = int(snap["samples"])
            share = base // size + (base % size if rank == 0 else 0)
            samples = share + (held[rank][2] if own else 0)
            if own:  # this rank's own model (the optimizer's start broadcast rank 0's)
                model.load_state_dict(kept["model"])
                if hasattr(opt, "publish"):  # WAGMA: peers average with this model from here
                    opt.publish()
                train_s = kept["train_s"]
                kept = dict(kept, optim=state["optim"], sched=state["sched"], step=step,
                            samples=samples)
            snapshots, owned = (snap, None), (share, None)
            dropped = max(d - (k if own else step) for d, k, _ in held)
            evaluate_now = (step % cfg.train.eval_every == 0 or step >= cfg.train.steps) and \
                (not history or history[-1]["step"] != step)
            model.train()
            window, mark = [0.0, 0], (samples, opt.stats.comm_time_s, train_s)
            loss_sum, loss_n, t_log, samples_log = 0.0, 0, time.perf_counter(), samples
            log.info(f"lost {', '.join(str(p) for p in gone)}: continuing in place on {size} "
                     f"rank{'s' if size > 1 else ''} from step {step}; {how} ({dropped} completed "
                     f"step{'s' if dropped != 1 else ''} dropped)")

    job.end(stopped=stopped, finished=not stopped, at=f"step {step}", frames=samples * size,
            update=step, checkpoint=checkpoint)
    opt.close()
    return history


#: The optimizers whose replicas differ between averages: after a loss in place every survivor
#: keeps its own state of its last completed step (unless they average in the background).
OWN_MODEL_OPTIMIZERS = ("wagma", "local_sgd", "dpsgd")


def _own_state(model, opt, sched, *, step: int, samples: int, train_s: float) -> dict:
    """This rank's own state after its step ``step`` (a copy on the device): what it goes on from
    in place after a loss (``samples``: this rank's own count)."""
    return copy.deepcopy({"model": model.state_dict(), "optim": opt.state_dict(),
                          "sched": sched.state_dict(), "step": step, "samples": samples,
                          "train_s": train_s})


def _keep_own(job: Job, snap: dict, kept: dict, held: list[tuple]) -> tuple[dict, str]:
    """After a loss in place, for an optimizer of :data:`OWN_MODEL_OPTIMIZERS`: the state this
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


def _evaluate(opt, task, deadline: Deadline, *, step: int, samples: int, train_s: float, window: list,
              interval: tuple[float, float, float], stop: bool = False) -> tuple[dict, dict]:
    """Synchronise the replicas, evaluate on every rank's validation shard, combine (collective:
    one gather of a row per rank). Returns the evaluation row and the per-worker view: every
    rank's samples/s, compute and communication seconds over ``interval`` (its samples,
    communication and training seconds since the last evaluation) and its last staleness (arrays
    indexed by rank).

    ``window`` is ``[sum of loss * samples, samples]`` of the training batches since the last
    evaluation; its mean over all ranks is the row's ``train_loss``.
    """
    opt.synchronize()
    local = np.asarray(task.evaluate(), dtype=np.float64)
    # (Every rank adds whether it was asked to stop, by a signal or, on rank 0, for ranks that
    # rejoin: all stop at this step together.)
    rows = deadline.allgather(np.concatenate([
        [window[0], window[1], float(stop), samples, train_s, opt.stats.comm_time_s, *interval,
         opt.stats.staleness], local]), what="evaluation")
    loss_sum, loss_n, stops, total = rows[:, 0].sum(), rows[:, 1].sum(), rows[:, 2].max(), rows[:, 3].sum()
    wall = float(rows[:, 4].max())  # the slowest rank's training time is the job's wall time
    row = {"step": step, "samples": int(total), "train_s": wall,
           "samples_per_s": total / max(wall, 1e-9), "comm_s": float(rows[:, 5].mean()),
           "train_loss": loss_sum / max(loss_n, 1)}
    row.update(task.summarize(rows[:, 10:].sum(axis=0)))
    if stops:
        row["stop"] = True
    d_samples, d_comm, d_train = rows[:, 6], rows[:, 7], rows[:, 8]
    workers = {"compute_s": d_train - d_comm, "comm_s": d_comm,
               "samples_per_s": d_samples / np.maximum(d_train, 1e-9), "staleness": rows[:, 9]}
    return row, workers


def main(argv: list[str] | None = None) -> list[dict]:
    """Command line: ``python -m wagma_rl.supervised --config FILE [key=value ...]``; with
    ``--print-config`` / ``--explain-config`` rank 0 prints the resolved config and nothing runs
    (the history is then empty)."""
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
    return train(cfg)
