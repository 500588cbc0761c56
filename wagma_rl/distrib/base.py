"""The interface every distributed strategy implements (see :class:`Strategy`)."""
from __future__ import annotations

import dataclasses
import time

import torch
from mpi4py import MPI

from wagma_rl.bounded_comm import DEFAULT_TIMEOUT, BoundedComm

__all__ = ["Strategy", "SyncInfo"]


@dataclasses.dataclass
class SyncInfo:
    """What the strategy did around one update (returned by :meth:`Strategy.after_update`)."""

    synced: bool
    """True when every replica now holds identical parameters and all ranks are at the same update
    (a safe point to reduce statistics, checkpoint, or stop)."""
    comm_s: float = 0.0
    """Seconds spent moving data (gradient or model averaging), excluding waiting for peers."""
    wait_s: float = 0.0
    """Seconds spent waiting for other workers (the end-of-rollout barrier, a blocking global sync)."""
    stats_point: bool = False
    """True when every worker passes this update without waiting for the others and without
    synced replicas (WAGMA's overlapped global average): statistics are reduced here without a
    barrier and collected at the next such point."""
    rollout_wait_s: float = 0.0
    """The part of ``wait_s`` spent at the end of the rollout, inside :meth:`Strategy.collect_more`
    (the loop takes it out of the collection time)."""
    staleness: float = 0.0
    """WAGMA: how many iterations old the stale contributions in the last average were."""
    stale: int = 0
    """WAGMA: how many contributions in the last average were stale (taken from workers that had
    not arrived), 0 when all were fresh."""
    late: bool = False
    """WAGMA: whether this rank's own contribution was stale (it arrived after its group started)."""
    group: tuple[int, ...] = ()
    """The ranks this worker averaged with at this update (itself included); empty for a global
    average or for gradient averaging (everyone)."""
    preempted: bool = False
    """Whether this worker's rollout was cut short by preemption."""


class Strategy:
    """One distributed strategy. The loop calls it at setup and at two points per update:

    * :meth:`wrap_optimizer` once: the optimizer the PPO update steps;
    * :meth:`collect_more` after every environment step: False ends this worker's rollout;
    * :meth:`after_update` after the local PPO update: averages models if the strategy does so.
    """

    name = "base"

    def __init__(self, *, comm: MPI.Comm, timeout: float = DEFAULT_TIMEOUT):
        # Private communicators (our barriers never match the user's messages), and every wait
        # on them bounded by ``timeout`` (wagma_rl.bounded_comm).
        self.deadline = BoundedComm(comm, timeout=timeout)
        self.timeout = self.deadline.timeout
        self.comm = self.deadline.comm
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        self.optimizer = None
        self._preempted = False
        self._wait_s = 0.0

    # ------------------------------------------------------------------ setup
    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, *, buffers=None):
        """Wrap the local torch optimizer; collective (rank 0's parameters are broadcast)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ hook 1: during the rollout
    def collect_more(self, steps_done: int, num_steps: int) -> bool:
        """Called after each environment step; return False to end this worker's rollout."""
        if steps_done >= num_steps:
            self._finish_rollout(steps_done, preempted=False)
            return False
        return True

    def end_rollout(self, steps_done: int, num_steps: int) -> None:
        """The collector ended this worker's rollout itself, before :meth:`collect_more` did (VER's
        cut-off): account it as a finished rollout of ``steps_done`` (per-env mean) steps."""
        self._finish_rollout(steps_done, preempted=False)

    def _finish_rollout(self, steps_done: int, *, preempted: bool) -> None:
        self._preempted = preempted

    # ------------------------------------------------------------------ hook 2: after the update
    def after_update(self) -> SyncInfo:
        """Called after the local PPO update; returns what happened (see :class:`SyncInfo`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the rest
    def synchronize(self) -> None:
        """Make every replica identical now (collective; all ranks at the same update)."""
        self.optimizer.synchronize()

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)

    def _timed_barrier(self, what: str) -> float:
        t0 = time.perf_counter()
        self.deadline.barrier(what)
        return time.perf_counter() - t0

    def close(self) -> None:
        """Release communicators (collective, bounded)."""
        if self.optimizer is not None:
            self.optimizer.close()
            self.optimizer = None
        self.deadline.free()
