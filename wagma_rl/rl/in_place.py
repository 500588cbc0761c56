"""Going on in place after ranks were lost (Open MPI with ULFM, docs/mpi.md), and the state kept
for it: the RL side of :class:`wagma_rl.job.sync.SyncPoint` and :meth:`wagma_rl.job.Job.shrink`.

:func:`rescue` saves the last synchronised state for the elastic supervisor's relaunch (MPICH,
a stopped rank); :func:`own_state` is what each rank keeps after its update where a loss is survived
in place; :func:`continue_in_place` shrinks, agrees on the state to go on from, and rebuilds the
learner over the survivors.
"""
from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any

import torch

from wagma_rl.job import Job
from wagma_rl.job.exits import JobError, describe_failure
from wagma_rl.job.sync import SyncPoint

from .learner import build_learner
from .metrics import LaggedStats

if TYPE_CHECKING:
    from .trainer import Run, RunState

__all__ = ["rescue", "own_state", "continue_in_place", "cpu_copy"]


def cpu_copy(tree: Any) -> Any:
    """``tree`` (a state dict, nested) with every tensor copied to the CPU and the rest deep-copied:
    what a rank keeps of its state while it trains on."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: cpu_copy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(cpu_copy(v) for v in tree)
    return copy.deepcopy(tree)


def rescue(job: Job, sync: SyncPoint, exc: BaseException) -> str | None:
    """On the lowest surviving rank after ranks were lost: save the state of the last
    synchronised update as a checkpoint and prepare the loss record for the supervisor
    (:meth:`Job.save_for_survivors`); the line to report (None: nothing saved)."""
    snap = sync.snapshot
    if snap is None:
        return None
    return job.save_for_survivors(exc, snap, step=int(snap["frames"]), update=int(snap["update"]),
                                  frames=int(snap["frames"]), point="update",
                                  what=f"update {snap['update']}, {snap['frames']} frames")


def own_state(run: Run, state: RunState) -> dict[str, Any]:
    """This rank's own model and optimizer state after its update ``state.update`` (a copy on the
    CPU, as :func:`checkpoint_state`'s): :attr:`SyncPoint.kept`."""
    return {"model": cpu_copy(run.policy.state_dict()), "optimizer": cpu_copy(run.strategy.state_dict()),
            "update": state.update}


