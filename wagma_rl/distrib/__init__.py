"""How workers of a DD-PPO job cooperate: one strategy object the training loop calls at two points.

The ``averaging:`` section (:class:`TrainerAveragingConfig`, the averaging spec both stacks share
plus what the trainer adds) names the optimizer of ``wagma_rl.optim``; :func:`build_strategy`
gives the strategy that calls it:

* :class:`AveragingStrategy` (wagma, local_sgd, dpsgd, allreduce): full rollouts, then the
  optimizer averages once every ``local_steps`` PPO updates (allreduce: gradients every
  mini-batch; see the class for each name's synchronised points).
* :class:`PreemptStrategy` (``preempt``): DD-PPO as published: gradients averaged every
  mini-batch, stragglers preempted once ``sync_frac`` of the workers have finished.
"""
from __future__ import annotations

from mpi4py import MPI

from .average import AveragingStrategy
from .base import Strategy, SyncInfo
from .counter import FinishedCounter
from .preempt import PreemptStrategy
from .spec import MODES, TrainerAveragingConfig

__all__ = ["Strategy", "SyncInfo", "AveragingStrategy", "PreemptStrategy", "FinishedCounter",
           "TrainerAveragingConfig", "build_strategy", "MODES"]


def build_strategy(spec: TrainerAveragingConfig, *, comm: MPI.Comm | None = None) -> Strategy:
    """The strategy ``spec`` names, on ``comm`` (default COMM_WORLD); every wait for other
    workers is bounded by ``spec.timeout`` seconds. Collective."""
    comm = MPI.COMM_WORLD if comm is None else comm
    if spec.name not in MODES:
        raise ValueError(f"unknown averaging.name {spec.name!r} for the RL trainer; choose one of "
                         f"{list(MODES)}")
    if spec.name == "preempt":
        return PreemptStrategy(spec, comm=comm)
    return AveragingStrategy(spec, comm=comm)
