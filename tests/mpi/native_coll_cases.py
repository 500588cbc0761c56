"""Multi-rank specification of native_coll.WaitAvoidingAllreduce (run on every rank under mpiexec).

Data are small integers scaled so that every average in these tests is exact in float32 whenever
group sizes are powers of two; results are then compared with ``==``, not a tolerance.
"""
import os
import time

import numpy as np
import pytest
from mpi4py import MPI

from native_coll import CollectiveTimeout, WaitAvoidingAllreduce, _native, group_of

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
WHERE = COMM.allgather((MPI.Get_processor_name(), os.getpid()))  # (host, pid) of every rank
POW2 = SIZE & (SIZE - 1) == 0


def assert_close_or_equal(actual, expected, exact):
    if exact:
        np.testing.assert_array_equal(actual, expected)
    else:
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def same_on_all(comm, arr) -> bool:
    return all(np.array_equal(a.view(np.uint32), arr.view(np.uint32)) for a in comm.allgather(arr))


class TestConstruction:
    COMM = COMM

    def make(self, buf, **kw):
        opts = dict(group_size=1, sync_period=2)
        opts.update(kw)
        return WaitAvoidingAllreduce(self.COMM, buf, **opts)

    def test_wrong_dtype_raises_on_every_rank(self):
        buf = np.zeros(8, np.float64 if RANK == 0 else np.float32)
        with pytest.raises(ValueError, match="rank 0: buf must have dtype float32"):
            self.make(buf)

    def test_non_contiguous_buffer_raises(self):
        with pytest.raises(ValueError, match="contiguous"):
            self.make(np.zeros(16, np.float32)[::2])

    def test_buffer_length_differing_between_ranks_raises(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        with pytest.raises(ValueError, match="same length on every rank"):
            self.make(np.zeros(8 + (RANK == SIZE - 1), np.float32))

    @pytest.mark.parametrize("group_size", [0, SIZE + 1])
    def test_group_size_outside_world_raises(self, group_size):
        with pytest.raises(ValueError, match="group_size must be between 1 and"):
            self.make(np.zeros(8, np.float32), group_size=group_size)

    def test_sync_period_below_one_raises(self):
        with pytest.raises(ValueError, match="sync_period must be >= 1"):
            self.make(np.zeros(8, np.float32), sync_period=0)

    def test_sync_period_none_is_never_global(self):
        buf = np.full(4, float(RANK), np.float32)
        with self.make(buf, group_size=1, sync_period=None) as wa:
            assert not any(wa.is_global(t) for t in (0, 1, 9, 10 ** 6))
            for _ in range(3):
                wa.allreduce(late="merge")  # groups of one: every iteration leaves the buffer as it was
            assert wa.group(7) == (RANK,)
        assert np.array_equal(buf, np.full(4, float(RANK), np.float32))

    def test_call_after_close_raises(self):
        wa = self.make(np.zeros(8, np.float32))
        wa.close()
        wa.close()  # idempotent
        with pytest.raises(RuntimeError, match="closed"):
            wa.allreduce(late="merge")

    def test_torch_tensor_is_used_in_place(self):
        torch = pytest.importorskip("torch")
        buf = torch.full((6,), float(RANK * SIZE))
        with self.make(buf, sync_period=1) as wa:
            wa.allreduce(late="merge")
        assert torch.equal(buf, torch.full((6,), float(SIZE * (SIZE - 1) / 2)))


class TestGlobal:
    COMM = COMM

    def test_global_iteration_is_the_exact_mean_bitwise_identical_everywhere(self):
        buf = (np.arange(1000, dtype=np.float32) + RANK * SIZE * 7).astype(np.float32)
        fresh = [np.arange(1000) + r * SIZE * 7 for r in range(SIZE)]
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=1) as wa:
            info = wa.allreduce(late="merge")
        assert info.kind == "global" and info.group == tuple(range(SIZE)) and info.stale == ()
        assert_close_or_equal(buf, np.mean(fresh, axis=0), POW2)
        assert same_on_all(self.COMM, buf)

    def test_every_sync_period_th_iteration_is_global(self):
        buf = np.zeros(4, np.float32)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=3) as wa:
            kinds = [wa.allreduce(late="merge").kind for _ in range(6)]
        assert kinds == ["group", "group", "global"] * 2


