"""Multi-rank specification of the overlapped global average (``global_mode="overlap"``, wa.h).

Run on every rank under mpiexec (tests/test_overlap.py: 2, 3, 4 and 8 ranks, and across the
namespaced nodes). Data are integers scaled by ``SCALE`` so that every average below is exact in
float32 at these rank counts (the global averages divide by the rank count); results are compared
with ``==``. Group iterations use ``group_size=1`` (a rank alone: the identity) except where a test
says otherwise, so that the values isolate what the global iterations do.
"""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from native_coll import WaitAvoidingAllreduce
from wagma_rl.optim import WAGMA

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
N = 13  # not a multiple of the rank counts: uneven chunks
SCALE = float(SIZE * 8)  # any mean of SCALE-multiples over SIZE ranks is an integer
TIMEOUT = 60.0


def ramp(k: float) -> np.ndarray:
    """A per-element distinct vector, ``k * (1, 2, ..., N)`` scaled (exact in float32)."""
    return (k * SCALE * np.arange(1, N + 1)).astype(np.float32)


def mean_over_ranks(value_of_rank) -> np.ndarray:
    return (sum(value_of_rank(r) for r in range(SIZE)) / SIZE).astype(np.float32)


def overlap(buf, *, sync_period: int, group_size: int = 1, start_iteration: int = 0):
    return WaitAvoidingAllreduce(COMM, buf, group_size=group_size, sync_period=sync_period,
                                 start_iteration=start_iteration, global_mode="overlap",
                                 timeout=TIMEOUT)


