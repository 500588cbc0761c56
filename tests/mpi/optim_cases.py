"""Multi-rank specification of the synchronous optimizers (run on every rank under mpiexec).

Launched by tests/test_optim_mpi.py at 2, 3 and 4 ranks. Values are integers and SGD runs with
lr=1, so every average is exact and compared with ``==``.
"""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from wagma_rl.optim import DPSGD, AllreduceSGD, LocalSGD

torch.set_num_threads(1)


def make_linear(rank_value: float, n_in: int = 3, n_out: int = 2) -> torch.nn.Linear:
    """A linear layer whose weights and bias all equal ``rank_value``."""
    m = torch.nn.Linear(n_in, n_out)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(rank_value)
    return m


def set_grads(model: torch.nn.Module, value: float) -> None:
    for p in model.parameters():
        p.grad = torch.full_like(p, value)


def params_vector(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


class TestConstruction:
    COMM = MPI.COMM_WORLD

    @pytest.mark.parametrize("cls,kw", [(AllreduceSGD, {}), (LocalSGD, {"local_steps": 2}), (DPSGD, {})])
    def test_broadcasts_rank0_parameters(self, cls, kw):
        model = make_linear(float(self.COMM.rank + 5))
        opt = cls(torch.optim.SGD(model.parameters(), lr=1.0), comm=self.COMM, **kw)
        assert np.all(params_vector(model) == 5.0)
        opt.close()

    @pytest.mark.parametrize("cls,kw", [(LocalSGD, {"local_steps": 2}), (DPSGD, {})])
    def test_model_averaging_optimizers_leave_gradients_alone_in_reduce_gradients(self, cls, kw):
        model = make_linear(0.0)
        opt = cls(torch.optim.SGD(model.parameters(), lr=1.0), comm=self.COMM, **kw)
        set_grads(model, float(self.COMM.rank))
        opt.reduce_gradients()
        assert all(torch.all(p.grad == float(self.COMM.rank)) for p in model.parameters())
        assert opt.stats.averages == 0
        opt.close()

    def test_shape_mismatch_raises_on_every_rank(self):
        if self.COMM.size == 1:
            pytest.skip("needs two ranks")
        model = make_linear(1.0, n_in=3 + (self.COMM.rank == self.COMM.size - 1))
        with pytest.raises(ValueError, match="same shapes"):
            LocalSGD(torch.optim.SGD(model.parameters(), lr=1.0), local_steps=1, comm=self.COMM)

    def test_different_options_raise_on_every_rank(self):
        if self.COMM.size == 1:
            pytest.skip("needs two ranks")
        model = make_linear(1.0)
        with pytest.raises(ValueError, match="differ from rank 0"):
            LocalSGD(torch.optim.SGD(model.parameters(), lr=1.0), local_steps=1 + self.COMM.rank,
                     comm=self.COMM)

    def test_sparse_gradient_raises_on_every_rank(self):
        emb = torch.nn.Embedding(10, 4, sparse=True)
        opt = LocalSGD(torch.optim.SGD(emb.parameters(), lr=1.0), local_steps=1, comm=self.COMM)
        emb(torch.tensor([1, 2])).sum().backward()
        with pytest.raises(RuntimeError, match="sparse gradient"):
            opt.step()
        opt.close()

    def test_parameter_added_after_construction_raises(self):
        model = make_linear(1.0)
        extra = torch.nn.Parameter(torch.zeros(3))
        opt = LocalSGD(torch.optim.SGD(model.parameters(), lr=1.0), local_steps=1, comm=self.COMM)
        with pytest.raises(RuntimeError, match="after construction"):
            opt.add_param_group({"params": [extra]})
        opt.optimizer.add_param_group({"params": [extra]})
        set_grads(model, 1.0)
        with pytest.raises(RuntimeError, match="after construction"):
            opt.step()
        opt.close()


class TestAllreduceSGD:
    COMM = MPI.COMM_WORLD

    def test_equals_single_process_on_union_of_batches(self):
        size, rank, local = self.COMM.size, self.COMM.rank, 4
        g = torch.Generator().manual_seed(7)
        xs = torch.randn(5, size * local, 6, generator=g)
        ys = torch.randn(5, size * local, 1, generator=g)

        def model_fn():
            torch.manual_seed(3)
            return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

        dist_model, single = model_fn(), model_fn()
        opt = AllreduceSGD(torch.optim.SGD(dist_model.parameters(), lr=0.1, momentum=0.9), comm=self.COMM)
        ref = torch.optim.SGD(single.parameters(), lr=0.1, momentum=0.9)
        for x, y in zip(xs, ys):
            mine = slice(rank * local, (rank + 1) * local)
            torch.nn.functional.mse_loss(dist_model(x[mine]), y[mine]).backward()
            opt.step()
            opt.zero_grad()
            torch.nn.functional.mse_loss(single(x), y).backward()
            ref.step()
            ref.zero_grad()
        np.testing.assert_allclose(params_vector(dist_model), params_vector(single), rtol=1e-5, atol=1e-6)
        opt.close()

    def test_gradient_is_the_mean_over_ranks(self):
        model = make_linear(0.0)
        opt = AllreduceSGD(torch.optim.SGD(model.parameters(), lr=1.0), comm=self.COMM)
        set_grads(model, float(self.COMM.rank * 2))
        opt.step()
        expected = -np.float32(sum(2.0 * r for r in range(self.COMM.size)) / self.COMM.size)
        assert np.all(params_vector(model) == expected)
        opt.close()

    def test_parameter_without_gradient_anywhere_keeps_none(self):
        model = torch.nn.ModuleDict({"used": make_linear(0.0), "unused": make_linear(0.0)})
        opt = AllreduceSGD(torch.optim.SGD(model.parameters(), lr=1.0, weight_decay=0.5), comm=self.COMM)
        set_grads(model["used"], 1.0)
        opt.step()
        assert all(p.grad is None for p in model["unused"].parameters())
        assert np.all(params_vector(model["unused"]) == 0.0)
        opt.close()

    def test_reduce_gradients_then_step_averages_once(self):
        size, rank = self.COMM.size, self.COMM.rank
        model = make_linear(0.0)
        opt = AllreduceSGD(torch.optim.SGD(model.parameters(), lr=1.0), comm=self.COMM)
        set_grads(model, float(rank * 2))
        opt.reduce_gradients()
        mean = np.float32(sum(2.0 * r for r in range(size)) / size)
        assert all(torch.all(p.grad == mean) for p in model.parameters())
        # A change after the reduction reaches the step unaveraged: the step does not average again.
        for p in model.parameters():
            p.grad += float(rank)
        opt.step()
        assert np.all(params_vector(model) == -(mean + np.float32(rank)))
        assert (opt.stats.steps, opt.stats.averages) == (1, 1)
        set_grads(model, float(rank * 2))  # a plain step() after it averages as before
        opt.step()
        assert np.all(params_vector(model) == -(mean + np.float32(rank)) - mean)
        assert (opt.stats.steps, opt.stats.averages) == (2, 2)
        opt.close()

    def test_clip_between_reduce_and_step_clips_the_averaged_gradient(self):
        # Rank r's gradient is 10 e_r: averaged, 10/size in every entry (norm 10/sqrt(size)), so
        # clipped to norm 2 each entry is 2/sqrt(size); clipping each rank's gradient before the
        # average would give 2/size.
        size, rank = self.COMM.size, self.COMM.rank
        p = torch.nn.Parameter(torch.zeros(size))
        opt = AllreduceSGD(torch.optim.SGD([p], lr=1.0), comm=self.COMM)
        p.grad = torch.zeros(size)
        p.grad[rank] = 10.0
        opt.reduce_gradients()
        norm = torch.nn.utils.clip_grad_norm_([p], 2.0)
        opt.step()
        assert float(norm) == pytest.approx(10.0 / np.sqrt(size), rel=1e-6)
        torch.testing.assert_close(p.detach(), torch.full((size,), -2.0 / np.sqrt(size)),
                                   rtol=1e-6, atol=0)
        opt.close()

    def test_reduce_gradients_twice_before_a_step_is_an_error(self):
        model = make_linear(0.0)
        opt = AllreduceSGD(torch.optim.SGD(model.parameters(), lr=1.0), comm=self.COMM)
        set_grads(model, 1.0)
        opt.reduce_gradients()
        with pytest.raises(RuntimeError, match="twice before step"):
            opt.reduce_gradients()
        opt.close()

    def test_averages_buffers_every_step(self):
        bn = torch.nn.BatchNorm1d(3)
        opt = AllreduceSGD(torch.optim.SGD(bn.parameters(), lr=1.0), comm=self.COMM, buffers=bn.buffers())
        bn.running_mean.fill_(float(self.COMM.rank))
        set_grads(bn, 0.0)
        opt.step()
        assert torch.all(bn.running_mean == np.float32(sum(range(self.COMM.size)) / self.COMM.size))
        opt.close()


class TestLocalSGD:
    COMM = MPI.COMM_WORLD

    def test_averages_exactly_on_its_period_and_not_otherwise(self):
        size, rank, period = self.COMM.size, self.COMM.rank, 3
        model = make_linear(0.0)
        opt = LocalSGD(torch.optim.SGD(model.parameters(), lr=1.0), local_steps=period, comm=self.COMM)
        # Every rank tracks what every rank's model would be, to know the exact expected values.
        models = np.zeros(size, dtype=np.float32)
        for step in range(1, 2 * period + 1):
            set_grads(model, -float(rank + 1))
            opt.step()
            models += np.arange(1, size + 1, dtype=np.float32)
            if step % period == 0:
                models[:] = np.float32(models.sum() / np.float32(size))
            assert np.all(params_vector(model) == models[rank]), f"step {step}"
            assert opt.stats.averages == step // period
        opt.close()

    def test_state_dict_round_trip_continues_the_schedule(self):
        model = make_linear(0.0)
        opt = LocalSGD(torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.5), local_steps=3, comm=self.COMM)
        for _ in range(2):
            set_grads(model, -float(self.COMM.rank + 1))
            opt.step()
        saved = opt.state_dict()
        opt.close()
        resumed = LocalSGD(torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.5), local_steps=3, comm=self.COMM)
        resumed.load_state_dict(saved)
        assert resumed.stats.steps == 2
        assert len(resumed.state) == len(list(model.parameters()))  # momentum buffers came back
        set_grads(model, -float(self.COMM.rank + 1))
        resumed.step()  # the third step of the schedule: averages
        assert resumed.stats.averages == 1
        vec = params_vector(model)
        assert np.all(self.COMM.allgather(vec[0]) == vec[0])
        resumed.close()

    def test_buffers_are_averaged_with_the_parameters(self):
        bn = torch.nn.BatchNorm1d(2)
        opt = LocalSGD(torch.optim.SGD(bn.parameters(), lr=1.0), local_steps=1, comm=self.COMM, buffers=bn.buffers())
        bn.running_var.fill_(float(2 * self.COMM.rank))
        set_grads(bn, 0.0)
        opt.step()
        assert torch.all(bn.running_var == np.float32(sum(2 * r for r in range(self.COMM.size)) / self.COMM.size))
        opt.close()