class TestGroupAveraging:
    COMM = COMM

    @pytest.mark.parametrize("group_size", sorted({1, 2, min(4, SIZE), SIZE} & set(range(1, SIZE + 1))))
    def test_group_iterations_average_exactly_within_the_documented_groups(self, group_size):
        # No local progress between calls and a barrier before each, so a member is at most one
        # iteration behind and a stale contribution equals its fresh one: whatever the arrival
        # order, x <- mean of x over group(t).
        n, iters, tau = 33, 7, 8
        x = np.stack([np.arange(n) * 3.0 + 1024.0 * r for r in range(SIZE)])
        buf = x[RANK].astype(np.float32)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=group_size, sync_period=tau) as wa:
            for t in range(iters):
                self.COMM.Barrier()
                info = wa.allreduce(late="merge")
                assert info.group == wa.group(t) == group_of(SIZE, group_size, t, RANK)
                x = np.stack([x[list(group_of(SIZE, group_size, t, r))].mean(axis=0)
                              for r in range(SIZE)])
                exact = POW2 and (group_size & (group_size - 1)) == 0
                assert_close_or_equal(buf, x[RANK], exact)
                # Every member holds bitwise the same result (nobody's fresh model differed).
                members = self.COMM.allgather((info.group, buf.copy()))
                for grp, b in members:
                    if grp == info.group:
                        assert np.array_equal(b.view(np.uint32), buf.view(np.uint32))

    def test_group_size_one_leaves_the_buffer_alone(self):
        buf = np.full(5, RANK + 0.5, np.float32)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=100) as wa:
            info = wa.allreduce(late="merge")
        assert info.group == (RANK,) and np.all(buf == RANK + 0.5)


