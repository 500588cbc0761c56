"""Multi-rank specification of WAGMA, NonBlockingSGD and NonBlockingDPSGD (run on every rank under mpiexec).

Launched by tests/test_optim_mpi.py at 2, 3 and 4 ranks. Timing-based cases use sleeps far longer
than a step so that they hold on a loaded machine.
"""
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI

from wagma_rl.optim import WAGMA, NonBlockingDPSGD, NonBlockingSGD
from wagma_rl.optim.finite import NonFiniteError

torch.set_num_threads(1)


def vector_model(value: float, n: int = 5) -> torch.nn.Module:
    m = torch.nn.Linear(n, 1, bias=False)
    with torch.no_grad():
        m.weight.fill_(value)
    return m


def weights(model) -> np.ndarray:
    return model.weight.detach().reshape(-1).numpy().copy()


def sgd_to(model, opt, target: float) -> None:
    """One local lr=1 SGD step that moves every weight from its value to ``target``."""
    model.weight.grad = model.weight.detach() - target
    opt.step()


class TestWAGMA:
    COMM = MPI.COMM_WORLD

    def test_global_step_gives_bitwise_identical_mean(self):
        size, rank = self.COMM.size, self.COMM.rank
        model = vector_model(0.0)
        opt = WAGMA(torch.optim.SGD(model.parameters(), lr=1.0), group_size=2, sync_period=1,
                    comm=self.COMM)
        assert opt.is_global()
        sgd_to(model, opt, 12.0 * rank + 0.25)
        assert opt.stats.info.kind == "global"
        w = weights(model)
        assert all(np.array_equal(w, other) for other in self.COMM.allgather(w))
        np.testing.assert_allclose(w, np.float32(sum(12.0 * r + 0.25 for r in range(size)) / size), rtol=1e-6)
        opt.close()

    def test_group_step_averages_within_the_documented_group(self):
        rank = self.COMM.rank
        model = vector_model(0.0)
        opt = WAGMA(torch.optim.SGD(model.parameters(), lr=1.0), group_size=2, sync_period=100,
                    local_steps=0, comm=self.COMM)
        group = opt.group()
        assert rank in group and not opt.is_global()
        sgd_to(model, opt, 12.0 * rank)
        opt.publish()  # every contribution is fresh, so lateness cannot change the result
        self.COMM.Barrier()
        info = opt.average()
        assert info.kind == "group" and tuple(info.group) == group
        np.testing.assert_allclose(weights(model), np.mean([12.0 * r for r in group]), rtol=1e-6)
        everyone = self.COMM.allgather((group, weights(model)))
        for g, w in everyone:
            if g == group:
                assert np.array_equal(w, weights(model))
        opt.close()

    def test_sleeping_rank_does_not_slow_group_steps_until_the_global_step(self):
        size, rank = self.COMM.size, self.COMM.rank
        slow = size - 1
        nap, group_steps = 1.0, 2
        model = vector_model(float(rank))
        opt = WAGMA(torch.optim.SGD(model.parameters(), lr=1.0), group_size=2,
                    sync_period=group_steps + 1, comm=self.COMM)
        self.COMM.Barrier()
        t0 = time.perf_counter()
        for _ in range(group_steps):
            if rank == slow:
                time.sleep(nap)
            sgd_to(model, opt, float(rank))
            assert opt.stats.info.kind == "group"
        group_time = time.perf_counter() - t0
        sgd_to(model, opt, float(rank))  # the global step: everyone waits for the slow rank here
        assert opt.stats.info.kind == "global"
        total = time.perf_counter() - t0
        times = self.COMM.allgather((group_time, total))
        for r, (g, t) in enumerate(times):
            if r != slow:
                assert g < nap, f"rank {r} waited {g:.2f}s in group steps for a rank sleeping {nap}s per step"
                assert t >= group_steps * nap * 0.9, f"rank {r} did not wait at the global step"
        w = weights(model)
        assert all(np.array_equal(w, other) for other in self.COMM.allgather(w))
        opt.close()

    def test_late_apply_keeps_a_late_ranks_whole_local_step(self):
        size, rank = self.COMM.size, self.COMM.rank
        if size == 1:
            pytest.skip("needs two ranks")
        late = size - 1
        on_time = self.COMM.Split(0 if rank != late else 1, rank)
        model = vector_model(0.0)  # the wrapper starts every rank from rank 0's model anyway
        opt = WAGMA(torch.optim.SGD(model.parameters(), lr=1.0), group_size=size, sync_period=100,
                    local_steps=0, late="apply", comm=self.COMM)
        if rank == late:
            for src in range(size - 1):
                self.COMM.recv(source=src, tag=31)
            sgd_to(model, opt, 100.0)  # a local step the group averaged without
            info = opt.average()
            assert late in info.stale
        else:
            sgd_to(model, opt, 12.0 * rank)
            opt.publish()  # so an on-time rank's contribution is its new model whoever starts
            on_time.Barrier()
            opt.average()
            self.COMM.send("done", dest=late, tag=31)
        R = sum(12.0 * r for r in range(size - 1)) / size  # the late rank stood in with 0.0
        np.testing.assert_allclose(weights(model), R + 100.0 if rank == late else R, rtol=1e-6)
        # The models' sum holds every rank's local step: none was lost to lateness.
        total = self.COMM.allreduce(float(weights(model)[0]))
        np.testing.assert_allclose(total, sum(12.0 * r for r in range(size - 1)) + 100.0, rtol=1e-6)
        on_time.Free()
        opt.close()

    def test_unknown_late_rule_raises(self):
        model = vector_model(0.0)
        with pytest.raises(ValueError, match="late must be"):
            WAGMA(torch.optim.SGD(model.parameters(), lr=1.0), group_size=1, sync_period=2,
                  late="drop", comm=self.COMM)

    def test_synchronize_makes_replicas_bitwise_identical(self):
        model = vector_model(0.0)
        opt = WAGMA(torch.optim.SGD(model.parameters(), lr=1.0), group_size=2, sync_period=50,
                    comm=self.COMM)
        sgd_to(model, opt, 1.0 + self.COMM.rank / 3)
        opt.synchronize()
        w = weights(model)
        assert all(np.array_equal(w, other) for other in self.COMM.allgather(w))
        opt.close()

    def test_state_dict_round_trip_continues_the_schedule(self):
        model = vector_model(0.0)
        make = lambda: WAGMA(torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9), group_size=2,
                             sync_period=3, local_steps=2, comm=self.COMM)
        opt = make()
        for _ in range(5):  # two averages (after steps 2 and 4), one step towards the third
            sgd_to(model, opt, float(self.COMM.rank))
        saved = opt.state_dict()
        opt.close()
        resumed = make()
        resumed.load_state_dict(saved)
        assert resumed.iteration == 2 and resumed.is_global()
        assert resumed.stats.steps == 5
        sgd_to(model, resumed, float(self.COMM.rank))  # step 6 completes local_steps: a global average
        assert resumed.stats.info.kind == "global" and resumed.iteration == 3
        resumed.close()

    def test_lr_scheduler_steps_the_wrapped_learning_rate(self):
        model = vector_model(0.0)
        base = torch.optim.SGD(model.parameters(), lr=0.5)
        opt = WAGMA(base, group_size=2, sync_period=4, comm=self.COMM)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
        sgd_to(model, opt, 1.0)
        sched.step()
        assert base.param_groups[0]["lr"] == pytest.approx(0.05)
        opt.close()

    def test_group_size_larger_than_world_raises_on_every_rank(self):
        model = vector_model(0.0)
        with pytest.raises(ValueError, match="does not fit"):
            WAGMA(torch.optim.SGD(model.parameters(), lr=1.0), group_size=self.COMM.size + 1,
                  sync_period=2, comm=self.COMM)