class TestDPSGD:
    COMM = MPI.COMM_WORLD

    def test_step_averages_with_left_and_right_neighbours(self):
        size, rank = self.COMM.size, self.COMM.rank
        model = make_linear(0.0)
        opt = DPSGD(torch.optim.SGD(model.parameters(), lr=1.0), comm=self.COMM)
        set_grads(model, -float(10 * rank))
        opt.step()
        members = sorted({rank, (rank - 1) % size, (rank + 1) % size})
        total = np.float32(0)
        for m in members:
            total += np.float32(10 * m)
        assert np.all(params_vector(model) == total / np.float32(len(members)))
        opt.close()


class TestSynchronize:
    COMM = MPI.COMM_WORLD

    @pytest.mark.parametrize("cls,kw", [(AllreduceSGD, {}), (LocalSGD, {"local_steps": 100}), (DPSGD, {})])
    def test_parameters_bitwise_identical_and_equal_the_mean(self, cls, kw):
        size, rank = self.COMM.size, self.COMM.rank
        model = make_linear(0.0, n_in=5)
        opt = cls(torch.optim.SGD(model.parameters(), lr=1.0), comm=self.COMM, **kw)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.arange(p.numel(), dtype=torch.float32).view_as(p) * (rank + 1) / 7)
        before = np.stack(self.COMM.allgather(params_vector(model)))
        opt.synchronize()
        after = params_vector(model)
        everyone = np.stack(self.COMM.allgather(after))
        assert np.all(everyone == after)
        np.testing.assert_allclose(after, before.mean(axis=0), rtol=1e-6)
        opt.close()