class TestRotation:
    COMM = COMM

    def test_groups_are_disjoint_and_cover_all_ranks_at_every_iteration(self):
        for s in range(1, SIZE + 1):
            for t in range(12):
                groups = {group_of(SIZE, s, t, r) for r in range(SIZE)}
                members = sorted(m for g in groups for m in g)
                assert members == list(range(SIZE))
                assert all(r in group_of(SIZE, s, t, r) for r in range(SIZE))

    def test_information_reaches_every_rank_in_log_s_p_iterations(self):
        if not POW2 or SIZE == 1:
            pytest.skip("the butterfly bound holds for powers of two")
        for s in [2, 4, 8]:
            if s > SIZE:
                continue
            phases = -(-int(np.log2(SIZE)) // int(np.log2(s)))
            reach = {r: {r} for r in range(SIZE)}
            for t in range(phases):
                reach = {r: set().union(*(reach[m] for m in group_of(SIZE, s, t, r)))
                         for r in range(SIZE)}
            assert all(v == set(range(SIZE)) for v in reach.values())


def tell_the_last_rank(what: str, tag: int) -> None:
    """From a rank other than the last: ``what`` to the last rank (it waits for every other)."""
    COMM.send(what, dest=SIZE - 1, tag=tag)


def hear_from_the_others(tag: int) -> list:
    """On the last rank: what every other rank told it with ``tag``, in rank order."""
    return [COMM.recv(source=src, tag=tag) for src in range(SIZE - 1)]


def partner_of_last():
    """The rank grouped with the last rank at iteration 0 for group_size 2."""
    g = group_of(SIZE, 2, 0, SIZE - 1)
    return [r for r in g if r != SIZE - 1]


class TestLateMember:
    COMM = COMM

    def test_late_member_gets_the_group_average_with_its_fresh_model(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        late, S = SIZE - 1, SIZE
        published = np.full(16, 8.0 * RANK, np.float32)
        buf = published.copy()
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=S, sync_period=100) as wa:
            if RANK == late:
                buf[:] = 1000.0  # local progress the others have not seen
                assert hear_from_the_others(77) == ["done"] * (SIZE - 1)
                assert wa.ready()
                info = wa.allreduce(late="merge")
            else:
                info = wa.allreduce(late="merge")
                tell_the_last_rank("done", 77)
            R = (sum(8.0 * r for r in range(SIZE))) / S
            expected = R + (1000.0 - 8.0 * late) / S if RANK == late else R
            assert np.all(buf == np.float32(expected))
            assert late in info.stale and info.staleness == 1
            others = [b for r, b in enumerate(self.COMM.allgather(buf.copy())) if r != late]
            assert all(np.array_equal(b.view(np.uint32), others[0].view(np.uint32)) for b in others)

    def test_apply_gives_the_late_member_all_its_progress_and_conserves_the_sum(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        late, S = SIZE - 1, SIZE
        buf = np.full(8, 4.0 * RANK, np.float32)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=S, sync_period=100) as wa:
            before = self.COMM.allreduce(float(buf[0]))
            if RANK == late:
                buf[:] = 4.0 * RANK + 64.0  # a local update of +64 the group did not see
                assert hear_from_the_others(76) == ["done"] * (SIZE - 1)
                info = wa.allreduce(late="apply")
            else:
                info = wa.allreduce(late="apply")
                tell_the_last_rank("done", 76)
            R = sum(4.0 * r for r in range(SIZE)) / S
            assert np.all(buf == np.float32(R + 64.0 if RANK == late else R))
            assert late in info.stale
            # Nothing is lost: the models still sum to what they summed to, plus the update.
            assert self.COMM.allreduce(float(buf[0])) == before + 64.0
            # The next (global) average hands every rank its share of the late update.
            self.COMM.Barrier()
            wa.allreduce(late="apply")
            assert np.all(buf == np.float32(R + 64.0 / S))

    def test_unknown_late_rule_raises(self):
        buf = np.zeros(4, np.float32)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=2) as wa:
            with pytest.raises(ValueError, match="late must be one of"):
                wa.allreduce(late="drop")

    def test_discard_gives_the_late_member_the_group_result(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        late = SIZE - 1
        buf = np.full(4, 2.0 * RANK, np.float32)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=SIZE, sync_period=100) as wa:
            if RANK == late:
                buf[:] = -50.0
                hear_from_the_others(78)
                wa.allreduce(late="discard", reset=True)
            else:
                wa.allreduce(late="discard", reset=True)
                tell_the_last_rank("done", 78)
            assert same_on_all(self.COMM, buf)
            assert np.all(buf == np.float32(sum(2.0 * r for r in range(SIZE)) / SIZE))
            # reset: the next contribution of a member that does not call is zero. The others
            # publish first so their own arrival order cannot matter.
            callers = self.COMM.Split(0 if RANK != late else 1, RANK)
            if RANK != late:
                buf[:] = 4.0
                wa.publish()
                callers.Barrier()
                wa.allreduce(late="merge")
                tell_the_last_rank("done", 79)
                assert np.all(buf == np.float32(4.0 * (SIZE - 1) / SIZE))
            else:
                hear_from_the_others(79)
                buf[:] = 0.0
                wa.allreduce(late="merge")
            callers.Free()


