"""How workers of a DD-PPO job cooperate: one strategy object the training loop calls at two points.

* :class:`WagmaStrategy` (``distrib.mode=wagma``): full rollouts, local PPO update, then one
  wait-avoiding group model average (global every ``sync_period`` updates, blocking or
  overlapped: ``global_mode``).
* :class:`PreemptStrategy` (``preempt``): DD-PPO as published: gradients averaged every
  mini-batch, stragglers preempted once ``sync_frac`` of the workers have finished.
* :class:`AllreduceStrategy` (``allreduce``): synchronous DD-PPO, everyone waits for the slowest.
* :class:`DpsgdStrategy` (``dpsgd``) and :class:`LocalSgdStrategy` (``local_sgd``): the WAGMA
  paper's decentralised baselines; local PPO updates, then ring gossip (D-PSGD) or nothing (local
  SGD), and a global model average every ``sync_period`` updates.
"""
from __future__ import annotations

from mpi4py import MPI

from .allreduce import AllreduceStrategy
from .base import Strategy, SyncInfo
from .counter import FinishedCounter
from .dpsgd import DpsgdStrategy
from .local_sgd import LocalSgdStrategy
from .preempt import PreemptStrategy
from .wagma import WagmaStrategy

__all__ = ["Strategy", "SyncInfo", "WagmaStrategy", "PreemptStrategy", "AllreduceStrategy",
           "DpsgdStrategy", "LocalSgdStrategy", "FinishedCounter", "make_strategy", "MODES"]

MODES = ("wagma", "preempt", "allreduce", "dpsgd", "local_sgd")


def make_strategy(mode: str, *, comm: MPI.Comm | None = None, group_size: int = 2,
                  sync_period: int = 10, late: str = "apply", global_mode: str = "blocking",
                  overlap_sync_every: int = 4, sync_frac: float = 0.6,
                  short_rollout_frac: float = 0.25, timeout: float = 300.0,
                  outer: str | None = None, outer_lr: float = 0.7,
                  outer_momentum: float = 0.9, global_precision: str = "fp32") -> Strategy:
    """Build the strategy for ``mode`` (one of :data:`MODES`) on ``comm`` (default COMM_WORLD);
    every wait for other workers is bounded by ``timeout`` seconds. ``outer*``: the outer
    optimizer on the global average (wagma and local_sgd; see ``wagma_rl.optim.outer``);
    ``global_precision``: what the global average sends (wagma and local_sgd; see
    ``wagma_rl.optim.precision``)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    outer_kw = dict(outer=outer, outer_lr=outer_lr, outer_momentum=outer_momentum,
                    global_precision=global_precision)
    if mode == "wagma":
        return WagmaStrategy(comm=comm, group_size=group_size, sync_period=sync_period, late=late,
                             global_mode=global_mode, overlap_sync_every=overlap_sync_every,
                             timeout=timeout, **outer_kw)
    if mode == "preempt":
        return PreemptStrategy(comm=comm, sync_frac=sync_frac, short_rollout_frac=short_rollout_frac,
                               timeout=timeout)
    if mode == "allreduce":
        return AllreduceStrategy(comm=comm, timeout=timeout)
    if mode == "dpsgd":
        return DpsgdStrategy(comm=comm, sync_period=sync_period, timeout=timeout)
    if mode == "local_sgd":
        return LocalSgdStrategy(comm=comm, sync_period=sync_period, timeout=timeout, **outer_kw)
    raise ValueError(f"unknown distrib.mode {mode!r}; choose one of {list(MODES)}")
