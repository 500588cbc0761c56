"""Multi-rank specification of the non-finite guard (wa.h: a poisoned result is never applied).

Run on every rank under mpiexec (tests/test_nonfinite_result.py: 1, 2, 3 and 4 ranks). One rank
(``OFFENDER``, the last) puts a NaN into its buffer; every member of the collective it reaches
raises ``NonFiniteResult`` (``own`` on the offender alone), each buffer stays bitwise what its
rank passed in, the published contributions stay the ones before the call (a later group
iteration run on a rank's behalf shows which one stood in), and the collective stays usable.
Data are small integers, so every average below is exact in float32 at these rank counts.
"""
import os
import time

import numpy as np
import pytest
from mpi4py import MPI

from native_coll import NonFiniteResult, WaitAvoidingAllreduce

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
OFFENDER = SIZE - 1
N = 13  # not a multiple of the rank counts: uneven chunks, the NaN lands in one of them
TIMEOUT = 60.0


def start(k: float) -> np.ndarray:
    """Rank-distinct integers, ``4 k (1, ..., N)``: any mean of them over the ranks is exact."""
    return (4.0 * k * np.arange(1, N + 1)).astype(np.float32)


def mean_start() -> np.ndarray:
    return (sum(start(r) for r in range(SIZE)) / SIZE).astype(np.float32)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32).copy()


def poison(buf: np.ndarray) -> None:
    buf[N // 2] = np.nan


def after_the_offender_activated(wa) -> None:
    """A rank other than the offender waits until the offender's call activated the iteration
    (its own part then runs with its published contribution, equal to its buf in these tests), so
    the offender's contribution is its fresh buf."""
    while not wa.ready():
        time.sleep(1e-3)


def wait_for_the_others(tag: int) -> None:
    """The offender (or a late rank) waits until every other rank sent ``tag``."""
    for src in range(SIZE):
        if src != RANK:
            COMM.recv(source=src, tag=tag)


def tell(rank: int, tag: int) -> None:
    COMM.send("done", dest=rank, tag=tag)


class TestGroup:
    COMM = COMM

    def test_a_nan_in_one_member_is_refused_by_every_member_and_nothing_is_published(self):
        buf = start(RANK)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=SIZE, sync_period=1000,
                                   timeout=TIMEOUT) as wa:
            if RANK == OFFENDER:
                poison(buf)
            passed_in = bits(buf)
            self.COMM.Barrier()
            if RANK != OFFENDER:
                after_the_offender_activated(wa)
            with pytest.raises(NonFiniteResult) as err:
                wa.allreduce(late="merge")
            assert (err.value.iteration, err.value.own) == (0, RANK == OFFENDER)
            assert "group iteration 0 was not applied" in str(err.value)
            assert np.array_equal(bits(buf), passed_in) and wa.iteration == 1
            if SIZE == 1:
                return
            # Iteration 1 without the offender: its published start(OFFENDER) stands in, not the
            # poisoned buf, so the others get the plain mean.
            if RANK != OFFENDER:
                info = wa.allreduce(late="merge")
                assert OFFENDER in info.stale
                assert np.array_equal(buf, mean_start())
                tell(OFFENDER, 90)
            else:
                wait_for_the_others(90)
                buf[:] = start(RANK)  # the NaN fixed: its late merge adds nothing
                info = wa.allreduce(late="merge")
                assert RANK in info.stale and np.array_equal(buf, mean_start())


class TestBlockingGlobal:
    COMM = COMM

    def test_every_rank_refuses_a_global_with_a_nan_and_the_next_global_is_exact(self):
        buf = start(RANK)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=1,
                                   timeout=TIMEOUT) as wa:
            if RANK == OFFENDER:
                buf[0] = np.inf  # the first element of chunk 0: inf becomes the mark NaN
            passed_in = bits(buf)
            with pytest.raises(NonFiniteResult) as err:
                wa.allreduce(late="merge")
            assert (err.value.iteration, err.value.own) == (0, RANK == OFFENDER)
            assert "global iteration 0 was not applied" in str(err.value)
            assert np.array_equal(bits(buf), passed_in)
            buf[:] = start(RANK)
            info = wa.allreduce(late="merge")
        assert info.kind == "global" and info.iteration == 1
        assert np.array_equal(buf, mean_start())