class TestSleeper:
    COMM = COMM

    def test_peers_run_ahead_of_a_sleeping_member_until_the_global_iteration(self):
        # The sleeper does not call until every peer has finished all group iterations: had any
        # peer waited for it, this would deadlock (and time out) instead of passing.
        if SIZE == 1:
            pytest.skip("needs two ranks")
        sleeper, S, tau = 0, 2, 6
        x0 = np.stack([np.full(8, 64.0 * r) for r in range(SIZE)])
        buf = x0[RANK].astype(np.float32)
        peers = self.COMM.Split(int(RANK == sleeper), RANK)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=S, sync_period=tau,
                                   timeout=60) as wa:
            if RANK != sleeper:
                for t in range(tau - 1):
                    peers.Barrier()  # peers stay within one iteration of each other
                    wa.allreduce(late="merge")
                self.COMM.send("done", dest=sleeper, tag=80)
            else:
                for src in range(1, SIZE):
                    self.COMM.recv(source=src, tag=80)
                for t in range(tau - 1):
                    assert wa.ready()  # already done by its group, with the initial model
                    buf += 1.0  # local progress
                    info = wa.allreduce(late="merge")
                    assert RANK in info.stale and info.staleness == t + 1
            # Reference: the sleeper contributed its initial model to every group iteration.
            x = x0.copy()
            sleeper_result = x0[sleeper].copy()
            for t in range(tau - 1):
                new = np.empty_like(x)
                for r in range(SIZE):
                    g = list(group_of(SIZE, S, t, r))
                    contrib = [x0[sleeper] if m == sleeper else x[m] for m in g]
                    new[r] = np.mean(contrib, axis=0)
                sleeper_fresh = sleeper_result + 1.0
                sleeper_result = new[sleeper] + (sleeper_fresh - x0[sleeper]) / len(
                    group_of(SIZE, S, t, sleeper))
                new[sleeper] = sleeper_result
                x = new
            exact = POW2
            assert_close_or_equal(buf, x[RANK], exact)
            info = wa.allreduce(late="merge")  # the global iteration: everyone waits for everyone
            assert info.kind == "global" and info.stale == ()
            assert_close_or_equal(buf, x.mean(axis=0), exact)
            assert same_on_all(self.COMM, buf)
        peers.Free()


class TestTimeout:
    COMM = COMM

    def test_a_rank_missing_the_global_iteration_is_named_in_the_timeout(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        absent = SIZE - 1
        buf = np.zeros(32, np.float32)
        wa = WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=1, timeout=1.0)
        if RANK != absent:
            with pytest.raises(CollectiveTimeout) as err:
                wa.allreduce(late="merge")
            assert err.value.ranks == (absent,)
            assert f"[{absent}]" in str(err.value)
            assert f"rank {absent} (host {WHERE[absent][0]}, pid {WHERE[absent][1]})" in str(err.value)
            tell_the_last_rank("timed out", 81)
        else:
            hear_from_the_others(81)
            with pytest.raises(CollectiveTimeout):
                wa.allreduce(late="merge")
        with pytest.raises(RuntimeError, match="unusable"):
            wa.allreduce(late="merge")
        wa.close()  # after a failure: local, must not hang
        self.COMM.Barrier()

    def test_a_wait_that_began_before_the_call_ends_one_timeout_after_it_began(self):
        # WAGMA polls for a peer's notice before an overlapped global's call (wait_began): the
        # call's timeout counts from the poll's start, so a stopped rank is named after one
        # timeout, not two.
        if SIZE == 1:
            pytest.skip("needs two ranks")
        absent = SIZE - 1
        wa = WaitAvoidingAllreduce(self.COMM, np.zeros(8, np.float32), group_size=1,
                                   sync_period=1, timeout=4.0)
        if RANK != absent:
            began = time.monotonic() - 3.5
            wa.wait_began(began)
            with pytest.raises(CollectiveTimeout) as err:
                wa.allreduce(late="merge")
            assert err.value.ranks == (absent,)
            assert time.monotonic() - began < 6.0  # 4 s from the start; 7.5 s from the call
            tell_the_last_rank("timed out", 83)
        else:
            hear_from_the_others(83)
            with pytest.raises(CollectiveTimeout):
                wa.allreduce(late="merge")
        wa.close()  # after a failure: local
        self.COMM.Barrier()