def integer_mlp() -> torch.nn.Sequential:
    """Three linear layers with small integer weights: with integer inputs every gradient is an
    integer, so any order of summation gives the same float32 sums."""
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 5), torch.nn.Linear(5, 2))
    with torch.no_grad():
        for i, p in enumerate(m.parameters()):
            p.copy_(torch.arange(p.numel(), dtype=torch.float32).view(p.shape) % 3 - i % 2)
    return m


def random_mlp() -> torch.nn.Sequential:
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                               torch.nn.Tanh(), torch.nn.Linear(16, 1))


class TestAllreduceBuckets:
    """The bucketed average (started from backward hooks) against the plain one (bucket_bytes=0)."""

    COMM = MPI.COMM_WORLD
    SMALL = 64  # bytes: 16 floats, so every layer's weight or bias is a bucket or part of one

    def pair(self, make, **kw):
        bucketed, plain = make(), make()
        a = AllreduceSGD(torch.optim.SGD(bucketed.parameters(), lr=1.0), comm=self.COMM,
                         bucket_bytes=self.SMALL, **kw)
        b = AllreduceSGD(torch.optim.SGD(plain.parameters(), lr=1.0), comm=self.COMM,
                         bucket_bytes=0, **kw)
        return bucketed, a, plain, b

    def integer_batch(self, rank: int) -> torch.Tensor:
        return torch.arange(6, dtype=torch.float32).view(2, 3) * (rank + 1) - rank

    def test_buckets_leave_during_backward_and_equal_the_plain_average_exactly(self):
        bucketed, a, plain, b = self.pair(integer_mlp)
        for model, opt in ((bucketed, a), (plain, b)):
            model(self.integer_batch(self.COMM.rank)).sum().backward()
            opt.step()
        assert np.array_equal(params_vector(bucketed), params_vector(plain))
        assert a.stats.extra["buckets"] > 2
        assert a.stats.extra["buckets_in_backward"] == a.stats.extra["buckets"]
        assert "bucket_fallbacks" not in a.stats.extra
        a.close(), b.close()

    def test_bucketed_gradient_is_the_exact_mean_of_the_ranks_gradients(self):
        model = integer_mlp()
        opt = AllreduceSGD(torch.optim.SGD(model.parameters(), lr=1.0), comm=self.COMM,
                           bucket_bytes=self.SMALL)
        expected = []
        for r in range(self.COMM.size):  # every rank's gradient, computed here in float64
            ref = integer_mlp().double()
            ref(self.integer_batch(r).double()).sum().backward()
            expected.append(torch.cat([p.grad.reshape(-1) for p in ref.parameters()]))
        model(self.integer_batch(self.COMM.rank)).sum().backward()
        opt.reduce_gradients()
        got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        assert torch.equal(got, (torch.stack(expected).sum(0) / self.COMM.size).float())
        opt.close()

    def test_real_valued_gradients_equal_the_plain_average(self):
        """Bitwise at 2 ranks (a + b = b + a); at 3 or more MPI may add a bucket in another order
        than the whole buffer, so to float32 rounding."""
        bucketed, a, plain, b = self.pair(random_mlp)
        g = torch.Generator().manual_seed(100 + self.COMM.rank)
        for _ in range(3):
            x = torch.randn(4, 6, generator=g)
            for model, opt in ((bucketed, a), (plain, b)):
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        if self.COMM.size == 2:
            assert np.array_equal(params_vector(bucketed), params_vector(plain))
        else:
            np.testing.assert_allclose(params_vector(bucketed), params_vector(plain), rtol=1e-6, atol=1e-7)
        a.close(), b.close()

    def test_the_gpu_launcher_thread_gives_the_same_average(self):
        """On CUDA a thread starts the buckets as their copies complete; on cpu (copies done at
        once) it runs the same way, so its ordering and hand-over to the step are checked here."""
        bucketed, a, plain, b = self.pair(random_mlp)
        a._threaded = True
        g = torch.Generator().manual_seed(100 + self.COMM.rank)
        for _ in range(3):
            x = torch.randn(4, 6, generator=g)
            for model, opt in ((bucketed, a), (plain, b)):
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        if self.COMM.size == 2:
            assert np.array_equal(params_vector(bucketed), params_vector(plain))
        else:
            np.testing.assert_allclose(params_vector(bucketed), params_vector(plain), rtol=1e-6, atol=1e-7)
        assert "bucket_fallbacks" not in a.stats.extra
        a.close(), b.close()

    def test_an_optimizer_dropped_without_close_leaves_no_live_hook(self):
        import gc
        import weakref

        model = integer_mlp()
        opt = AllreduceSGD(torch.optim.SGD(model.parameters(), lr=1.0), comm=self.COMM,
                           bucket_bytes=self.SMALL)
        ref = weakref.ref(opt)
        del opt
        gc.collect()
        assert ref() is None
        model(self.integer_batch(self.COMM.rank)).sum().backward()  # its hooks do nothing now

    def test_clip_between_backward_and_step_is_applied_before_the_average(self):
        bucketed, a, plain, b = self.pair(integer_mlp)
        for model, opt in ((bucketed, a), (plain, b)):
            model(self.integer_batch(self.COMM.rank)).sum().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        assert np.array_equal(params_vector(bucketed), params_vector(plain))
        assert a.stats.extra["bucket_fallbacks"] == 1
        a.close(), b.close()

    def test_two_backwards_average_the_accumulated_gradient(self):
        bucketed, a, plain, b = self.pair(integer_mlp)
        for model, opt in ((bucketed, a), (plain, b)):
            for _ in range(2):
                model(self.integer_batch(self.COMM.rank)).sum().backward()
            opt.step()
        assert np.array_equal(params_vector(bucketed), params_vector(plain))
        a.close(), b.close()

    def test_no_sync_accumulates_and_the_last_backward_starts_the_buckets(self):
        bucketed, a, plain, b = self.pair(integer_mlp)
        for model, opt in ((bucketed, a), (plain, b)):
            with opt.no_sync():
                model(self.integer_batch(self.COMM.rank)).sum().backward()
            model(self.integer_batch(self.COMM.rank + 1)).sum().backward()
            opt.step()
        assert np.array_equal(params_vector(bucketed), params_vector(plain))
        assert a.stats.extra["buckets_in_backward"] == a.stats.extra["buckets"]
        assert "bucket_fallbacks" not in a.stats.extra
        a.close(), b.close()

    def test_a_rank_that_skips_a_parameter_still_averages_every_bucket(self):
        """Rank 0 leaves the first layer out of its loss: its buckets start at the step, the
        others' during backward; the averages still match (their own communicator)."""
        bucketed, a, plain, b = self.pair(integer_mlp)
        x = self.integer_batch(self.COMM.rank)
        for model, opt in ((bucketed, a), (plain, b)):
            out = model[1:](x.sum(1, keepdim=True).expand(2, 4)) if self.COMM.rank == 0 else model(x)
            out.sum().backward()
            opt.step()
        assert np.array_equal(params_vector(bucketed), params_vector(plain))
        a.close(), b.close()

    def test_a_nan_is_dropped_as_in_the_plain_average(self):
        if self.COMM.size == 1:
            pytest.skip("needs two ranks")
        bucketed, a, plain, b = self.pair(integer_mlp, nonfinite="drop")
        for model, opt in ((bucketed, a), (plain, b)):
            x = self.integer_batch(self.COMM.rank)
            if self.COMM.rank == 1:
                x[0, 0] = float("nan")
            model(x).sum().backward()
            opt.step()
        assert np.array_equal(params_vector(bucketed), params_vector(plain))
        assert np.isfinite(params_vector(bucketed)).all()
        a.close(), b.close()