class TestLateMember:
    COMM = COMM

    def test_a_late_member_refuses_a_poisoned_result_and_its_old_contribution_stays(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        late = 0  # the offender is on time, the late member is another rank
        buf = start(RANK)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=SIZE, sync_period=1000,
                                   timeout=TIMEOUT) as wa:
            if RANK != late:
                if RANK == OFFENDER:
                    poison(buf)
                else:
                    after_the_offender_activated(wa)
                with pytest.raises(NonFiniteResult) as err:
                    wa.allreduce(late="merge")
                assert err.value.own == (RANK == OFFENDER)
                tell(late, 91)
            else:
                wait_for_the_others(91)
                buf[:] = 1000.0  # fresh progress the group did not see
                with pytest.raises(NonFiniteResult) as err:
                    wa.allreduce(late="merge")
                assert (err.value.iteration, err.value.own) == (0, False)
                assert np.all(buf == 1000.0)
            # Iteration 1 without the late member: its published start(late) stands in.
            if RANK != late:
                buf[:] = start(RANK)  # (the others' buf and published contribution)
                info = wa.allreduce(late="merge")
                assert late in info.stale and np.array_equal(buf, mean_start())
                tell(late, 92)
            else:
                wait_for_the_others(92)
                buf[:] = start(RANK)
                wa.allreduce(late="merge")
                assert np.array_equal(buf, mean_start())

    def test_a_late_member_whose_fresh_buf_is_not_finite_refuses_alone(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        buf = start(RANK)
        others = self.COMM.Split(int(RANK == OFFENDER), RANK)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=SIZE, sync_period=1000,
                                   timeout=TIMEOUT) as wa:
            for t in range(2):  # at 1 the offender's old contribution must still stand in
                if RANK != OFFENDER:
                    buf[:] = start(RANK)
                    wa.publish()
                    others.Barrier()  # so a stand-in among them equals its fresh buf
                    info = wa.allreduce(late="merge")  # the offender's published start(OFFENDER) stands in
                    assert OFFENDER in info.stale and np.array_equal(buf, mean_start())
                    tell(OFFENDER, 93)
                else:
                    wait_for_the_others(93)
                    poison(buf)
                    passed_in = bits(buf)
                    with pytest.raises(NonFiniteResult) as err:
                        wa.allreduce(late="apply")  # R + (W - U) is not finite: refused here only
                    assert (err.value.iteration, err.value.own) == (t, True)
                    assert np.array_equal(bits(buf), passed_in)
        others.Free()


class TestOverlappedGlobal:
    COMM = COMM

    def test_the_offender_hears_at_its_global_call_the_others_where_they_would_apply_it(self):
        # sync_period 2 over all ranks: iteration 0 group, 1 global (overlapped), 2 group.
        buf = start(RANK)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=SIZE, sync_period=2,
                                   global_mode="overlap", timeout=TIMEOUT) as wa:
            wa.allreduce(late="merge")  # 0: everyone publishes the mean
            mean = buf.copy()
            if RANK == OFFENDER:
                poison(buf)
                passed_in = bits(buf)
                with pytest.raises(NonFiniteResult) as err:
                    wa.allreduce(late="merge")  # 1: contributed (so A completes) but refused at once
                assert (err.value.iteration, err.value.own) == (1, True)
                assert np.array_equal(bits(buf), passed_in) and wa.iteration == 2
                buf[:] = mean
                if SIZE > 1:
                    wait_for_the_others(94)
                # Told once: its later calls drop A quietly. Its group iteration 2 ran on its
                # behalf with its published mean (the poisoned snapshot was not published).
                info = wa.allreduce(late="merge")
                assert info.iteration == 2 and info.applied_global is None
                assert np.array_equal(buf, mean)
            else:
                assert wa.allreduce(late="merge").iteration == 1  # returns at once
                time.sleep(0.2)  # A mostly completes meanwhile: the call for 2 then meets it
                refused = []
                while wa.iteration < 3:  # 2: a group with the offender standing in
                    before = bits(buf)
                    try:
                        info = wa.allreduce(late="merge")
                    except NonFiniteResult as exc:
                        refused.append((exc.iteration, exc.own, wa.iteration))
                        assert np.array_equal(bits(buf), before)
                if not refused:  # A was not complete at the call for 2: settle meets it
                    with pytest.raises(NonFiniteResult) as err:
                        wa.settle()
                    refused.append((err.value.iteration, err.value.own, 3))
                assert [r[:2] for r in refused] == [(1, False)]
                assert info.iteration == 2 and np.array_equal(buf, mean)
                tell(OFFENDER, 94)


