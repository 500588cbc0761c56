"""Distributed optimizers that wrap any ``torch.optim.Optimizer`` (one line to switch).

* :class:`WAGMA`: wait-avoiding group model averaging (the project's method).
* :class:`AllreduceSGD`: gradient averaging every step (what DDP does).
* :class:`LocalSGD`: synchronous model averaging every ``local_steps`` steps.
* :class:`DPSGD`: ring gossip with both neighbours every step.
* :class:`NonBlockingSGD`: gradient averaging that closes the round when the first rank finishes.
* :class:`NonBlockingDPSGD`: the same rounds on ring gossip (each rank's own gradient, then D-PSGD).

:class:`AveragingConfig` (``averaging:`` in both stacks' configs) checks a choice of these and
builds it.

Knows nothing of RL: imports torch, mpi4py, numpy and (for WAGMA/NonBlockingSGD) native_coll.
"""
from .allreduce_sgd import AllreduceSGD
from .base import DistributedOptimizer, OptimStats
from .dpsgd import DPSGD
from .local_sgd import LocalSGD
from .nonblocking_sgd import NonBlockingDPSGD, NonBlockingSGD, RoundResult
from .spec import AveragingConfig
from .wagma import WAGMA

__all__ = ["WAGMA", "AllreduceSGD", "LocalSGD", "DPSGD", "NonBlockingSGD", "NonBlockingDPSGD",
           "DistributedOptimizer",
           "OptimStats", "RoundResult", "build_optimizer", "AveragingConfig"]


def build_optimizer(name: str, optimizer, **kwargs) -> DistributedOptimizer:
    """Wrap ``optimizer`` in the distributed optimizer called ``name`` (as in config files).

    ``name`` is one of ``wagma``, ``allreduce``, ``local_sgd``, ``dpsgd``, ``nonblocking``,
    ``nonblocking_dpsgd``;
    ``kwargs`` are that class's keyword options.
    """
    classes = {"wagma": WAGMA, "allreduce": AllreduceSGD, "local_sgd": LocalSGD, "dpsgd": DPSGD,
               "nonblocking": NonBlockingSGD, "nonblocking_dpsgd": NonBlockingDPSGD}
    if name not in classes:
        raise ValueError(f"unknown distributed optimizer {name!r}; choose one of {sorted(classes)}")
    return classes[name](optimizer, **kwargs)
