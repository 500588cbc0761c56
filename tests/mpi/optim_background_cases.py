"""Multi-rank specification of the background model averages (``background=True``) of WAGMA,
LocalSGD and DPSGD (every rank, under mpiexec; launched by tests/test_optim_mpi.py at 2 and 4
ranks).

In the background the next gradient is computed at the model a rank contributed, not at the
average, so the two schedules are equal exactly where the gradient does not depend on the
parameters: a real forward and backward pass of a linear loss (``model(x).sum()``, whose gradient
is the batch's sum) with integer data, dyadic learning rates and integer buffer updates, so every
value is exact in float32 and the parameters must be equal to the bit.
"""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from wagma_rl.optim import DPSGD, WAGMA, LocalSGD
from wagma_rl.optim.finite import NonFiniteError

torch.set_num_threads(1)

STEPS = 6


class Linear(torch.nn.Module):
    """A linear layer and a buffer the forward pass updates in place (as BatchNorm's running
    statistics), by an integer that depends on the rank."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.arange(8.0).view(2, 4))
            self.lin.bias.fill_(1.0)
        self.register_buffer("running", torch.zeros(3))

    def forward(self, x):
        with torch.no_grad():
            self.running.add_(float(MPI.COMM_WORLD.rank + 1))
        return self.lin(x)


def batches(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7 + rank)
    return [torch.randint(-3, 4, (2, 4), generator=g).float() for _ in range(STEPS)]


def state_vector(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([t.detach().reshape(-1) for t in model.state_dict().values()]).numpy().copy()


OPTIMIZERS = {
    "local_sgd": (LocalSGD, {"local_steps": 1}),
    "local_sgd_every_2": (LocalSGD, {"local_steps": 2}),
    "dpsgd": (DPSGD, {}),
    "wagma_global": (WAGMA, {"group_size": 2, "sync_period": 1}),  # every average blocking, global
}


def train(cls, kw, *, background: bool, comm) -> tuple[torch.nn.Module, object]:
    model = Linear()
    opt = cls(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5), comm=comm,
              buffers=model.buffers(), background=background, **kw)
    for x in batches(comm.rank):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


class TestBackgroundAverages:
    COMM = MPI.COMM_WORLD

    @pytest.mark.parametrize("name", sorted(OPTIMIZERS))
    def test_background_equals_blocking_where_the_gradient_does_not_depend_on_the_parameters(self, name):
        cls, kw = OPTIMIZERS[name]
        blocking, a = train(cls, kw, background=False, comm=self.COMM)
        background, b = train(cls, kw, background=True, comm=self.COMM)
        assert b._inflight is not None or kw.get("local_steps") == 2  # the last average is in flight
        b.wait_average()
        params = lambda m: torch.cat([p.detach().reshape(-1) for p in m.parameters()]).numpy()
        assert np.array_equal(params(background), params(blocking))
        if name == "dpsgd" and self.COMM.size > 2:
            # Means of three models are rounded, so the buffers' late rule (average + (buffer
            # now - buffer contributed)) rounds differently from averaging the updated buffer.
            np.testing.assert_allclose(background.running.numpy(), blocking.running.numpy(), rtol=3e-7)
        else:
            assert np.array_equal(state_vector(background), state_vector(blocking))
        assert b.stats.averages == a.stats.averages and b.stats.steps == a.stats.steps == STEPS
        assert "background_exchange_s" in b.stats.extra and "background_exchange_s" not in a.stats.extra
        a.close(), b.close()

    def test_parameters_hold_the_contributed_model_until_the_next_step_takes_the_average(self):
        size, rank = self.COMM.size, self.COMM.rank
        model = torch.nn.Linear(3, 1, bias=False)
        torch.nn.init.zeros_(model.weight)
        opt = LocalSGD(torch.optim.SGD(model.parameters(), lr=1.0), local_steps=1, comm=self.COMM,
                       background=True)
        model.weight.grad = torch.full_like(model.weight, -4.0 * rank)
        opt.step()
        assert torch.all(model.weight.detach() == 4.0 * rank)  # not yet averaged
        opt.state_dict()  # takes the average in flight first
        assert torch.all(model.weight.detach() == 2.0 * (size - 1)) and opt._inflight is None
        opt.close()

    def test_wagma_group_averages_in_the_background_conserve_the_sum_of_the_models(self):
        """Late rule apply: whoever is late, the sum over the ranks holds every local step."""
        size, rank = self.COMM.size, self.COMM.rank
        model = torch.nn.Linear(4, 1, bias=False)
        torch.nn.init.zeros_(model.weight)  # integers and halves from here: every sum is exact
        opt = WAGMA(torch.optim.SGD(model.parameters(), lr=1.0), group_size=2, sync_period=100,
                    late="apply", comm=self.COMM, background=True)
        start = model.weight.detach().clone()
        steps = torch.zeros_like(start)
        for t in range(STEPS):
            g = torch.full_like(start, float((rank + 1) * (t + 1) % 5 - 2))
            model.weight.grad = g
            steps -= g
            opt.step()
        opt.wait_average()
        total = self.COMM.allreduce(model.weight.detach().numpy().astype(np.float64))
        want = size * start.numpy().astype(np.float64) + self.COMM.allreduce(steps.numpy().astype(np.float64))
        assert np.array_equal(total, want)
        assert opt.stats.averages == STEPS
        opt.close()

    def test_synchronize_and_state_dict_see_every_average_started(self):
        model = torch.nn.Linear(4, 1)
        opt = WAGMA(torch.optim.SGD(model.parameters(), lr=0.5), group_size=2, sync_period=100,
                    late="apply", comm=self.COMM, background=True)
        for t in range(STEPS):
            for p in model.parameters():
                p.grad = torch.full_like(p, float(self.COMM.rank - t))
            opt.step()
        state = opt.state_dict()  # waits for the last one: the schedule counts all of them
        assert state["wrapper"]["iteration"] == STEPS and opt.stats.averages == STEPS
        opt.synchronize()
        w = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
        assert all(np.array_equal(w, other) for other in self.COMM.allgather(w))
        opt.close()

    def test_a_parameter_written_while_the_average_is_in_flight_is_refused_in_one_line(self):
        model = torch.nn.Linear(3, 1)
        opt = LocalSGD(torch.optim.SGD(model.parameters(), lr=1.0), local_steps=1, comm=self.COMM,
                       background=True)
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        with torch.no_grad():
            model.bias.add_(1.0)
        with pytest.raises(RuntimeError, match=r"^rank \d+: parameter 1 was written while its "
                                               r"background average was in flight.*wait_average\(\)"):
            opt.step()
        opt.close()

    def test_a_non_finite_model_raises_on_every_rank_at_the_next_step(self):
        model = torch.nn.Linear(3, 1)
        opt = DPSGD(torch.optim.SGD(model.parameters(), lr=1.0), comm=self.COMM, background=True)
        model.weight.grad = torch.full_like(model.weight, float("nan") if self.COMM.rank == 0 else 1.0)
        model.bias.grad = torch.zeros_like(model.bias)
        opt.step()  # the gossip that finds the NaN runs on the thread
        with pytest.raises(NonFiniteError, match="rank"):
            opt.step()
        opt.close()

    @pytest.mark.parametrize("cls,kw", [(WAGMA, {"group_size": 1, "sync_period": 2}),
                                        (LocalSGD, {"local_steps": 1}), (DPSGD, {})])
    def test_background_must_be_a_bool(self, cls, kw):
        with pytest.raises(ValueError, match="background must be True or False"):
            cls(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0), comm=self.COMM,
                background="yes", **kw)