class TestSynchronize:
    COMM = COMM

    def test_a_nan_refuses_the_synchronize_on_every_rank(self):
        buf = start(RANK)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=1000,
                                   timeout=TIMEOUT) as wa:
            if RANK == OFFENDER:
                poison(buf)
            passed_in = bits(buf)
            with pytest.raises(NonFiniteResult) as err:
                wa.synchronize()
            assert (err.value.iteration, err.value.own) == (None, RANK == OFFENDER)
            assert "synchronize was not applied" in str(err.value)
            assert np.array_equal(bits(buf), passed_in)
            buf[:] = start(RANK)
            wa.synchronize()
        assert np.array_equal(buf, mean_start())

    def test_synchronize_drops_a_poisoned_overlapped_global_and_averages_every_buf(self):
        buf = start(RANK)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=1,
                                   global_mode="overlap", timeout=TIMEOUT) as wa:
            if RANK == OFFENDER:
                poison(buf)
                with pytest.raises(NonFiniteResult):
                    wa.allreduce(late="merge")
                buf[:] = start(RANK)
            else:
                wa.allreduce(late="merge")
            assert wa.synchronize() is None  # nothing applied, nothing reported
        assert np.array_equal(buf, mean_start())


class TestExactness:
    COMM = COMM

    # Schedules whose every result is deterministic: blocking globals between groups of one, and
    # overlapped globals only (each call waits for the previous average and applies it).
    @pytest.mark.parametrize("global_mode,sync_period", [("blocking", 2), ("overlap", 1)])
    def test_results_are_bitwise_the_same_with_the_guard_on_and_off(self, global_mode,
                                                                     sync_period):
        # Values that round, so the result bits depend on the order of the operations, which
        # the guard must leave alone.
        rng = np.random.default_rng(7 + RANK)
        data = rng.standard_normal((6, 1001)).astype(np.float32) * 1e3
        results = {}
        for guard in (True, False):
            buf = np.empty(1001, np.float32)
            with WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=sync_period,
                                       global_mode=global_mode, timeout=TIMEOUT) as wa:
                wa._engine.set_nonfinite_guard(guard)
                out = []
                for x in data:
                    buf[:] = x
                    wa.allreduce(late="merge")
                    out.append(buf.copy())
                wa.settle()
                out.append(buf.copy())
            results[guard] = np.array(out)
        assert np.array_equal(results[True].view(np.uint32), results[False].view(np.uint32))
        if global_mode == "blocking":
            # Groups of one leave x; a global is the sum in rank order divided by the rank count
            # (on pretended nodes of k ranks, WA_NODE_SIZE, the node-aware schedule's order: each
            # node's ranks, then the nodes; docs/collective.md#node-aware-schedule).
            every = COMM.allgather(data)
            k = int(os.environ.get("WA_NODE_SIZE") or 1)
            nodes = [list(range(a, min(a + k, SIZE))) for a in range(0, SIZE, k)]
            if len(nodes) < 2 or len({len(n) for n in nodes}) != 1 or k < 2:
                nodes = [[r] for r in range(SIZE)]  # the direct schedule: rank order
            for t in range(len(data)):
                expected = every[RANK][t]
                if t % 2 == 1:
                    expected = None
                    for node in nodes:
                        part = every[node[0]][t].copy()
                        for r in node[1:]:
                            part = (part + every[r][t]).astype(np.float32)
                        expected = part if expected is None else (expected + part).astype(np.float32)
                    expected = (expected / np.float32(SIZE)).astype(np.float32)
                assert np.array_equal(results[True][t].view(np.uint32), expected.view(np.uint32))
