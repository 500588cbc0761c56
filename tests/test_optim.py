"""Single-process behaviour of wagma_rl.optim (a world of one rank): wrapping, checks, state, flat buffer."""
import numpy as np
import pytest
import torch

from wagma_rl.optim import (DPSGD, WAGMA, AllreduceSGD, LocalSGD, NonBlockingDPSGD, NonBlockingSGD,
                            build_optimizer)
from wagma_rl.optim.flat import FlatBuffer, pack_grads, unpack_grads

SYNC = [(AllreduceSGD, {}), (LocalSGD, {"local_steps": 2}), (DPSGD, {})]
ALL = SYNC + [(WAGMA, {"group_size": 1, "sync_period": 2}), (NonBlockingSGD, {"micro_batches": 1}),
             (NonBlockingDPSGD, {"micro_batches": 1})]


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def backward(m):
    m(torch.randn(5, 4)).pow(2).mean().backward()


class TestFlatBuffer:
    def test_view_mode_makes_parameters_views_of_the_buffer(self):
        m = model()
        before = [p.detach().clone() for p in m.parameters()]
        flat = FlatBuffer(list(m.parameters()))
        assert flat.mode == "view"
        assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
        flat.array[:] = 7.0
        assert all(bool((p == 7.0).all()) for p in m.parameters())

    def test_pack_mode_round_trips_other_dtypes(self):
        p = torch.nn.Parameter(torch.arange(6, dtype=torch.float64).view(2, 3))
        flat = FlatBuffer([p])
        assert flat.mode == "pack" and np.array_equal(flat.array, np.arange(6, dtype=np.float32))
        flat.array[:] *= 2
        flat.scatter()
        assert torch.equal(p.detach(), torch.arange(6, dtype=torch.float64).view(2, 3) * 2)

    def test_replaced_data_is_detected(self):
        m = model()
        flat = FlatBuffer(list(m.parameters()))
        m[0].weight.data = m[0].weight.data.clone()
        assert not flat.intact()

    def test_pack_and_unpack_gradients_keep_missing_ones_missing(self):
        m = model()
        m[0].weight.grad = torch.ones_like(m[0].weight)
        params = list(m.parameters())
        out = torch.empty(sum(p.numel() for p in params))
        has = pack_grads(params, out)
        assert has == [True, False, False, False] and out[12:].abs().sum() == 0
        unpack_grads(out * 3, params, keep=has)
        assert torch.equal(m[0].weight.grad, torch.full_like(m[0].weight, 3.0)) and m[2].bias.grad is None


class TestWrapping:
    @pytest.mark.parametrize("cls,kw", ALL)
    def test_lr_scheduler_steps_the_wrapped_optimizer(self, cls, kw):
        m = model()
        base = torch.optim.SGD(m.parameters(), lr=0.4, momentum=0.9)
        opt = cls(base, **kw)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        backward(m)
        if isinstance(opt, NonBlockingSGD):
            opt.micro_step()
        opt.step()
        opt.zero_grad()
        sched.step()
        assert base.param_groups[0]["lr"] == pytest.approx(0.2) and opt.param_groups is base.param_groups
        opt.close()

    @pytest.mark.parametrize("cls,kw", ALL)
    def test_one_rank_matches_the_plain_optimizer(self, cls, kw):
        m1, m2 = model(), model()
        opt = cls(torch.optim.SGD(m1.parameters(), lr=0.1, momentum=0.9), **kw)
        ref = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            torch.manual_seed(1)
            backward(m1)
            torch.manual_seed(1)
            backward(m2)
            if isinstance(opt, NonBlockingSGD):
                assert opt.micro_step()
            opt.step()
            ref.step()
            opt.zero_grad()
            ref.zero_grad()
        for a, b in zip(m1.parameters(), m2.parameters()):
            torch.testing.assert_close(a, b)
        opt.close()

    @pytest.mark.parametrize("cls,kw", ALL)
    def test_step_hooks_run_around_the_wrappers_step_and_can_be_removed(self, cls, kw):
        m = model()
        opt = cls(torch.optim.SGD(m.parameters(), lr=0.1), **kw)
        seen = []
        pre = opt.register_step_pre_hook(lambda o, a, k: seen.append(("pre", o is opt, o.stats.steps)))
        opt.register_step_post_hook(lambda o, a, k: seen.append(("post", o is opt, o.stats.steps)))
        for _ in range(2):
            backward(m)
            if isinstance(opt, NonBlockingSGD):
                opt.micro_step()
            opt.step()
            opt.zero_grad()
            pre.remove()
        assert seen == [("pre", True, 0), ("post", True, 1), ("post", True, 2)]
        opt.close()

    def test_state_dict_hooks_run_and_may_replace_the_state(self):
        m = model()
        opt = LocalSGD(torch.optim.SGD(m.parameters(), lr=0.1), local_steps=5)
        seen = []
        opt.register_state_dict_pre_hook(lambda o: seen.append("save-pre"))
        opt.register_state_dict_post_hook(lambda o, sd: {"saved": sd})
        opt.register_load_state_dict_post_hook(lambda o: seen.append("load-post"))
        sd = opt.state_dict()
        assert list(sd) == ["saved"] and sd["saved"]["wrapper"]["kind"] == "LocalSGD"
        assert seen == ["save-pre"]
        with pytest.raises(ValueError, match="expects the dict returned by state_dict"):
            opt.load_state_dict(sd)
        opt.register_load_state_dict_pre_hook(lambda o, sd: sd["saved"])  # unwraps it again
        opt.load_state_dict(sd)
        assert seen == ["save-pre", "load-post"]
        opt.close()

    def test_state_dict_holds_optimizer_state_and_counters(self):
        m = model()
        opt = LocalSGD(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), local_steps=5)
        backward(m)
        opt.step()
        sd = opt.state_dict()
        assert sd["wrapper"]["steps"] == 1 and sd["wrapper"]["kind"] == "LocalSGD"
        assert len(sd["optimizer"]["state"]) == 4
        opt.close()

    def test_state_dict_of_another_kind_is_refused(self):
        m = model()
        a = LocalSGD(torch.optim.SGD(m.parameters(), lr=0.1), local_steps=5)
        b = DPSGD(torch.optim.SGD(m.parameters(), lr=0.1))
        with pytest.raises(ValueError, match="saved by LocalSGD"):
            b.load_state_dict(a.state_dict())
        with pytest.raises(ValueError, match="expects the dict returned by state_dict"):
            b.load_state_dict(torch.optim.SGD(m.parameters(), lr=0.1).state_dict())
        a.close()
        b.close()

    def test_closure_is_evaluated_before_averaging(self):
        m = model()
        opt = AllreduceSGD(torch.optim.SGD(m.parameters(), lr=0.1))

        def closure():
            opt.zero_grad()
            loss = m(torch.ones(2, 4)).sum()
            loss.backward()
            return loss

        assert isinstance(opt.step(closure), torch.Tensor)
        opt.close()

    def test_stats_count_steps_and_communication(self):
        m = model()
        opt = LocalSGD(torch.optim.SGD(m.parameters(), lr=0.1), local_steps=2)
        for _ in range(4):
            backward(m)
            opt.step()
        assert opt.stats.steps == 4 and opt.stats.averages == 2 and opt.stats.comm_time_s >= 0
        opt.close()

    def test_context_manager_closes(self):
        m = model()
        with DPSGD(torch.optim.SGD(m.parameters(), lr=0.1)) as opt:
            pass
        backward(m)
        with pytest.raises(RuntimeError, match="closed"):
            opt.step()


