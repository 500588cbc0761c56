"""The node-aware schedule (native_coll/src/schedule_hier.c), run on every rank under mpiexec.

The ranks pretend to share nodes (``WA_NODE_SIZE``, read when an engine is made, set here alike on
every rank), so one machine exercises every node layout; tests/test_cluster.py runs this module on
namespaced nodes, where MPI itself says which ranks share a node. Results are compared bit for bit
with the schedule's documented order of additions: each node's members summed in rank order, then
the node sums in node order, divided by the number of members.
"""
import os
import time
from contextlib import contextmanager

import numpy as np
import pytest
from mpi4py import MPI

from native_coll import WaitAvoidingAllreduce, group_of

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
REAL_NODES = os.environ.get("WA_TEST_REAL_NODES") == "1"  # namespaced nodes: MPI knows the layout


@contextmanager
def settings(**env):
    """Environment variables for the engines made inside (every rank sets the same)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def node_layout(node_size: int | None):
    """Every rank's node: pretended (rank // node_size) or, on real nodes, MPI's."""
    if node_size:
        return [r // node_size for r in range(SIZE)]
    return COMM.allgather(MPI.Get_processor_name())


def node_aware_mean(xs, members, node_of):
    """(nodes, mean) of the node-aware schedule for these members, or (0, None) when it does not
    run for them (fewer than two nodes, fewer than two members on a node, or unequal counts)."""
    order = []
    for m in members:
        if node_of[m] not in order:
            order.append(node_of[m])
    on = [[m for m in members if node_of[m] == v] for v in order]
    if len(on) < 2 or len({len(x) for x in on}) != 1 or len(on[0]) < 2:
        return 0, None
    total = None
    for node in on:
        part = xs[node[0]].copy()
        for m in node[1:]:
            part = part + xs[m]
        total = part if total is None else total + part
    return len(on), total / np.float32(len(members))


def direct_mean(xs, members):
    total = xs[members[0]].copy()
    for m in members[1:]:
        total = total + xs[m]
    return total / np.float32(len(members))


def random_rows(n, seed):
    return [np.random.default_rng(seed + r).standard_normal(n).astype(np.float32)
            for r in range(SIZE)]


def bitwise(a, b):
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32),
                          np.asarray(b, np.float32).view(np.uint32))


NODE_SIZES = [None] if REAL_NODES else sorted({k for k in (2, 3, 4) if SIZE % k == 0 and
                                                 SIZE // k >= 2})


@pytest.mark.skipif(not NODE_SIZES, reason="no layout of two or more nodes of >= 2 ranks")
class TestNodeAwareResults:
    COMM = COMM

    @pytest.mark.parametrize("node_size", NODE_SIZES)
    @pytest.mark.parametrize("n", [1, 7, 1001, 65537])
    def test_global_average_is_the_node_ordered_mean_bitwise_on_every_rank(self, node_size, n):
        xs = random_rows(n, 10 * n)
        buf = xs[RANK].copy()
        node_of = node_layout(node_size)
        with settings(WA_NODE_SIZE=node_size or "", WA_HIER_MIN_BYTES=0):
            with WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=1) as wa:
                info = wa.allreduce(late="merge")
        nodes, expected = node_aware_mean(xs, list(range(SIZE)), node_of)
        assert info.kind == "global" and info.nodes == nodes == len(set(node_of))
        assert bitwise(buf, expected)

    @pytest.mark.parametrize("node_size", NODE_SIZES)
    def test_group_iterations_take_the_node_aware_schedule_exactly_when_their_members_share_nodes(
            self, node_size):
        n, S = 4096, min(4, SIZE)
        node_of = node_layout(node_size)
        xs = random_rows(n, 7)
        buf = xs[RANK].copy()
        seen = set()
        with settings(WA_NODE_SIZE=node_size or "", WA_HIER_MIN_BYTES=0):
            with WaitAvoidingAllreduce(self.COMM, buf, group_size=S, sync_period=None) as wa:
                for t in range(4):
                    self.COMM.Barrier()  # on time: every contribution is fresh
                    info = wa.allreduce(late="merge")
                    members = list(group_of(SIZE, S, t, RANK))
                    nodes, expected = node_aware_mean(xs, members, node_of)
                    if not nodes:
                        expected = direct_mean(xs, members)
                    assert info.nodes == nodes, (t, members)
                    assert bitwise(buf, expected), (t, members, nodes)
                    seen.add(nodes > 0)
                    xs = [np.asarray(b) for b in self.COMM.allgather(buf.copy())]
        assert True in set().union(*self.COMM.allgather(seen))  # some group was node-aware

    @pytest.mark.parametrize("node_size", NODE_SIZES)
    def test_a_sleeping_member_is_stood_in_for_by_its_published_model(self, node_size):
        # Rank SIZE-1 sleeps through the first iteration; its node-mates and the other nodes run it
        # with its published model (its construction-time buffer); late="discard" gives it R too.
        n = 2048
        node_of = node_layout(node_size)
        xs = random_rows(n, 3)
        buf = xs[RANK].copy()
        fresh = (xs[RANK] + 1).astype(np.float32)
        with settings(WA_NODE_SIZE=node_size or "", WA_HIER_MIN_BYTES=0):
            with WaitAvoidingAllreduce(self.COMM, buf, group_size=SIZE, sync_period=None,
                                       timeout=30) as wa:
                if RANK == SIZE - 1:
                    time.sleep(1.0)
                buf[:] = fresh
                info = wa.allreduce(late="discard")
        # Stand-ins are published models: the sleeper's, and any rank's that had not called yet
        # when the first member activated the iteration (2 cores, many ranks); info.stale says who.
        stale = self.COMM.allgather(info.stale)
        assert all(s == stale[0] for s in stale) and SIZE - 1 in stale[0]
        used = [xs[r] if r in stale[0] else (xs[r] + 1).astype(np.float32) for r in range(SIZE)]
        nodes, R = node_aware_mean(used, list(range(SIZE)), node_of)
        assert info.nodes == nodes
        assert bitwise(buf, R)  # discard: even the late member holds R

    @pytest.mark.parametrize("node_size", NODE_SIZES)
    def test_a_member_set_s_node_layout_is_computed_once_however_many_collectives_it_runs(
            self, node_size):
        # 12 iterations of groups and globals (sync_period 3) over a few distinct member sets: each
        # set of >= 4 members gets its layout once (node_layout.c's cache), never per collective.
        S = min(4, SIZE)
        buf = np.ones(64, np.float32)
        sets = set()
        with settings(WA_NODE_SIZE=node_size or "", WA_HIER_MIN_BYTES=0):
            with WaitAvoidingAllreduce(self.COMM, buf, group_size=S, sync_period=3) as wa:
                for _ in range(12):
                    self.COMM.Barrier()
                    sets.add(wa.allreduce(late="merge").group)
                computed = wa._engine.layouts_computed()
        assert len(sets) < 12  # sets recur, so a per-collective layout would be counted more often
        assert computed == len({s for s in sets if len(s) >= 4})

    @pytest.mark.parametrize("node_size", NODE_SIZES)
    def test_below_the_size_threshold_and_when_turned_off_the_direct_schedule_runs(self, node_size):
        xs = random_rows(300, 5)
        for env, nodes_expected in [({"WA_HIER_MIN_BYTES": 4096}, 0),    # 1200 bytes < 4096
                                    ({"WA_HIER_MIN_BYTES": 1200}, None),  # at the threshold
                                    ({"WA_HIER_MIN_BYTES": 0, "WA_HIERARCHY": "off"}, 0)]:
            buf = xs[RANK].copy()
            with settings(WA_NODE_SIZE=node_size or "", **env):
                with WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=1) as wa:
                    info = wa.allreduce(late="merge")
            nodes, expected = node_aware_mean(xs, list(range(SIZE)), node_layout(node_size))
            if nodes_expected == 0:
                nodes, expected = 0, direct_mean(xs, list(range(SIZE)))
            assert info.nodes == nodes, env
            assert bitwise(buf, expected), env


class TestLayouts:
    COMM = COMM

    @pytest.mark.skipif(REAL_NODES or SIZE < 3, reason="pretended nodes of unequal size")
    def test_unequal_nodes_run_the_direct_schedule(self):
        # Nodes of SIZE-1 and 1 ranks: no balanced layout, so the direct (member order) schedule.
        xs = random_rows(500, 11)
        buf = xs[RANK].copy()
        with settings(WA_NODE_SIZE=SIZE - 1, WA_HIER_MIN_BYTES=0):
            with WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=1) as wa:
                info = wa.allreduce(late="merge")
        assert info.nodes == 0
        assert bitwise(buf, direct_mean(xs, list(range(SIZE))))

    @pytest.mark.skipif(REAL_NODES, reason="pretended nodes")
    def test_one_rank_per_node_runs_the_direct_schedule(self):
        xs = random_rows(500, 13)
        buf = xs[RANK].copy()
        with settings(WA_NODE_SIZE=1, WA_HIER_MIN_BYTES=0):
            with WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=1) as wa:
                info = wa.allreduce(late="merge")
        assert info.nodes == 0
        assert bitwise(buf, direct_mean(xs, list(range(SIZE))))

    @pytest.mark.parametrize("env", [{"WA_NODE_SIZE": "two"}, {"WA_HIERARCHY": "yes"},
                                     {"WA_HIER_MIN_BYTES": "-1"}])
    def test_a_bad_setting_is_refused_on_every_rank_with_one_line(self, env):
        buf = np.zeros(8, np.float32)
        with settings(**env):
            with pytest.raises(ValueError, match="WA_HIERARCHY must be 'auto' or 'off'") as err:
                WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=1)
        assert "\n" not in str(err.value)

    @pytest.mark.skipif(SIZE < 2, reason="needs two ranks")
    def test_settings_that_differ_between_ranks_are_refused_not_hung(self):
        buf = np.zeros(8, np.float32)
        with settings(WA_HIER_MIN_BYTES=4096 if RANK == 0 else 8192):
            with pytest.raises(ValueError, match="differ between rank"):
                WaitAvoidingAllreduce(self.COMM, buf, group_size=1, sync_period=1, timeout=20)
