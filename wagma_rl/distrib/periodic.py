"""The common part of the decentralised baselines: local PPO updates, a blocking global model
average every ``sync_period`` updates, and in between whatever the subclass does (D-PSGD's ring
gossip, nothing for local SGD)."""
from __future__ import annotations

import time

from mpi4py import MPI

from wagma_rl.job.deadline import DEFAULT_TIMEOUT

from .base import Strategy, SyncInfo

__all__ = ["PeriodicGlobalStrategy"]


class PeriodicGlobalStrategy(Strategy):
    """Full rollouts, a local PPO update, then :meth:`_between` on most updates and a global
    average on every ``sync_period``-th one (after which all replicas are identical).

    The global average is what makes the loop's synchronised points (statistics, checkpoints,
    stop signals) exist, as WAGMA's global sync does; with the same ``sync_period`` the modes
    share the same staleness bound. Waiting for the slowest is timed by a barrier before it.
    """

    def __init__(self, *, comm: MPI.Comm, sync_period: int, timeout: float = DEFAULT_TIMEOUT):
        if sync_period < 1:
            raise ValueError(f"distrib.sync_period must be >= 1, got {sync_period}")
        super().__init__(comm=comm, timeout=timeout)
        self.sync_period = sync_period
        self._updates = 0  # updates done, restored on resume (the global schedule continues)

    def after_update(self) -> SyncInfo:
        self._updates += 1
        if self._updates % self.sync_period == 0:
            wait = self._timed_barrier("the global average")
            t0 = time.perf_counter()
            self._global_average()
            return SyncInfo(synced=True, comm_s=time.perf_counter() - t0, wait_s=wait)
        wait, comm_s, group = self._between()
        return SyncInfo(synced=False, comm_s=comm_s, wait_s=wait, group=group)

    def _global_average(self) -> None:
        """The global average (bitwise identical replicas afterwards)."""
        self.optimizer.synchronize()

    def _between(self) -> tuple[float, float, tuple[int, ...]]:
        """The exchange between global averages: (wait s, communicate s, partners incl. self)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        state = self.optimizer.state_dict()
        state["strategy_updates"] = self._updates
        return state

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)
        self._updates = int(state.get("strategy_updates", 0))