def continue_in_place(run: Run, state: RunState, exc: BaseException) -> tuple[float, str]:
    """After ranks were lost under Open MPI's fault tolerance (docs/mpi.md): the survivors shrink
    the job (:meth:`Job.shrink`: the lowest survivor takes the run lock and the log), agree on the
    state to go on from, restore it from memory and rebuild the strategy over the smaller
    communicator; ``run`` then holds the new policy, strategy, optimizer and log.

    * Modes whose replicas differ between global averages (:data:`OWN_MODELS`): every
      survivor keeps its own model and optimizer state of its last completed update (only the
      update in progress is lost). The update counter and the averaging schedule go on from the
      lowest completed update among the survivors (one a survivor ahead keeps its model: one more
      local update, its frames counted); the frames are those counted by the last count every
      survivor completed plus every survivor's since (the lost ranks' frames since are gone).
    * Every update synchronised (allreduce, preempt): the last synchronised update they all hold
      (the current one, but where the loss was met in its statistics' reduction).

    Returns when the loss was met and what it was, for the first update's recovery line.
    Collective over the survivors."""
    met = time.time()
    job, cfg = run.job, run.cfg
    done = state.update  # this rank's completed updates
    gone = job.shrink(exc)
    sync = run.sync
    common, _ = sync.common(key="update")
    own = sync.kept is not None  # (kept only for OWN_MODELS, where a loss is survived in place)
    held = job.deadline.allgather_obj(
        (done, _accounts(state, sync.kept) if own else None),
        what="agreeing on the updates and frames to go on from")
    for name in ("policy", "strategy", "optimizer"):  # the old ones run over revoked communicators
        setattr(run, name, None)
    run.log = job.log
    names = ", ".join(str(p) for p in gone)
    if own:
        snap, how = _keep_own(sync.kept, common, [h[1] for h in held])
    else:
        snap = common
        how = "from the last synchronised update"
    dropped = max(d - (k[0] if k else int(snap["update"])) for d, k in held)
    what = "the survivors' own states" if own else "the synchronised state"
    policy, strategy, optimizer, _ = build_learner(
        cfg, job.comm, job.device, snap, state.checkpoint, run.log,
        restored=f"{what} in memory (lost {names})")
    if own:  # (the learner's start broadcast the new rank 0's model)
        policy.load_state_dict(sync.kept["model"])
        if hasattr(optimizer, "publish"):  # WAGMA: peers average with this model from here
            optimizer.publish()
        sync.kept = dict(sync.kept, optimizer=snap["optimizer"], update=int(snap["update"]))
    run.policy, run.strategy, run.optimizer = policy, strategy, optimizer
    run.meter.reset()
    run.lagged = LaggedStats(job.deadline)
    state.update, state.frames = int(snap["update"]), int(snap["frames"])
    state.synced_frames = state.logged_frames = state.frames
    state.uncounted = state.lagging = state.counts = 0
    state.last_count = (state.frames, 0)
    sync.restart(common)
    line = (f"lost {names}: continuing in place on {job.size} rank{'s' if job.size > 1 else ''} "
            f"from update {state.update} ({state.frames} frames), {time.time() - met:.2f} s after "
            f"the failure was met ({describe_failure(exc)[1].splitlines()[0][:200]}); {how} "
            f"({dropped} completed update{'s' if dropped != 1 else ''} dropped)")
    run.log.info(line)
    run.log.text("elastic", line)
    run.log.scalars({"elastic/world_size": float(job.size),
                     "elastic/updates_dropped": float(dropped)}, state.frames)
    return met, "the failure was met (in place)"


def _accounts(state: RunState, kept: dict) -> tuple:
    """What :func:`_keep_own` agrees on, from this rank: its kept update and schedule position,
    and its frame count (counts done, ``synced_frames``, frames uncounted, the last count)."""
    opt = kept["optimizer"]
    return (kept["update"], opt.get("strategy_updates"), opt["wrapper"].get("iteration"),
            state.counts, state.synced_frames, state.uncounted, state.last_count)


def _keep_own(kept: dict, common: dict, held: list[tuple]) -> tuple[dict, str]:
    """The state this survivor goes on from (its own kept model and optimizer, the agreed update,
    schedule position and frames), and the log line's account of it; ``held``: every survivor's
    :func:`_accounts` (by new rank)."""
    update = min(h[0] for h in held)
    counts = min(h[3] for h in held)
    at_count = []  # (synced_frames, this survivor's frames since) at the count all completed
    for _, _, _, c, synced, uncounted, (before, own) in held:
        if c - counts > 1:
            raise JobError(f"the survivors' frame counts are {c - counts} reductions apart; resume "
                           "from the last checkpoint", kind="timeout")
        at_count.append((synced, uncounted) if c == counts else (before, uncounted + own))
    bases = {b for b, _ in at_count}
    if len(bases) != 1:
        raise JobError(f"the survivors counted different frames at the same point ({sorted(bases)}); "
                       "resume from the last checkpoint", kind="timeout")
    base, since = bases.pop(), sum(n for _, n in at_count)
    optimizer = dict(kept["optimizer"])
    if optimizer.get("strategy_updates") is not None:
        optimizer["strategy_updates"] = min(h[1] for h in held)
    if optimizer["wrapper"].get("iteration") is not None:
        optimizer["wrapper"] = dict(optimizer["wrapper"], iteration=min(h[2] for h in held))
    snap = dict(common, model=kept["model"], optimizer=optimizer, update=update,
                frames=base + since)
    kept = ", ".join(str(h[0]) for h in held)
    how = (f"each survivor keeps its own model of its last completed update (updates {kept} on "
           f"the new ranks 0-{len(held) - 1}): {base} frames counted before the loss + {since} "
           "the survivors collected since; the lost ranks' uncounted frames are dropped")
    return snap, how