class TestWAGMANonFinite:
    """A NaN in one rank's model never reaches another rank's (the native collective refuses
    every average it reaches), and the ranks agree on it: every rank raises the same
    NonFiniteError naming the rank and step, or with ``nonfinite="drop"`` training goes on."""

    COMM = MPI.COMM_WORLD

    def train(self, *, nan_at: int, global_mode: str, nonfinite: str, steps: int = 8,
              delay: float = 0.0, timeout: float = 30.0):
        """Every step moves each rank's weights to ``rank + step`` (lr 1) and averages (group size
        2, every second average global); the last rank's turn NaN at step ``nan_at``, ``delay``
        seconds late. Returns what happened on this rank."""
        size, rank = self.COMM.size, self.COMM.rank
        model = vector_model(float(rank))
        opt = WAGMA(torch.optim.SGD(model.parameters(), lr=1.0), group_size=2, sync_period=2,
                    global_mode=global_mode, nonfinite=nonfinite, comm=self.COMM, timeout=timeout)
        try:
            for step in range(steps):
                nan = rank == size - 1 and step == nan_at
                if nan:
                    time.sleep(delay)
                sgd_to(model, opt, float("nan") if nan else float(rank + step))
        except NonFiniteError as exc:
            # Ranks stop at different averages: a close could wait for an average a peer that
            # stopped earlier never joins. A job ends here; the test lets the engine go.
            opt._wa._abandon()
            return ("raised", exc.ranks, exc.step)
        extra = opt.stats.extra
        outcome = ("finished", bool(np.isfinite(weights(model)).all()),
                   extra.get("nonfinite_dropped", 0), extra.get("nonfinite_skipped", 0))
        opt.close()
        return outcome

    @pytest.mark.parametrize("global_mode", ["blocking", "overlap"])
    @pytest.mark.parametrize("nan_at", [0, 1], ids=["group", "global"])
    def test_a_nan_raises_the_same_error_on_every_rank(self, global_mode, nan_at):
        outcome = self.train(nan_at=nan_at, global_mode=global_mode, nonfinite="raise")
        assert outcome == ("raised", (self.COMM.size - 1,), nan_at + 1)

    def test_a_late_nan_reaches_the_ranks_waiting_for_an_overlapped_global(self):
        # The offender comes to its first average 2 s late. Its peers meanwhile make average 1's
        # global call and wait at average 3's for that global, which needs the offender's call;
        # the offender (and any peer it told) agrees instead. They must hear its notice there,
        # not wait out the timeout (CI of 693992e: a PeerTimeout after 30 s).
        outcome = self.train(nan_at=0, global_mode="overlap", nonfinite="raise", delay=2.0,
                             timeout=15.0)
        assert outcome == ("raised", (self.COMM.size - 1,), 1)

    @pytest.mark.parametrize("global_mode", ["blocking", "overlap"])
    @pytest.mark.parametrize("nan_at", [0, 1], ids=["group", "global"])
    def test_drop_puts_back_the_offenders_model_and_training_goes_on(self, global_mode, nan_at):
        _, finite, dropped, skipped = self.train(nan_at=nan_at, global_mode=global_mode,
                                                 nonfinite="drop")
        offender = self.COMM.rank == self.COMM.size - 1
        assert finite and dropped == int(offender) and skipped >= int(offender)
        if nan_at == 1:  # a global average: every rank skipped it
            assert skipped == 1


