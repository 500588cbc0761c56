"""Multi-rank specification of the node sum (``wagma_rl.optim.node_sum``) and AllreduceSGD's
``exchange="node"`` (every rank, under mpiexec; launched by tests/test_optim_mpi.py at 2, 3 and
4 ranks, on cpu: an MPI shared window; on a GPU machine the same cases run on cuda too: CUDA IPC).

Every element of the node sum is added in rank order by one rank, so the result must equal, to
the bit, the float32 sum of every rank's values in rank order, on every rank.
"""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from wagma_rl.bounded_comm import BoundedComm
from wagma_rl.optim import AllreduceSGD
from wagma_rl.optim.finite import NonFiniteError
from wagma_rl.optim.node_sum import NodeSum

torch.set_num_threads(1)
COMM = MPI.COMM_WORLD
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: the ranks share a GPU's memory through IPC"))]


def rank_order_sum(rows: np.ndarray) -> np.ndarray:
    """float32 sum of the rows, added in rank order."""
    out = rows[0].astype(np.float32).copy()
    for row in rows[1:]:
        out += row
    return out


def gathered(values: np.ndarray) -> np.ndarray:
    rows = np.empty((COMM.size,) + values.shape, dtype=values.dtype)
    COMM.Allgather(values, rows)
    return rows


@pytest.fixture(scope="module")
def bounded():
    b = BoundedComm(COMM, timeout=60)
    yield b
    b.free()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("numel", [1, 2, 3, 5, 1000, 100_003])
def test_node_sum_is_the_rank_order_sum_to_the_bit(bounded, numel, device):
    node = NodeSum(bounded, bounded.comm, numel, device)
    try:
        g = np.random.default_rng(1000 + 17 * COMM.rank + numel)
        for _ in range(4):  # rounds reuse the buffers: each must see only its own values
            values = (g.standard_normal(numel) * 10.0 ** g.integers(-3, 4, numel)).astype(np.float32)
            node.mine.copy_(torch.from_numpy(values))
            got = node.sum_().cpu().numpy().copy()
            expected = rank_order_sum(gathered(values))
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, expected)
            # Every rank holds the same bits.
            np.testing.assert_array_equal(gathered(got), np.broadcast_to(got, (COMM.size, numel)))
    finally:
        node.close()


def mlp():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(7, 33), torch.nn.BatchNorm1d(33), torch.nn.Tanh(),
                               torch.nn.Linear(33, 4), torch.nn.Linear(4, 1))


def local_batch(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(50 + 7 * COMM.rank + 1000 * step)
    return torch.randn(6, 7, generator=g)


@pytest.mark.parametrize("device", DEVICES)
def test_node_gradients_are_the_rank_order_average(device):
    """reduce_gradients() with exchange="node": each gradient is the rank-order float32 sum of
    the ranks' gradients divided by the number of ranks, exactly; buffers are averaged too."""
    model = mlp().to(device)
    opt = AllreduceSGD(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), comm=COMM,
                       buffers=list(model.buffers()), exchange="node")
    try:
        for step in range(3):
            model(local_batch(step).to(device)).pow(2).mean().backward()
            local = [p.grad.detach().cpu().numpy().reshape(-1).copy() for p in model.parameters()]
            running = model[1].running_mean.cpu().numpy().copy()
            opt.reduce_gradients()
            for p, mine in zip(model.parameters(), local):
                expected = rank_order_sum(gathered(mine)) / np.float32(COMM.size)
                np.testing.assert_array_equal(p.grad.cpu().numpy().reshape(-1), expected)
            np.testing.assert_allclose(model[1].running_mean.cpu().numpy(),
                                       gathered(running).mean(axis=0), rtol=1e-6, atol=1e-7)
            opt.step()
            opt.zero_grad()
        assert opt.stats.averages == 3
        # No host copy of the gradients: the host buffer holds the tail [buffers | flags] only.
        n_buf = sum(b.numel() for b in model.buffers() if torch.is_floating_point(b))
        n_par = len(list(model.parameters()))
        assert opt._grad.numel() == n_buf + n_par + 2 * COMM.size
    finally:
        opt.close()