class TestErrors:
    def test_needs_a_torch_optimizer(self):
        with pytest.raises(TypeError, match="wraps a torch.optim.Optimizer"):
            LocalSGD(object(), local_steps=1)

    def test_cannot_wrap_twice(self):
        m = model()
        inner = LocalSGD(torch.optim.SGD(m.parameters(), lr=0.1), local_steps=1)
        with pytest.raises(TypeError, match="already distributed"):
            DPSGD(inner)
        inner.close()

    @pytest.mark.parametrize("cls,kw,match", [
        (LocalSGD, {"local_steps": -1}, "local_steps"),
        (DPSGD, {"local_steps": -1}, "local_steps"),
        (WAGMA, {"group_size": 0, "sync_period": 2}, "group_size"),
        (WAGMA, {"group_size": 1, "sync_period": 0}, "sync_period"),
        (WAGMA, {"group_size": 2, "sync_period": 2}, "does not fit 1 rank: .*at most group_size=1"),
        (NonBlockingSGD, {"micro_batches": 0}, "micro_batches"),
        (NonBlockingDPSGD, {"micro_batches": 0}, "micro_batches"),
    ])
    def test_bad_options_say_what_is_wrong(self, cls, kw, match):
        m = model()
        with pytest.raises(ValueError, match=match):
            cls(torch.optim.SGD(m.parameters(), lr=0.1), **kw)

    def test_replacing_parameter_data_after_construction_is_refused(self):
        m = model()
        opt = LocalSGD(torch.optim.SGD(m.parameters(), lr=0.1), local_steps=1)
        m[0].weight.data = torch.zeros_like(m[0].weight)
        backward(m)
        with pytest.raises(RuntimeError, match="replaced"):
            opt.step()
        opt.close()

    def test_micro_step_without_backward_is_refused(self):
        m = model()
        opt = NonBlockingSGD(torch.optim.SGD(m.parameters(), lr=0.1), micro_batches=2)
        with pytest.raises(RuntimeError, match="backward"):
            opt.micro_step()
        opt.close()

    def test_reduce_gradients_is_refused_where_the_round_closes_inside_step(self):
        m = model()
        opt = NonBlockingSGD(torch.optim.SGD(m.parameters(), lr=0.1), micro_batches=2)
        backward(m)
        with pytest.raises(RuntimeError, match="inside step"):
            opt.reduce_gradients()
        opt.close()

    def test_unknown_optimizer_name(self):
        m = model()
        with pytest.raises(ValueError, match="choose one of"):
            build_optimizer("adamw_dist", torch.optim.SGD(m.parameters(), lr=0.1))