def micro_grad(rank: int, i: int) -> float:
    """The gradient of rank's i-th micro-batch in these tests (integers, so sums are exact)."""
    return float(10 * rank + i)


class TestNonBlockingSGD:
    COMM = MPI.COMM_WORLD

    def run_round(self, model, opt, *, slow_rank: int | None, nap: float = 1.0) -> list[float]:
        """One batch; returns the gradients of the micro-batches this rank computed."""
        rank = self.COMM.rank
        computed = []
        for i in range(opt.micro_batches):
            if i == 1:
                self.COMM.Barrier()  # everyone has published one micro-batch before anyone can fire
            if i >= 1 and rank == slow_rank:
                time.sleep(nap)
            model.weight.grad = torch.full_like(model.weight, micro_grad(rank, i))
            computed.append(micro_grad(rank, i))
            if not opt.micro_step():
                break
        opt.step()
        opt.zero_grad()
        return computed

    def on_time_round(self, model, opt) -> list[float]:
        """One batch in which nobody fires before every rank has published all of it."""
        computed = []
        for i in range(opt.micro_batches):
            model.weight.grad = torch.full_like(model.weight, micro_grad(self.COMM.rank, i))
            computed.append(micro_grad(self.COMM.rank, i))
            assert opt.micro_step()
        self.COMM.Barrier()
        opt.step()
        opt.zero_grad()
        return computed

    def test_all_on_time_uses_every_micro_batch(self):
        model = vector_model(0.0)
        opt = NonBlockingSGD(torch.optim.SGD(model.parameters(), lr=1.0), micro_batches=3, comm=self.COMM)
        self.COMM.Barrier()
        self.on_time_round(model, opt)
        res = opt.last_round
        assert res.counts == (3,) * self.COMM.size and res.carried == 0 and not res.closed_early
        total = sum(micro_grad(r, i) for r in range(self.COMM.size) for i in range(3))
        np.testing.assert_allclose(weights(model), np.float32(-total / (3 * self.COMM.size)), rtol=1e-6)
        opt.close()

    def test_slow_rank_contributes_finished_micro_batches_and_carries_the_rest(self):
        size, rank = self.COMM.size, self.COMM.rank
        slow = size - 1
        model = vector_model(0.0)
        opt = NonBlockingSGD(torch.optim.SGD(model.parameters(), lr=1.0), micro_batches=4, comm=self.COMM)
        computed = self.run_round(model, opt, slow_rank=slow)
        res = opt.last_round
        # The slow rank had published exactly one micro-batch when the first finisher fired; the
        # other ranks had 1 to 4 (whoever finished first fired, the rest were cut short).
        assert res.counts[slow] == 1 and max(res.counts) == 4, res
        assert all(1 <= c <= 4 for c in res.counts) and res.total == sum(res.counts)
        assert res.local_done == len(computed) and res.carried == res.local_done - res.counts[rank]
        if rank == slow:  # its second micro-batch finished after the fire: carried, not dropped
            assert res.closed_early and res.local_done == 2 and res.carried == 1
        w1 = weights(model)
        assert all(np.array_equal(w1, other) for other in self.COMM.allgather(w1))
        used1 = sum(micro_grad(r, i) for r, c in enumerate(res.counts) for i in range(c))
        np.testing.assert_allclose(w1, np.float32(-used1 / res.total), rtol=1e-6)
        assert tuple(opt.stats.extra["counts"]) == res.counts and opt.stats.extra["carried"] == res.carried
        # The next round starts from the carried micro-batches: rank r contributes them and its 4 new ones.
        carried = self.COMM.allgather(res.carried)
        first = res.counts
        self.on_time_round(model, opt)
        res2 = opt.last_round
        assert res2.counts == tuple(4 + c for c in carried) and res2.carried == 0, (res2, carried)
        used2 = sum(micro_grad(r, i) for r in range(size) for i in range(first[r], first[r] + carried[r]))
        used2 += sum(micro_grad(r, i) for r in range(size) for i in range(4))
        w2 = weights(model)
        assert all(np.array_equal(w2, other) for other in self.COMM.allgather(w2))
        np.testing.assert_allclose(w2, w1 - np.float32(used2 / res2.total), rtol=1e-6)
        opt.close()

    def test_every_computed_micro_batch_enters_exactly_one_round(self):
        model = vector_model(0.0)
        opt = NonBlockingSGD(torch.optim.SGD(model.parameters(), lr=0.1), micro_batches=3, comm=self.COMM)
        computed = used = 0
        for _ in range(3):
            computed += len(self.run_round(model, opt, slow_rank=0, nap=0.2))
            used += opt.last_round.counts[self.COMM.rank]
        computed += len(self.on_time_round(model, opt))  # everything published before the last fire
        used += opt.last_round.counts[self.COMM.rank]
        assert opt.last_round.carried == 0 and used == computed, (used, computed)
        opt.close()

    def test_rounds_keep_replicas_bitwise_identical(self):
        model = vector_model(0.0)
        opt = NonBlockingSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), micro_batches=2,
                             comm=self.COMM)
        for _ in range(3):
            self.run_round(model, opt, slow_rank=0, nap=0.1)
        w = weights(model)
        assert all(np.array_equal(w, other) for other in self.COMM.allgather(w))
        opt.close()


