"""The RL trainer's ``averaging:`` section: the averaging spec of both stacks
(:class:`wagma_rl.optim.AveragingConfig`) plus what only the trainer adds, DD-PPO's preemption
and the overlapped global average's synchronised points."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from wagma_rl.config import ConfigError, ranged
from wagma_rl.optim.spec import AveragingConfig

__all__ = ["TrainerAveragingConfig", "MODES"]

#: The trainer's averaging names (``averaging.name``).
MODES = ("wagma", "preempt", "allreduce", "dpsgd", "local_sgd")


@dataclass
class TrainerAveragingConfig(AveragingConfig):
    """How the workers of a DD-PPO run cooperate (``averaging:``): the optimizer averages once
    per ``local_steps`` PPO updates, never inside the update (except allreduce and preempt,
    which average gradients every mini-batch)."""

    RENAMED_VALUES: ClassVar[dict[str, dict[str, str]]] = {"name": {"localsgd": "local_sgd"}}
    LOCAL_SGD_STEPS: ClassVar[int] = 10

    name: Literal["wagma", "preempt", "allreduce", "dpsgd", "local_sgd"] = "wagma"
    """wagma: group model averaging; preempt: DD-PPO with preemption; allreduce: synchronous
    DD-PPO; dpsgd: ring gossip after every update (global every sync_period); local_sgd: local
    updates, a global average every local_steps updates. The names are the supervised jobs'."""
    overlap_sync_every: int = ranged(4, ">= 1")
    """wagma with global_mode=overlap: every n-th global average is followed by a blocking
    synchronisation, where statistics, stop signals and checkpoints are handled."""
    sync_frac: float = ranged(0.6, "(0, 1]")
    """preempt: fraction of workers that must have finished before stragglers stop."""
    short_rollout_frac: float = ranged(0.25, "[0, 1]")
    """preempt: fraction of its steps a worker must have done before it can be preempted."""

    def check(self, *, prefix: str = "averaging.") -> None:
        super().check(prefix=prefix)
        if self.background:
            raise ConfigError(f"config key '{prefix}background': the trainer averages between PPO "
                              "updates, where no forward or backward pass runs to overlap; "
                              f"leave {prefix}background false (it is for supervised jobs)")
        if self.name in ("allreduce", "preempt") and self.local_steps not in (None, 1):
            raise ConfigError(f"config key '{prefix}local_steps': {self.name} averages gradients "
                              f"every mini-batch; leave {prefix}local_steps empty")


def _sync_period_key(base, data: dict) -> str:
    """Where an old ``distrib.sync_period`` goes: Local SGD's period is ``local_steps`` now."""
    mode = (data.get("distrib") or {}).get("mode") or (data.get("averaging") or {}).get("name")
    if mode is None and base is not None:
        mode = base.averaging.name
    return "averaging.local_steps" if mode == "local_sgd" else "averaging.sync_period"


#: The RL config's ``distrib.*`` keys, read for one more release (a rename note each).
LEGACY_DISTRIB = {"distrib.mode": "averaging.name", "distrib.sync_period": _sync_period_key,
                  **{f"distrib.{k}": f"averaging.{k}" for k in (
                      "group_size", "late", "global_mode", "overlap_sync_every", "outer",
                      "outer_lr", "outer_momentum", "global_precision", "sync_frac",
                      "short_rollout_frac", "timeout")}}
