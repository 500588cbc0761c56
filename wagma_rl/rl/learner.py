"""The learner of a DD-PPO run: the policy, the distributed strategy and its optimizer, built
(collectively) at the start, at a resume and after a shrink in place, and where the run starts."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from mpi4py import MPI

from wagma_rl.distrib import Strategy, build_strategy
from wagma_rl.job.tblog import RunLogger

from .config import DDPPOConfig
from .setup import build_policy, seed_everything, set_rng_state

__all__ = ["build_learner", "Start"]


def build_learner(cfg: DDPPOConfig, comm: MPI.Comm, device: torch.device, ckpt: dict | None,
                   ckpt_path: Path | None, log: RunLogger, *, restored: str | None = None):
    """The policy, the strategy and its optimizer (collective: rank 0's parameters are broadcast),
    restored from ``ckpt`` when resuming. Returns them and where the run starts (a
    :class:`Start`). ``restored``: where ``ckpt`` came from when it is not the file
    ``ckpt_path`` (the log line says so)."""
    rank, world = comm.Get_rank(), comm.Get_size()
    seed_everything(cfg.run.seed + 1000 * rank)
    policy = build_policy(cfg, device)
    if ckpt is not None:  # (it fits: rank 0 checked it when it chose it, resume_problem)
        policy.load_state_dict(ckpt["model"])
    inner = torch.optim.Adam(policy.parameters(), lr=cfg.ppo.lr, eps=cfg.ppo.eps)
    for line in cfg.averaging.notes(world):  # e.g. a group larger than the job is the job
        log.info(line)
    strategy: Strategy = build_strategy(cfg.averaging, comm=comm)
    optimizer = strategy.wrap_optimizer(inner)

    start = Start(update=0, frames=0, wall_before=0.0)
    if ckpt is not None:
        strategy.load_state_dict(ckpt["optimizer"])
        for group in optimizer.param_groups:  # the config, not the checkpoint, sets the rate
            group["lr"] = cfg.ppo.lr
        start = Start(update=int(ckpt["update"]), frames=int(ckpt["frames"]),
                       wall_before=float(ckpt["wall_s"]))
        rngs = ckpt.get("rng") or []
        if len(rngs) == world:
            set_rng_state(rngs[rank])
        else:  # another world size: fresh streams, still different per rank and per resume
            seed_everything(cfg.run.seed + 1000 * rank + start.update)
        log.info(f"resumed from {restored or ckpt_path}: update {start.update}, frames {start.frames}")
    return policy, strategy, optimizer, start


@dataclasses.dataclass(frozen=True)
class Start:
    """Where this call's training starts (from a checkpoint, or zeros)."""

    update: int
    frames: int
    wall_before: float