def ring_mean(values: list[float], rank: int) -> np.float32:
    """What D-PSGD gossip makes of per-rank scalars: the mean of rank and its ring neighbours,
    summed in rank order in float32 (as wagma_rl.optim.averaging.ring_average does)."""
    size = len(values)
    members = sorted({rank, (rank - 1) % size, (rank + 1) % size})
    total = np.float32(values[members[0]])
    for m in members[1:]:
        total = total + np.float32(values[m])
    return total / np.float32(len(members))


class TestNonBlockingDPSGD(TestNonBlockingSGD):
    """The same rounds on gossip: each rank steps with its own micro-batches, then ring-averages."""

    def own_step(self, used: dict[int, list[float]]) -> list[float]:
        """Every rank's model after its local lr=1 step from 0 with the mean of its used gradients."""
        return [float(-(np.float32(sum(g)) / np.float32(len(g)))) if g else 0.0
                for r, g in sorted(used.items())]

    def test_all_on_time_uses_every_micro_batch(self):
        size, rank = self.COMM.size, self.COMM.rank
        model = vector_model(0.0)
        opt = NonBlockingDPSGD(torch.optim.SGD(model.parameters(), lr=1.0), micro_batches=3, comm=self.COMM)
        self.COMM.Barrier()
        self.on_time_round(model, opt)
        res = opt.last_round
        assert res.counts == (3,) * size and res.carried == 0 and not res.closed_early
        local = self.own_step({r: [micro_grad(r, i) for i in range(3)] for r in range(size)})
        np.testing.assert_array_equal(weights(model), np.full(5, ring_mean(local, rank)))
        opt.close()

    def test_slow_rank_contributes_finished_micro_batches_and_carries_the_rest(self):
        size, rank = self.COMM.size, self.COMM.rank
        slow = size - 1
        model = vector_model(0.0)
        opt = NonBlockingDPSGD(torch.optim.SGD(model.parameters(), lr=1.0), micro_batches=4, comm=self.COMM)
        computed = self.run_round(model, opt, slow_rank=slow)
        res = opt.last_round
        assert res.counts[slow] == 1 and max(res.counts) == 4, res
        assert res.local_done == len(computed) and res.carried == res.local_done - res.counts[rank]
        if rank == slow:
            assert res.closed_early and res.local_done == 2 and res.carried == 1
        # Each rank stepped with the mean of its own counted micro-batches, then gossiped.
        local = self.own_step({r: [micro_grad(r, i) for i in range(c)] for r, c in enumerate(res.counts)})
        np.testing.assert_array_equal(weights(model), np.full(5, ring_mean(local, rank)))
        opt.close()

    def test_rounds_keep_replicas_bitwise_identical(self):
        """Gossip keeps models apart; synchronize() makes them bitwise identical."""
        model = vector_model(0.0)
        opt = NonBlockingDPSGD(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), micro_batches=2,
                               comm=self.COMM)
        for _ in range(3):
            self.run_round(model, opt, slow_rank=0, nap=0.1)
        opt.synchronize()
        w = weights(model)
        assert all(np.array_equal(w, other) for other in self.COMM.allgather(w))
        opt.close()

    def test_every_computed_micro_batch_enters_exactly_one_round(self):
        model = vector_model(0.0)
        opt = NonBlockingDPSGD(torch.optim.SGD(model.parameters(), lr=0.1), micro_batches=3, comm=self.COMM)
        computed = used = 0
        for _ in range(3):
            computed += len(self.run_round(model, opt, slow_rank=0, nap=0.2))
            used += opt.last_round.counts[self.COMM.rank]
        computed += len(self.on_time_round(model, opt))
        used += opt.last_round.counts[self.COMM.rank]
        assert opt.last_round.carried == 0 and used == computed, (used, computed)
        opt.close()
