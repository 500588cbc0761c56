"""The averaging spec: how the ranks of a job average, the ``averaging:`` section of both the RL and
the supervised configs, with one :meth:`AveragingConfig.check` and one :meth:`AveragingConfig.build`.

Both stacks hold this dataclass (the RL trainer a subclass with what only it adds:
``wagma_rl.distrib.spec``), so a setting has one name, one default, one range and one place that
turns it into the distributed optimizer of this package::

    spec = load_config(SupervisedConfig, "configs/resnet_shapes.yaml").averaging
    opt = spec.build(torch.optim.SGD(model.parameters(), lr=0.1), comm=MPI.COMM_WORLD)

Knows nothing of RL (``wagma_rl.optim`` never imports it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Iterable, Literal

import torch
from mpi4py import MPI

from wagma_rl.config import ConfigError, ranged
from wagma_rl.bounded_comm import DEFAULT_TIMEOUT

__all__ = ["AveragingConfig", "GLOBAL_AVERAGES", "BACKGROUND", "LEGACY_OPTIM_KEYS"]

#: The optimizers with global model averages (where ``outer`` and ``global_precision`` act).
GLOBAL_AVERAGES = ("wagma", "local_sgd")
#: The optimizers whose model averages can run in the background (``averaging.background``).
BACKGROUND = ("wagma", "local_sgd", "dpsgd")

#: Keys of the supervised ``optim:`` section that moved to ``averaging:`` in this release (read
#: for one more release, with a rename note).
LEGACY_OPTIM_KEYS = ("name", "group_size", "sync_period", "local_steps", "late", "global_mode",
                     "outer", "outer_lr", "outer_momentum", "global_precision", "bucket_mb",
                     "background", "micro_batches", "timeout", "average_buffers")


@dataclass
class AveragingConfig:
    """How the ranks average (``averaging:``); every setting names the optimizers it acts on."""

    #: local_sgd's ``local_steps`` when the field is empty (the RL subclass sets its own).
    LOCAL_SGD_STEPS: ClassVar[int] = 4

    name: Literal["wagma", "allreduce", "local_sgd", "dpsgd", "nonblocking",
                  "nonblocking_dpsgd"] = "wagma"
    """wagma: wait-avoiding group model averaging; allreduce: gradients averaged every step;
    local_sgd: a global model average every local_steps steps; dpsgd: ring gossip with both
    neighbours; nonblocking, nonblocking_dpsgd: micro-batch gradient rounds closed by the first
    rank (docs/optimizers.md). The RL trainer adds preempt."""
    group_size: int = ranged(2, ">= 1")
    """wagma: ranks per averaging group; a job with fewer ranks averages in groups of all of them
    (its log says so); when it does not divide the number of ranks, the groups hold between
    group_size and 2*group_size - 1 ranks (native_coll.group_of)."""
    sync_period: int = ranged(10, ">= 1")
    """wagma (and dpsgd in the RL trainer): every sync_period-th model average is global."""
    local_steps: int | None = ranged(None, ">= 1")
    """wagma, local_sgd, dpsgd: steps between model averages (optimizer steps in a supervised
    job, PPO updates in the RL trainer); empty: local_sgd's default (4 in a supervised job, 10
    in the RL trainer), 1 for the others (steps_per_average() resolves it)."""
    late: Literal["apply", "merge"] = "apply"
    """wagma: what a rank gets whose group averaged with its stale model (it was still working
    when its group averaged). apply: the result plus all its progress since then (the sum of
    the models is conserved: nobody's progress is lost); merge: the result plus that progress
    divided by the group size (what it would have got on time, but its partners never see the
    rest; docs/optimizers.md#why-plain-wagma-lost-on-the-transformer)."""
    global_mode: Literal["blocking", "overlap"] = "blocking"
    """wagma: blocking: every rank waits for the slowest at the global average (replicas then
    identical); overlap: the global average completes in the background and each rank keeps
    its own progress on top of it (no wait; docs/overlap.md)."""
    outer: Literal["nesterov"] | None = None
    """wagma, local_sgd: an outer optimizer on every global average (DiLoCo): nesterov takes a
    Nesterov-momentum step on the change since the last global model; empty: the plain average
    (docs/optimizers.md#outer-optimizer-on-the-global-average-outernesterov)."""
    outer_lr: float = ranged(0.7, "> 0")
    """wagma, local_sgd with outer=nesterov: the outer learning rate (1 with momentum 0 is the
    plain average)."""
    outer_momentum: float = ranged(0.9, "[0, 1)")
    """wagma, local_sgd with outer=nesterov: the outer momentum."""
    global_precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """wagma, local_sgd: what the global model averages send: fp32, or 16-bit pseudo-gradients
    (the model minus the last global model, rounded to nearest even), half the bytes
    (docs/optimizers.md#low-precision-global-exchange)."""
    bucket_mb: float | None = ranged(None, ">= 0")
    """allreduce: MiB of gradients per bucket averaged while the backward pass runs (as DDP's
    bucket_cap_mb; 0: one allreduce after the backward pass); nonblocking, nonblocking_dpsgd: MiB
    of each micro-batch's gradients copied out per bucket while the backward pass runs (0: one
    copy after it). Empty: 25 on cuda, 0 on cpu."""
    exchange: Literal["auto", "mpi", "node"] = "auto"
    """allreduce (and preempt in the RL trainer): how the gradients move between ranks. mpi:
    MPI's allreduce of a host copy (GPU gradients go to the host and back); node: the ranks of a
    node map each other's buffers and each adds its share of them in place (GPU memory through
    CUDA IPC, an MPI shared window on cpu), once after the backward pass, without buckets;
    across nodes (as many ranks on each) the node sums' chunks go between nodes by MPI; auto:
    node where the ranks of each node share one GPU and bucket_mb is empty, else mpi
    (docs/optimizers.md#gradients-summed-in-shared-memory-exchangenode)."""
    background: bool = False
    """wagma, local_sgd, dpsgd: run each model average on a thread while the next forward and
    backward pass compute (docs/optimizers.md#model-averaging-in-the-background); refused for the
    others."""
    micro_batches: int = ranged(4, ">= 1")
    """nonblocking, nonblocking_dpsgd: micro-batches per batch (keep batch_size / micro_batches
    at 16 or more on a CPU: smaller ones compute several times slower per sample)."""
    average_buffers: bool = True
    """Average the model's buffers (BatchNorm running statistics) with its parameters."""
    timeout: float = ranged(DEFAULT_TIMEOUT, "> 0")
    """Seconds any wait for other ranks may last before the unresponsive ones are reported and
    the job stops (docs/faults.md)."""

    # ------------------------------------------------------------------ check
    def check(self, *, prefix: str = "averaging.") -> None:
        """Refuse settings that do not go together (a ConfigError naming the key); the range of
        each key is declared beside its field and checked when the config loads."""
        def bad(key: str, why: str) -> None:
            raise ConfigError(f"config key '{prefix}{key}': {why}")
        if self.outer and self.name not in GLOBAL_AVERAGES:
            bad("outer", f"an outer optimizer steps on the global model averages of "
                f"{prefix}name wagma or local_sgd; {self.name} has none: leave {prefix}outer empty")
        if self.global_precision != "fp32" and self.name not in GLOBAL_AVERAGES:
            bad("global_precision", f"the 16-bit wire carries the global model averages of "
                f"{prefix}name wagma or local_sgd; {self.name} has none: leave it fp32")
        if self.exchange == "node" and self.name not in ("allreduce", "preempt"):
            bad("exchange", f"exchange={self.exchange} is how {prefix}name allreduce (and the RL "
                f"trainer's preempt) moves its gradients; {self.name} averages otherwise: leave "
                "it auto or mpi")
        if self.exchange == "node" and self.bucket_mb:
            bad("bucket_mb", f"{prefix}exchange=node sums the gradients once after the backward "
                "pass, without buckets: leave it empty or 0")
        if self.background and self.name not in BACKGROUND:
            bad("background", f"background averages are the model averages of {prefix}name "
                f"{', '.join(BACKGROUND)}; {self.name} averages gradients inside its step: "
                f"leave {prefix}background false")

    def steps_per_average(self) -> int:
        """``local_steps``, or when it is empty the default of optimizer ``name``."""
        if self.local_steps is not None:
            return self.local_steps
        return self.LOCAL_SGD_STEPS if self.name == "local_sgd" else 1

    def notes(self, world_size: int, *, prefix: str = "averaging.") -> list[str]:
        """Lines for the run's log about what this spec becomes on ``world_size`` ranks."""
        if self.name == "wagma" and self.group_size > world_size:
            return [f"{prefix}group_size={self.group_size} is larger than the job ({world_size} "
                    f"rank{'s' if world_size > 1 else ''}): WAGMA averages in groups of {world_size}"]
        return []

    # ------------------------------------------------------------------ build
    def options(self, *, world_size: int, local_steps: int | None = None) -> dict:
        """The keyword options of the distributed optimizer ``name`` on ``world_size`` ranks
        (``local_steps``: in place of :meth:`steps_per_average`, e.g. 0 where the caller
        decides when to average)."""
        steps = self.steps_per_average() if local_steps is None else local_steps
        outer = dict(outer=self.outer, outer_lr=self.outer_lr, outer_momentum=self.outer_momentum,
                     global_precision=self.global_precision)
        buckets = dict(bucket_bytes=None if self.bucket_mb is None else int(self.bucket_mb * 2**20))
        # timeout bounds every wait for other ranks, in every optimizer (docs/faults.md).
        return {"wagma": dict(group_size=min(self.group_size, world_size),
                              sync_period=self.sync_period, local_steps=steps, late=self.late,
                              global_mode=self.global_mode, timeout=self.timeout,
                              background=self.background, **outer),
                "allreduce": dict(timeout=self.timeout, exchange=self.exchange, **buckets),
                "local_sgd": dict(local_steps=steps, timeout=self.timeout,
                                  background=self.background, **outer),
                "dpsgd": dict(local_steps=steps, timeout=self.timeout, background=self.background),
                "nonblocking": dict(micro_batches=self.micro_batches, timeout=self.timeout,
                                    **buckets),
                "nonblocking_dpsgd": dict(micro_batches=self.micro_batches, timeout=self.timeout,
                                          **buckets)}[self.name]

    def build(self, optimizer: torch.optim.Optimizer, *, comm: MPI.Comm,
              buffers: Iterable[torch.Tensor] | None = None, local_steps: int | None = None,
              prefix: str = "averaging."):
        """Wrap the plain torch ``optimizer`` in the distributed optimizer this spec names, over
        ``comm`` (collective: rank 0's parameters are broadcast). ``buffers`` are averaged with
        the parameters when ``average_buffers`` is on; ``local_steps``: as :meth:`options`. A
        setting the optimizer refuses is a ConfigError naming the key (every rank refuses the
        same spec alike, so none is left waiting)."""
        from . import build_optimizer

        kw = self.options(world_size=comm.Get_size(), local_steps=local_steps)
        if buffers is not None and self.average_buffers:
            buffers = list(buffers)
            if buffers:
                kw["buffers"] = buffers
        try:
            return build_optimizer(self.name, optimizer, comm=comm, **kw)
        except ValueError as exc:
            named = [k for k in kw if re.search(rf"\b{k}\b", str(exc))]
            where = f"config key '{prefix}{named[0]}'" if named else f"{prefix}name={self.name}"
            raise ConfigError(f"{where}: {exc}") from None
