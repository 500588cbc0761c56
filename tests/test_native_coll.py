"""native_coll in one process: the group rule, input checks and an idle progress thread."""
import time

import numpy as np
import pytest

from native_coll import WaitAvoidingAllreduce, group_of


class TestGroupRule:
    def test_butterfly_groups_of_two_over_eight_ranks_pair_bit_by_bit(self):
        assert [group_of(8, 2, t, 0) for t in range(4)] == [(0, 1), (0, 2), (0, 4), (0, 1)]
        assert [group_of(8, 2, t, 5) for t in range(3)] == [(4, 5), (5, 7), (1, 5)]

    def test_butterfly_last_field_is_shifted_to_stay_full_width(self):
        # P=8, S=4: fields [0, 2) then [1, 3) (not the 1-bit field [2, 3))
        assert group_of(8, 4, 0, 0) == (0, 1, 2, 3)
        assert group_of(8, 4, 1, 0) == (0, 2, 4, 6)
        assert group_of(8, 4, 2, 0) == (0, 1, 2, 3)

    def test_reference_configuration_p64_s8_mixes_in_two_iterations(self):
        assert group_of(64, 8, 0, 9) == tuple(range(8, 16))
        assert group_of(64, 8, 1, 9) == tuple(range(1, 64, 8))

    @pytest.mark.parametrize("P,S", [(3, 2), (6, 4), (12, 5), (10, 3), (7, 7)])
    def test_other_sizes_form_disjoint_covering_groups_of_s_to_2s_minus_1(self, P, S):
        for t in range(20):
            groups = {group_of(P, S, t, r) for r in range(P)}
            assert sorted(m for g in groups for m in g) == list(range(P))
            assert all(S <= len(g) <= 2 * S - 1 for g in groups)

    def test_other_sizes_rotate(self):
        assert len({group_of(12, 3, t, 0) for t in range(10)}) > 1

    def test_group_size_one_and_all(self):
        assert group_of(4, 1, 3, 2) == (2,)
        assert group_of(4, 4, 3, 2) == (0, 1, 2, 3)
        assert group_of(4, 9, 0, 1) == (0, 1, 2, 3)

    def test_bad_arguments_raise(self):
        with pytest.raises(ValueError, match="0 <= rank < P"):
            group_of(4, 2, 0, 4)


class TestSingleRank:
    def comm(self):
        from mpi4py import MPI
        return MPI.COMM_SELF

    def test_wrong_dtype_names_the_fix(self):
        with pytest.raises(ValueError, match="dtype float32"):
            WaitAvoidingAllreduce(self.comm(), np.zeros(4), group_size=1, sync_period=1)

    def test_not_a_buffer(self):
        with pytest.raises(ValueError, match="numpy array or a torch tensor"):
            WaitAvoidingAllreduce(self.comm(), [1.0, 2.0], group_size=1, sync_period=1)

    def test_two_dimensional_buffer(self):
        with pytest.raises(ValueError, match="1-D"):
            WaitAvoidingAllreduce(self.comm(), np.zeros((2, 2), np.float32), group_size=1,
                                  sync_period=1)

    def test_idle_progress_thread_does_not_burn_a_core(self):
        buf = np.zeros(1 << 16, np.float32)
        with WaitAvoidingAllreduce(self.comm(), buf, group_size=1, sync_period=2) as wa:
            wa.allreduce(late="merge")
            cpu0, wall0 = time.process_time(), time.perf_counter()
            time.sleep(1.0)
            cpu = time.process_time() - cpu0
            wall = time.perf_counter() - wall0
        # A spinning thread would use ~100% of the wall time; back-off sleeping uses a few %.
        assert cpu < 0.25 * wall, f"progress thread used {cpu:.2f} s CPU in {wall:.2f} s idle"


class TestPollUntil:
    """native_coll.polling.poll_until: the one poll-then-back-off wait of the Python side."""

    def test_returns_the_first_answer_that_is_not_none_or_false(self):
        from native_coll.polling import poll_until
        answers = iter([None, False, None, "msg", "later"])
        assert poll_until(lambda: next(answers), deadline=time.monotonic() + 5) == "msg"
        assert next(answers) == "later"  # polling stopped at the first answer

    def test_returns_none_at_the_deadline_after_sleeping_between_polls(self):
        from native_coll.polling import MAX_SLEEP_S, poll_until
        calls, sleeps = [], []
        start = time.monotonic()
        assert poll_until(lambda: calls.append(1), deadline=start + 0.1,
                          before_sleep=lambda: sleeps.append(1)) is None
        assert time.monotonic() >= start + 0.1
        # Backed off: far fewer polls than a spin would make, and a sleep before all but the last.
        assert 2 <= len(calls) <= 0.1 / MAX_SLEEP_S + 20
        assert len(sleeps) == len(calls) - 1

    def test_no_sleep_during_the_spin_and_before_sleep_may_raise(self):
        from native_coll.polling import poll_until
        sleeps = []
        assert poll_until(lambda: None, deadline=time.monotonic() + 0.05, spin_s=1.0,
                          before_sleep=lambda: sleeps.append(1)) is None
        assert sleeps == []

        def notice():
            raise RuntimeError("a peer timed out first")
        with pytest.raises(RuntimeError, match="peer timed out"):
            poll_until(lambda: None, deadline=time.monotonic() + 5, before_sleep=notice)