def test_node_training_keeps_the_replicas_identical():
    model = mlp()
    opt = AllreduceSGD(torch.optim.Adam(model.parameters(), lr=0.01), comm=COMM, exchange="node")
    try:
        for step in range(5):
            model(local_batch(step)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
        np.testing.assert_array_equal(gathered(flat), np.broadcast_to(flat, (COMM.size, flat.size)))
    finally:
        opt.close()


def test_node_a_parameter_without_gradient_anywhere_keeps_none_and_one_with_some():
    """A parameter only rank 0 computes a gradient for gets (its gradient + zeros) / ranks; one
    nobody computes keeps grad None, as on the mpi path."""
    torch.manual_seed(3)
    used, partly, unused = (torch.nn.Parameter(torch.randn(4)) for _ in range(3))
    opt = AllreduceSGD(torch.optim.SGD([used, partly, unused], lr=0.1), comm=COMM, exchange="node")
    try:
        loss = (used * (COMM.rank + 1)).sum()
        if COMM.rank == 0:
            loss = loss + (partly * 3).sum()
        loss.backward()
        opt.reduce_gradients()
        n = COMM.size
        expected_used = np.float32(sum(range(1, n + 1))) / np.float32(n)
        np.testing.assert_array_equal(used.grad.numpy(), np.full(4, expected_used, np.float32))
        np.testing.assert_array_equal(partly.grad.numpy(), np.full(4, np.float32(3) / np.float32(n)))
        assert unused.grad is None
    finally:
        opt.close()


@pytest.mark.parametrize("mode", ["raise", "drop"])
def test_node_a_rank_with_nan_gradients(mode):
    """Rank 1's gradients hold NaN: "raise" raises on every rank before any step; "drop" averages
    the others' gradients exactly (rank order, rank 1 contributing zeros)."""
    model = torch.nn.Linear(3, 2)
    torch.nn.init.constant_(model.weight, 0.5)
    torch.nn.init.constant_(model.bias, 0.25)
    opt = AllreduceSGD(torch.optim.SGD(model.parameters(), lr=0.1), comm=COMM, exchange="node",
                       nonfinite=mode)
    try:
        x = torch.full((2, 3), float(COMM.rank + 1))
        model(x).sum().backward()
        if COMM.rank == 1:
            model.weight.grad[0, 0] = float("nan")
        mine = model.weight.grad.numpy().reshape(-1).copy()
        if mode == "raise":
            with pytest.raises(NonFiniteError):
                opt.step()
            return
        opt.reduce_gradients()
        rows = gathered(mine)
        rows[1] = 0
        expected = rank_order_sum(rows) / np.float32(COMM.size - 1)
        np.testing.assert_array_equal(model.weight.grad.numpy().reshape(-1), expected)
    finally:
        opt.close()


def test_node_exchange_refuses_buckets_and_mixed_devices():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="without buckets"):
        AllreduceSGD(torch.optim.SGD(model.parameters(), lr=0.1), comm=COMM, exchange="node",
                     bucket_bytes=2**20)
    with pytest.raises(ValueError, match="'auto', 'mpi' or 'node'"):
        AllreduceSGD(torch.optim.SGD(model.parameters(), lr=0.1), comm=COMM, exchange="shm")


def trained_params(device: str, **kw) -> tuple[str, np.ndarray]:
    """The exchange taken and the model after 3 AllreduceSGD steps with these options (the same
    batches every call)."""
    model = mlp().to(device)
    opt = AllreduceSGD(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), comm=COMM,
                       buffers=list(model.buffers()), **kw)
    try:
        for step in range(3):
            model(local_batch(step).to(device)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        taken = opt.exchange
    finally:
        opt.close()
    return taken, torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]).numpy()


@pytest.mark.parametrize("device", DEVICES)
def test_auto_takes_node_on_a_shared_gpu_and_mpi_on_cpu(device):
    """exchange="auto" (the default) is "node" where the ranks share one GPU and "mpi" on cpu
    (no buckets there either), and trains to the same bits as the exchange it took."""
    taken, auto = trained_params(device)
    want = "node" if device == "cuda" else "mpi"
    assert taken == want
    _, explicit = trained_params(device, exchange=want)
    np.testing.assert_array_equal(auto, explicit)
    # Buckets asked for on a GPU keep MPI (the node sum has none).
    if device == "cuda":
        assert trained_params(device, bucket_bytes=2**20)[0] == "mpi"
