"""``exchange="node"`` when the ranks span several nodes (every rank, under mpiexec): two even
nodes (:class:`TestEvenNodes`) make the sum hierarchical (each node's rank-order sum, then the two
nodes' sums added, which is exact for two operands); nodes of 2 and 1 make every rank refuse
alike, and the job's collectives go on.

Launched by tests/test_optim_mpi.py with MPICH's ``MPIR_CVAR_NUM_CLIQUES=2``, which splits this
machine's ranks into two "nodes" (odd and even ranks) for ``MPI_COMM_TYPE_SHARED``, at 4 and 6
ranks (even) and 3 (uneven), and by tests/test_cluster.py across two namespaced nodes (2 x 2,
ranks 0-1 and 2-3, TCP between them)."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from wagma_rl.bounded_comm import BoundedComm
from wagma_rl.config import ConfigError
from wagma_rl.optim import AllreduceSGD, AveragingConfig, allreduce_sgd
from wagma_rl.optim.node_sum import NodeSum

torch.set_num_threads(1)
COMM = MPI.COMM_WORLD


def nodes() -> list[list[int]]:
    """The job ranks of each node, nodes in the order of their lowest rank."""
    node = COMM.Split_type(MPI.COMM_TYPE_SHARED, key=COMM.rank)
    try:
        mine = node.allgather(COMM.rank)
    finally:
        node.Free()
    return sorted({tuple(m) for m in COMM.allgather(mine)})


def expected_sum(rows: np.ndarray) -> np.ndarray:
    """Each node's float32 sum in rank order, then the nodes' sums added (two nodes: either order
    gives the same bits)."""
    total = None
    for members in nodes():
        part = rows[members[0]].astype(np.float32).copy()
        for r in members[1:]:
            part += rows[r]
        total = part if total is None else total + part
    return total


def gathered(values: np.ndarray) -> np.ndarray:
    rows = np.empty((COMM.size,) + values.shape, dtype=values.dtype)
    COMM.Allgather(values, rows)
    return rows


class TestEvenNodes:
    def test_two_even_nodes(self):
        assert [len(m) for m in nodes()] == [COMM.size // 2] * 2

    @pytest.mark.parametrize("numel", [1, 5, 1001, 65_537])
    def test_the_hierarchical_sum_is_exact_on_every_rank(self, numel):
        hierarchical_sum_is_exact(numel)

    def test_allreduce_sgd_across_the_nodes_averages_exactly(self):
        allreduce_sgd_averages_exactly()


def hierarchical_sum_is_exact(numel: int) -> None:
    bounded = BoundedComm(COMM, timeout=60)
    node = NodeSum(bounded, bounded.comm, numel, "cpu")
    try:
        assert node.nodes == 2
        g = np.random.default_rng(77 + COMM.rank + numel)
        for _ in range(3):
            values = (g.standard_normal(numel) * 10.0 ** g.integers(-3, 4, numel)).astype(np.float32)
            node.mine.copy_(torch.from_numpy(values))
            got = node.sum_().numpy().copy()
            np.testing.assert_array_equal(got, expected_sum(gathered(values)))
            np.testing.assert_array_equal(gathered(got), np.broadcast_to(got, (COMM.size, numel)))
    finally:
        node.close()
        bounded.free()


def allreduce_sgd_averages_exactly() -> None:
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(5, 9), torch.nn.Tanh(), torch.nn.Linear(9, 2))
    opt = AllreduceSGD(torch.optim.SGD(model.parameters(), lr=0.1), comm=COMM, exchange="node")
    try:
        g = torch.Generator().manual_seed(COMM.rank)
        model(torch.randn(4, 5, generator=g)).pow(2).sum().backward()
        local = [p.grad.numpy().reshape(-1).copy() for p in model.parameters()]
        opt.reduce_gradients()
        for p, mine in zip(model.parameters(), local):
            np.testing.assert_array_equal(p.grad.numpy().reshape(-1),
                                          expected_sum(gathered(mine)) / np.float32(COMM.size))
    finally:
        opt.close()


def test_uneven_nodes_every_rank_refuses_and_the_job_goes_on():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"exchange='node' needs the same number of ranks on every "
                                         r"node, found \[1, 2\] ranks per node: use exchange='mpi'"):
        AllreduceSGD(torch.optim.SGD(model.parameters(), lr=0.1), comm=COMM, exchange="node")
    spec = AveragingConfig(name="allreduce", exchange="node")
    with pytest.raises(ConfigError, match=r"config key 'averaging.exchange': .*use exchange='mpi'"):
        spec.build(torch.optim.SGD(model.parameters(), lr=0.1), comm=COMM)
    # Nobody was left waiting: the ranks still meet.
    total = np.array([COMM.rank], dtype=np.int64)
    COMM.Allreduce(MPI.IN_PLACE, total)
    assert int(total[0]) == sum(range(COMM.size))


def test_uneven_nodes_auto_falls_back_to_mpi_on_every_rank(monkeypatch):
    """exchange="auto" tries the node sum only for parameters on a GPU; made to try it here on
    cpu, the uneven nodes refuse it on every rank alike and every rank takes MPI (with buckets'
    default and a note saying why), training the same bits as exchange="mpi"."""
    monkeypatch.setattr(allreduce_sgd, "wants_node", lambda params: True)
    runs = {}
    for exchange in ("auto", "mpi"):
        torch.manual_seed(4)
        model = torch.nn.Sequential(torch.nn.Linear(5, 9), torch.nn.Tanh(), torch.nn.Linear(9, 2))
        opt = AllreduceSGD(torch.optim.SGD(model.parameters(), lr=0.1), comm=COMM, exchange=exchange)
        try:
            assert opt.exchange == "mpi"
            if exchange == "auto":
                assert opt.exchange_note.startswith("exchange='auto' took 'mpi': exchange='node' "
                                                    "needs the same number of ranks on every node")
                assert opt.bucket_bytes == 0  # cpu's default
            g = torch.Generator().manual_seed(COMM.rank)
            for _ in range(2):
                model(torch.randn(4, 5, generator=g)).pow(2).sum().backward()
                opt.step()
                opt.zero_grad()
        finally:
            opt.close()
        runs[exchange] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.testing.assert_array_equal(runs["auto"], runs["mpi"])