class TestOptions:
    def test_unknown_global_mode_raises_on_every_rank(self):
        with pytest.raises(ValueError, match="global_mode must be one of"):
            WaitAvoidingAllreduce(COMM, np.zeros(N, np.float32), group_size=1, sync_period=2,
                                  global_mode="lazy" if RANK == 0 else "overlap")

    def test_global_mode_differing_between_ranks_raises(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        mode = "overlap" if RANK == 0 else "blocking"
        with pytest.raises(ValueError, match="global_mode and start_iteration must be equal on "
                                             "every rank .*rank 1: .* global_mode=blocking"):
            WaitAvoidingAllreduce(COMM, np.zeros(N, np.float32), group_size=1, sync_period=2,
                                  global_mode=mode)


class TestApplyRule:
    def test_global_call_leaves_buf_and_the_next_call_applies_average_plus_own_progress(self):
        buf = ramp(RANK + 1)
        with overlap(buf, sync_period=2) as wa:
            wa.allreduce(late="merge")  # 0: group of one
            info = wa.allreduce(late="merge")  # 1: global, overlapped
            assert (info.kind, info.iteration, info.applied_global) == ("global", 1, None)
            np.testing.assert_array_equal(buf, ramp(RANK + 1))  # a snapshot was taken, buf untouched
            buf += ramp(10 * (RANK + 1))  # this rank's progress since the snapshot
            COMM.Barrier()  # every rank has contributed: the average can complete
            info = wa.settle()
            assert (info.applied_global, info.global_lag) == (1, 1)
            average = mean_over_ranks(lambda r: ramp(r + 1))
            np.testing.assert_array_equal(buf, average + ramp(10 * (RANK + 1)))
            assert wa.settle() is None  # nothing outstanding any more

    def test_the_next_global_call_applies_the_previous_one_before_its_snapshot(self):
        buf = ramp(RANK + 1)
        with overlap(buf, sync_period=1) as wa:  # every iteration global
            wa.allreduce(late="merge")
            buf += ramp(RANK)
            info = wa.allreduce(late="merge")  # waits for global 0, applies it, snapshots, returns
            assert (info.iteration, info.applied_global, info.global_lag) == (1, 0, 1)
            a0 = mean_over_ranks(lambda r: ramp(r + 1))
            np.testing.assert_array_equal(buf, a0 + ramp(RANK))
            wa.settle()
            # Global 1 averaged the snapshots a0 + ramp(r): a0 + mean ramp(r), no progress since.
            np.testing.assert_array_equal(buf, a0 + mean_over_ranks(ramp))

    def test_sum_over_ranks_is_conserved(self):
        # Integer progress between every call; group_size 2 mixes the groups in between. The sum of
        # the models must be the sum of the starting models plus every rank's progress. Small
        # values (no SCALE) keep every intermediate within float32's 24 bits at 2, 4 and 8 ranks.
        base = np.arange(1, N + 1, dtype=np.float32)
        buf = (RANK + 1) * base
        added = np.zeros(N, np.float32)
        with overlap(buf, sync_period=3, group_size=min(2, SIZE)) as wa:
            for t in range(6):  # globals at 2 and 5
                step = (t + 1) * (RANK + 2) * base
                buf += step
                added += step
                wa.allreduce(late="apply")
            assert wa.settle().applied_global == 5
        total = COMM.allreduce(buf.astype(np.float64))
        expected = COMM.allreduce(((RANK + 1) * base + added).astype(np.float64))
        if SIZE & (SIZE - 1) == 0:  # groups of 2 (butterfly): every average exact
            np.testing.assert_array_equal(total, expected)
        else:  # groups of 2 to 3 members: a division by 3 rounds
            np.testing.assert_allclose(total, expected, rtol=1e-6)


class TestSleeper:
    """The last rank sleeps (in its application thread) before global iteration 2; sync_period 3."""

    def test_others_run_past_a_sleeping_rank_and_wait_only_at_the_next_global(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        sleeper = SIZE - 1
        side = COMM.Dup()  # the "done" messages travel apart from the engine's traffic
        buf = ramp(RANK + 1)
        infos = []
        with overlap(buf, sync_period=3) as wa:
            if RANK != sleeper:
                for _ in range(2):
                    infos.append(wa.allreduce(late="merge"))  # 0, 1: groups
                infos.append(wa.allreduce(late="merge"))  # 2: global, contributed, not waited for
                buf += ramp(RANK + 2)
                infos.append(wa.allreduce(late="merge"))  # 3
                infos.append(wa.allreduce(late="merge"))  # 4
                # Past global 2 and two more iterations while the sleeper has not arrived at 2.
                assert [i.applied_global for i in infos[2:]] == [None, None, None]
                side.send("ran past", dest=sleeper)
                infos.append(wa.allreduce(late="merge"))  # 5: global: waits for global 2, i.e. the sleeper
                # The bound: global 2 was applied here, 3 iterations after its snapshot.
                assert (infos[5].applied_global, infos[5].global_lag) == (2, 3)
                a2 = mean_over_ranks(lambda r: ramp(r + 1))
                np.testing.assert_array_equal(buf, a2 + ramp(RANK + 2))
            else:
                for _ in range(2):
                    infos.append(wa.allreduce(late="merge"))
                for r in range(SIZE - 1):  # sleeps until every other rank has run past global 2
                    assert side.recv(source=r) == "ran past"
                for _ in range(4):  # 2 (its own fresh snapshot), 3, 4, 5
                    infos.append(wa.allreduce(late="merge"))
                applied = [i for i in infos if i.applied_global is not None]
                assert [i.applied_global for i in applied] == [2]
                assert 1 <= applied[0].global_lag <= 3
            wa.settle()  # global 5: everyone's snapshot a2 + progress since global 2's snapshot
        progress = mean_over_ranks(lambda r: ramp(r + 2) if r != sleeper else 0 * ramp(1))
        np.testing.assert_array_equal(buf, mean_over_ranks(lambda r: ramp(r + 1)) + progress)
        side.Free()


class TestSynchronize:
    def test_synchronize_makes_replicas_bitwise_identical_and_the_average_of_the_settled_models(self):
        buf = ramp(RANK + 1)
        with overlap(buf, sync_period=2) as wa:
            wa.allreduce(late="merge")
            wa.allreduce(late="merge")  # global 1, outstanding
            buf += ramp(4 * RANK)
            info = wa.synchronize()
            assert info.applied_global == 1
            settled = lambda r: mean_over_ranks(lambda q: ramp(q + 1)) + ramp(4 * r)  # noqa: E731
            np.testing.assert_array_equal(buf, mean_over_ranks(settled))
            for other in COMM.allgather(buf.copy()):
                assert np.array_equal(other.view(np.uint32), buf.view(np.uint32))
            assert wa.synchronize() is None  # nothing outstanding: a plain identical average
            assert wa.iteration == 2  # outside the schedule

    def test_resume_continues_the_schedule_from_a_synchronised_state(self):
        buf = ramp(RANK + 1)
        with overlap(buf, sync_period=3) as wa:
            for _ in range(4):  # 0, 1, 2 (global, outstanding), 3
                wa.allreduce(late="merge")
            wa.synchronize()
            saved, at = buf.copy(), wa.iteration
        assert at == 4
        buf2 = saved.copy()
        with overlap(buf2, sync_period=3, start_iteration=at) as wa:
            kinds = [wa.allreduce(late="merge").kind for _ in range(2)]  # 4 (group), 5 (global)
            assert kinds == ["group", "global"]
            wa.settle()
        np.testing.assert_array_equal(buf2, saved)  # identical replicas average to themselves


class TestWagmaOptimizer:
    def make(self, **kw):
        model = torch.nn.Linear(3, 2, bias=False)
        torch.nn.init.zeros_(model.weight)  # integer weights from here on: exact averages
        inner = torch.optim.SGD(model.parameters(), lr=1.0)
        opts = dict(group_size=1, sync_period=2, local_steps=1, late="apply",
                    global_mode="overlap")
        opts.update(kw)
        return model, WAGMA(inner, **opts)

    def step(self, model, opt, delta: float):
        # SGD with lr 1 and gradient -delta: the weight grows by exactly delta.
        model.weight.grad = torch.full_like(model.weight, -delta)
        opt.step()

    def test_overlapped_global_keeps_own_progress_and_synchronize_equalises(self):
        model, opt = self.make()
        with opt:
            w0 = model.weight.detach().clone()
            self.step(model, opt, SIZE * (RANK + 1))  # average 0: group of one
            self.step(model, opt, SIZE * (RANK + 1))  # average 1: global overlapped, snapshot
            snap = w0 + 2 * SIZE * (RANK + 1)
            assert torch.equal(model.weight.detach(), snap)
            self.step(model, opt, 2 * SIZE)  # average 2 applies global 1 once it is complete
            opt.synchronize()  # settles in any case
            mean_snap = w0 + SIZE * (SIZE + 1)  # mean over r of 2 * SIZE * (r + 1)
            assert torch.equal(model.weight.detach(), mean_snap + 2 * SIZE)
            assert opt.stats.extra.get("global_lag", 1) == 1

    def test_unknown_global_mode_raises(self):
        model = torch.nn.Linear(3, 2, bias=False)
        with pytest.raises(ValueError, match="global_mode must be 'blocking' or 'overlap'"):
            WAGMA(torch.optim.SGD(model.parameters(), lr=1.0), group_size=1, sync_period=2,
                  global_mode="lazy")

    def test_state_dict_round_trip_continues_in_overlap_mode(self):
        model, opt = self.make(sync_period=3)
        with opt:
            for _ in range(4):
                self.step(model, opt, 8.0)
            opt.synchronize()
            state = opt.state_dict()
            weights = model.weight.detach().clone()
        assert state["wrapper"]["options"]["global_mode"] == "overlap"
        model2, opt2 = self.make(sync_period=3)
        with opt2:
            model2.weight.data.copy_(weights)
            opt2.load_state_dict(state)
            assert opt2.iteration == 4 and not opt2.is_global() and opt2.is_global(5)