class TestOverlapPending:
    COMM = COMM

    def test_the_outstanding_global_is_pending_until_every_rank_made_its_call(self):
        buf = np.full(8, float(RANK), np.float32)
        wa = WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=2,
                                   global_mode="overlap", timeout=30.0)
        assert not wa.global_pending()
        wa.allreduce(late="merge")  # iteration 0: a group of one
        last = SIZE - 1
        if RANK != last:
            wa.allreduce(late="merge")  # iteration 1: the global's snapshot, returns at once
            assert wa.global_pending()  # the last rank has not made its call
            tell_the_last_rank("called", 84)
        else:
            assert not wa.global_pending()  # nothing outstanding before its own call
            hear_from_the_others(84)
            wa.allreduce(late="merge")
        end = time.monotonic() + 30.0
        while wa.global_pending() and time.monotonic() < end:
            time.sleep(1e-3)
        assert not wa.global_pending()
        wa.settle()
        assert float(buf[0]) == (SIZE - 1) / 2  # the average of 0..SIZE-1, applied
        wa.close()


class TestDeadlines:
    """Construction and close are collective too: bounded by the timeout, naming who is missing."""

    COMM = COMM

    @pytest.mark.parametrize("absent", [0, -1], ids=["rank0", "last"])
    def test_a_rank_that_never_constructs_is_named(self, absent):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        absent = absent % SIZE
        comm = self.COMM.Dup()  # a timed-out handshake may leave a message on its communicator
        if RANK != absent:
            with pytest.raises(CollectiveTimeout) as err:
                WaitAvoidingAllreduce(comm, np.zeros(4, np.float32), group_size=1,
                                      sync_period=1, timeout=1.0)
            # Rank 0 hears from everyone but the absent rank; the others hear from rank 0,
            # or, when rank 0 is the absent one, from nobody.
            assert err.value.ranks == (absent,)
            assert f"[{absent}]" in str(err.value)
        self.COMM.Barrier()

    def test_a_rank_that_never_closes_is_named(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        absent = SIZE - 1
        wa = WaitAvoidingAllreduce(self.COMM, np.zeros(4, np.float32), group_size=1,
                                   sync_period=1, timeout=1.0)
        wa.allreduce(late="merge")
        if RANK != absent:
            with pytest.raises(CollectiveTimeout) as err:
                wa.close()
            assert err.value.ranks == (absent,)
            assert "did not call close()" in str(err.value)
            assert f"rank {absent} (host {WHERE[absent][0]}, pid {WHERE[absent][1]})" in str(err.value)
            tell_the_last_rank("timed out", 82)
        else:
            hear_from_the_others(82)
            wa.close()  # the peers' close notices reached it before they gave up
        self.COMM.Barrier()


class TestProtocolError:
    """Ranks whose engines disagree on the groups. WaitAvoidingAllreduce agrees group_size across
    ranks before it builds an engine, so the low-level engine is driven directly here."""

    COMM = COMM

    def test_an_activation_from_outside_the_group_breaks_the_engine_naming_the_rank(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        pair = self.COMM.Split(0 if RANK < 2 else MPI.UNDEFINED, RANK)
        if pair != MPI.COMM_NULL:
            buf = np.zeros(8, np.float32)
            # Rank 0 averages alone (group_size 1); rank 1 believes both ranks form the group.
            engine = _native.Engine(MPI._addressof(pair), buf.ctypes.data, buf.size, 1 + RANK,
                                    1 << 40, 0, _native.GLOBAL_BLOCKING, 2.0)
            if RANK == 0:
                # Its own iterations complete alone; rank 1's activation of iteration 0 arrives
                # before or after it finished iteration 0, and the next call reports it: a
                # RuntimeError (a wrong configuration, not a timeout or a lost connection).
                deadline = time.monotonic() + 30
                with pytest.raises(RuntimeError,
                                   match=r"^native_coll: protocol error: rank 1 activated "
                                         r"iteration 0.*") as err:
                    while time.monotonic() < deadline:
                        engine.allreduce(_native.LATE_MERGE, False)
                        time.sleep(1e-3)
                assert ("already finished" in str(err.value)
                        or "do all ranks pass the same group_size and sync_period?" in str(err.value))
            else:
                with pytest.raises(CollectiveTimeout) as err:  # rank 0 never takes part
                    engine.allreduce(_native.LATE_MERGE, False)
                assert err.value.ranks == (0,)
                assert "group iteration 0 did not complete within 2 s: rank(s) [0] did not answer" \
                    in str(err.value)
            engine.close()  # after a failure: local, must not hang
            pair.Free()
        self.COMM.Barrier()


class TestStress:
    COMM = COMM

    def test_thousands_of_iterations_with_random_delays_give_exact_results(self):
        # Every rank contributes fresh integers every iteration and sleeps at random, so members are
        # stale in arbitrary patterns. Checked for every group at every iteration: on-time members
        # agree bitwise on R; a late member's result R + (W - U)/|G| reveals the contribution U the
        # group used for it, which must be one of its own earlier results (its published model, at
        # most `staleness` iterations old); and R is the average of fresh and stale contributions.
        iters = {1: 3000, 2: 3000, 3: 2000, 4: 2000}.get(SIZE, 600)
        S = 2 if SIZE >= 2 else 1
        tau, n = 8, 12
        rng = np.random.default_rng(1234 + RANK)
        buf = np.zeros(n, np.float32)
        fresh = np.empty((iters, n), np.float32)
        result = np.empty((iters, n), np.float32)
        infos = []
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=S, sync_period=tau, timeout=60) as wa:
            for t in range(iters):
                if rng.random() < 0.05:
                    time.sleep(rng.random() * 2e-3)
                buf[:] = rng.integers(-64, 64, size=n)
                fresh[t] = buf
                info = wa.allreduce(late="merge")
                result[t] = buf
                infos.append((info.group, info.stale, info.staleness))
        everyone = self.COMM.gather((fresh, result, infos), root=0)
        if RANK != 0:
            return
        W = [e[0] for e in everyone]
        res = [e[1] for e in everyone]

        def published_before(m, k):
            return np.zeros(n) if k < 0 else res[m][k].astype(np.float64)

        late_calls = 0
        for t in range(iters):
            for g in {everyone[r][2][t][0] for r in range(SIZE)}:
                _, stale, staleness = everyone[g[0]][2][t]
                assert all(everyone[m][2][t] == (g, stale, staleness) for m in g)
                on_time = [m for m in g if m not in stale]
                assert on_time, "the member that activated an iteration is always fresh"
                R = res[on_time[0]][t]
                for m in on_time:
                    assert np.array_equal(res[m][t].view(np.uint32), R.view(np.uint32))
                total = sum(W[m][t].astype(np.float64) for m in on_time)
                for m in stale:
                    late_calls += 1
                    U = W[m][t] - len(g) * (res[m][t].astype(np.float64) - R)
                    candidates = [published_before(m, k) for k in range(t - staleness, t)]
                    assert any(np.allclose(U, c, rtol=0, atol=1e-3) for c in candidates), (t, m)
                    total += U
                np.testing.assert_allclose(R, total / len(g), rtol=0, atol=1e-3)
        print(f"stress: {iters} iterations at {SIZE} ranks, {late_calls} late member-calls")


class TestResume:
    COMM = COMM

    def test_start_iteration_continues_the_group_and_global_schedule(self):
        buf = np.full(4, float(RANK), np.float32)
        S = min(2, SIZE)
        with WaitAvoidingAllreduce(self.COMM, buf, group_size=S, sync_period=5,
                                   start_iteration=13) as wa:
            assert wa.iteration == 13
            first = wa.allreduce(late="merge")
            second = wa.allreduce(late="merge")
        assert (first.iteration, first.kind) == (13, "group")
        assert first.group == group_of(SIZE, S, 13, RANK)
        assert (second.iteration, second.kind) == (14, "global")
        assert_close_or_equal(buf, np.full(4, sum(range(SIZE)) / SIZE), POW2)

    def test_start_iteration_differing_between_ranks_raises(self):
        if SIZE == 1:
            pytest.skip("needs two ranks")
        with pytest.raises(ValueError, match="start_iteration must be equal on every rank"):
            WaitAvoidingAllreduce(self.COMM, np.zeros(4, np.float32), group_size=1,
                                  sync_period=5, start_iteration=RANK)
