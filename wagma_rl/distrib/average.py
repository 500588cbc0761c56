"""The trainer's one generic strategy: any optimizer of ``wagma_rl.optim``, built from the
``averaging:`` spec, called once per PPO update."""
from __future__ import annotations

import dataclasses
import time

from mpi4py import MPI

from .base import Strategy, SyncInfo

__all__ = ["AveragingStrategy"]

#: Names whose optimizer averages gradients inside every mini-batch step (the rest average models).
GRADIENT_AVERAGING = ("allreduce", "preempt")


class AveragingStrategy(Strategy):
    """The optimizer ``spec.build`` gives, and when it averages.

    * allreduce: gradients are averaged every mini-batch, so the replicas stay identical; every
      worker collects ``num_steps`` steps and the first gradient average waits for the slowest,
      measured by a barrier at the end of the rollout (shown as ``wait``, not ``communicate``).
    * wagma, local_sgd, dpsgd: the whole PPO update is local; every ``local_steps``-th update
      the optimizer averages once. wagma: a wait-avoiding group average, or every
      ``sync_period``-th one a global one (with ``global_mode="overlap"``, every
      ``overlap_sync_every``-th global one is followed by a blocking :meth:`synchronize`: the
      loop's synchronised point). local_sgd: a blocking global average. dpsgd: ring gossip
      with both neighbours, and every ``sync_period``-th average a global one (the staleness
      bound WAGMA's global sync gives). A blocking global average is timed after a barrier
      (the wait for the slowest) and is the loop's synchronised point (statistics,
      checkpoints, stop signals).
    """

    def __init__(self, spec, *, comm: MPI.Comm):
        super().__init__(comm=comm, timeout=spec.timeout)
        self.spec = spec
        self.name = spec.name
        self.models = spec.name not in GRADIENT_AVERAGING
        self.every = spec.steps_per_average() if self.models else 1
        self._updates = 0  # updates done, restored on resume (the schedule continues)
        self._comm_before = 0.0

    def wrap_optimizer(self, optimizer, *, buffers=None):
        # local_steps=0: the PPO mini-batch steps stay local; after_update() averages. Preempt
        # steps AllreduceSGD (its own part is when a rollout ends).
        spec = dataclasses.replace(self.spec, name="allreduce") if self.name == "preempt" else self.spec
        self.optimizer = spec.build(optimizer, comm=self.comm, buffers=buffers,
                                    local_steps=0 if self.models else None)
        return self.optimizer

    def _finish_rollout(self, steps_done: int, *, preempted: bool) -> None:
        super()._finish_rollout(steps_done, preempted=preempted)
        if not self.models:
            self._wait_s = self._timed_barrier("end of rollout")
            self._comm_before = self.optimizer.stats.comm_time_s

    def after_update(self) -> SyncInfo:
        if not self.models:  # gradient averaging kept the replicas identical
            comm_s = self.optimizer.stats.comm_time_s - self._comm_before
            return SyncInfo(synced=True, comm_s=comm_s, wait_s=self._wait_s,
                            rollout_wait_s=self._wait_s, preempted=self._preempted)
        self._updates += 1
        if self._updates % self.every:
            return SyncInfo(synced=False, group=(self.rank,))
        if self.name == "wagma":
            return self._wagma_average()
        if self.name == "local_sgd" or (self._updates // self.every) % self.spec.sync_period == 0:
            wait = self._timed_barrier("the global average")
            t0 = time.perf_counter()
            self._global_average()
            return SyncInfo(synced=True, comm_s=time.perf_counter() - t0, wait_s=wait)
        return self._gossip()

    def _global_average(self) -> None:
        # With an outer optimizer or a 16-bit wire the global average is LocalSGD.average(),
        # which takes the outer step and sends 16 bits; synchronize() stays the plain float32
        # average (as for evaluation).
        if self.name == "local_sgd" and (self.spec.outer or self.spec.global_precision != "fp32"):
            self.optimizer.average()
        else:
            self.optimizer.synchronize()

    def _gossip(self) -> SyncInfo:
        peers = self.optimizer.neighbours
        # A zero-byte handshake first, so waiting for a slow neighbour is timed apart from the
        # model transfer that follows.
        t0 = time.perf_counter()
        reqs = [self.comm.Irecv([None, 0, MPI.BYTE], source=p, tag=29) for p in peers]
        reqs += [self.comm.Isend([None, 0, MPI.BYTE], dest=p, tag=29) for p in peers]
        self.deadline.wait(reqs, peers=peers, what="the ring neighbours' handshake")
        t1 = time.perf_counter()
        self.optimizer.average()
        return SyncInfo(synced=False, comm_s=time.perf_counter() - t1, wait_s=t1 - t0,
                        group=tuple(sorted([self.rank, *peers])))

    def _wagma_average(self) -> SyncInfo:
        t0 = time.perf_counter()
        info = self.optimizer.average()
        # The global average first waits for the slowest worker (in the optimizer's bounded
        # finiteness agreement, so a worker that found NaN meets the others there): report that
        # wait apart from moving the model.
        wait = self.optimizer.last_arrival_wait_s
        if info is None:
            # The average was refused (a non-finite contribution, nonfinite="drop"): nothing was
            # averaged, so this is no point at which the replicas agree.
            return SyncInfo(synced=False, comm_s=time.perf_counter() - t0 - wait, wait_s=wait)
        synced = info.kind == "global"
        stats_point = False
        if synced and self.spec.global_mode == "overlap":
            # The schedule position, not a counter, decides: a resumed run keeps the same points.
            period = self.spec.sync_period
            synced = (info.iteration + 1) // period % self.spec.overlap_sync_every == 0
            if synced:
                # Synchronising first waits for every worker to arrive: report that as waiting.
                t1 = time.perf_counter()
                self.optimizer.synchronize()
                wait += time.perf_counter() - t1
            stats_point = not synced
        return SyncInfo(synced=synced, stats_point=stats_point,
                        comm_s=time.perf_counter() - t0 - wait, wait_s=wait,
                        staleness=float(info.staleness), stale=len(info.stale),
                        late=self.rank in info.stale,
                        group=() if info.kind == "global" else tuple(info.group))

    def state_dict(self) -> dict:
        state = self.optimizer.state_dict()
        state["strategy_updates"] = self._updates
        return state

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)
        self._updates = int(state.get("strategy_updates", 0))
