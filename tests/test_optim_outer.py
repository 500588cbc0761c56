"""The outer optimizer on the global average (wagma_rl.optim.outer, DiLoCo) on one process.

Values are multiples of powers of two with lr and momentum 0.5, so every float32 operation of the
Nesterov rule is exact and results are compared with ``==``.
"""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from wagma_rl.optim import WAGMA, LocalSGD
from wagma_rl.optim.outer import OuterNesterov, check_outer_options


def nesterov(prev, avg, m, lr, mu):
    """The rule by hand (PyTorch SGD's Nesterov form): returns (T, new momentum)."""
    d = prev - avg
    m = mu * m + d
    return prev - lr * (d + mu * m), m


class TestOuterStep:
    def test_first_step_is_the_nesterov_rule(self):
        outer = OuterNesterov(torch.full((3,), 4.0), lr=0.5, momentum=0.5)
        avg = torch.tensor([2.0, 4.0, 8.0])
        outer.step(avg)
        # d = (2, 0, -4); m = d; T = prev - 0.5 * (d + 0.5 d) = 4 - 0.75 d
        assert torch.equal(avg, torch.tensor([2.5, 4.0, 7.0]))
        assert torch.equal(outer.prev, avg) and torch.equal(outer.buf, torch.tensor([2.0, 0.0, -4.0]))

    def test_momentum_carries_over_between_steps(self):
        outer = OuterNesterov(torch.zeros(1), lr=0.5, momentum=0.5)
        prev, m = 0.0, 0.0
        for a in (8.0, 16.0, 4.0):
            t = torch.tensor([a])
            outer.step(t)
            prev, m = nesterov(prev, a, m, 0.5, 0.5)
            assert t.item() == prev and outer.buf.item() == m

    def test_lr_one_momentum_zero_is_the_plain_average_bit_for_bit(self):
        gen = torch.Generator().manual_seed(0)
        outer = OuterNesterov(torch.randn(1000, generator=gen), lr=1.0, momentum=0.0)
        for _ in range(3):
            avg = torch.randn(1000, generator=gen) * 1e3
            got = avg.clone()
            outer.step(got)
            assert np.array_equal(got.numpy().view(np.uint32), avg.numpy().view(np.uint32))

    def test_diloco_values_match_the_rule_in_float64_closely(self):
        gen = torch.Generator().manual_seed(1)
        start = torch.randn(50, generator=gen)
        outer = OuterNesterov(start, lr=0.7, momentum=0.9)
        prev, m = start.double(), torch.zeros(50, dtype=torch.float64)
        for _ in range(4):
            avg = torch.randn(50, generator=gen)
            got = avg.clone()
            outer.step(got)
            prev, m = nesterov(prev, avg.double(), m, 0.7, 0.9)
            torch.testing.assert_close(got.double(), prev, rtol=1e-5, atol=1e-5)
            prev = got.double()  # follow the float32 trajectory

    def test_state_dict_round_trip_continues_identically(self):
        a = OuterNesterov(torch.full((2,), 1.0), lr=0.5, momentum=0.5)
        a.step(torch.tensor([3.0, 5.0]))
        b = OuterNesterov(torch.zeros(2), lr=0.5, momentum=0.5)
        b.load_state_dict(a.state_dict())
        x, y = torch.tensor([7.0, -1.0]), torch.tensor([7.0, -1.0])
        a.step(x)
        b.step(y)
        assert torch.equal(x, y) and torch.equal(a.buf, b.buf)

    def test_status_slots_are_not_saved(self):
        outer = OuterNesterov(torch.ones(3), lr=0.5, momentum=0.5, extra=4)
        assert outer.prev.numel() == 7 and outer.state_dict()["prev"].numel() == 3


class TestOptions:
    @pytest.mark.parametrize("kw,match", [
        ({"outer": "adam"}, "outer must be None or 'nesterov'"),
        ({"outer": "nesterov", "outer_lr": 0.0}, "outer_lr must be > 0"),
        ({"outer": "nesterov", "outer_lr": -1.0}, "outer_lr must be > 0"),
        ({"outer": "nesterov", "outer_momentum": 1.0}, r"outer_momentum must be in \[0, 1\)"),
        ({"outer": "nesterov", "outer_momentum": -0.1}, r"outer_momentum must be in \[0, 1\)"),
        ({"outer": "nesterov", "outer_lr": "fast"}, "outer_lr must be a number"),
    ])
    @pytest.mark.parametrize("cls,base", [(LocalSGD, {"local_steps": 1}),
                                          (WAGMA, {"group_size": 1, "sync_period": 2})])
    def test_bad_values_raise_one_line(self, cls, base, kw, match):
        m = torch.nn.Linear(2, 1)
        with pytest.raises(ValueError, match=match) as info:
            cls(torch.optim.SGD(m.parameters(), lr=0.1), **base, **kw)
        assert "\n" not in str(info.value)

    def test_default_records_nothing(self):
        assert check_outer_options("X", None, 0.7, 0.9) == {}


def one_rank(cls, mode=None, **kw):
    m = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        m.weight.fill_(1.0)
    extra = {"local_steps": 1} if cls is LocalSGD else {
        "group_size": 1, "sync_period": 2, "global_mode": mode}
    return m, cls(torch.optim.SGD(m.parameters(), lr=1.0), **extra, **kw)


def grow(m, opt, by):
    m.weight.grad = torch.full_like(m.weight, -by)
    opt.step()


class TestOneRank:
    @pytest.mark.parametrize("cls,mode", [(LocalSGD, None), (WAGMA, "blocking"), (WAGMA, "overlap")])
    def test_global_average_takes_the_outer_step(self, cls, mode):
        m, opt = one_rank(cls, mode, outer="nesterov", outer_lr=0.5, outer_momentum=0.5)
        steps = 1 if cls is LocalSGD else 2  # WAGMA: a group average of one, then the global
        for _ in range(steps):
            grow(m, opt, 2.0 / steps)
        opt.synchronize()  # overlap: applies the outstanding global
        # A = 3 (one rank), prev = 1: d = -2, m = -2, T = 1 - 0.5 * (-2 - 1) = 2.5
        assert torch.equal(m.weight.detach(), torch.full((1, 4), 2.5))
        sd = opt.state_dict()["wrapper"]
        assert sd["options"]["outer"] == "nesterov" and torch.equal(sd["outer"]["buf"], torch.full((4,), -2.0))
        opt.close()

    def test_default_state_dict_has_no_outer_entries(self):
        m, opt = one_rank(LocalSGD)
        sd = opt.state_dict()["wrapper"]
        assert "outer" not in sd and "outer" not in sd["options"]
        opt.close()

    def test_checkpoint_without_outer_state_restarts_it_from_the_loaded_model(self):
        m, plain = one_rank(LocalSGD)
        grow(m, plain, 1.0)
        saved = plain.state_dict()
        plain.close()
        m2, opt = one_rank(LocalSGD, outer="nesterov", outer_lr=0.5, outer_momentum=0.5)
        with torch.no_grad():
            m2.weight.fill_(2.0)
        opt.load_state_dict(saved)
        assert torch.equal(opt._outer.prev, torch.full((4,), 2.0)) and not opt._outer.buf.any()
        opt.close()

    def test_state_with_outer_momentum_is_refused_by_an_optimizer_without_it_and_nothing_loads(self):
        m, outer = one_rank(LocalSGD, outer="nesterov", outer_lr=0.5, outer_momentum=0.5)
        grow(m, outer, 1.0)
        saved = outer.state_dict()
        outer.close()
        m2, plain = one_rank(LocalSGD)
        before = plain.state_dict()
        with pytest.raises(ValueError, match="outer='nesterov' .* pass outer='nesterov'"):
            plain.load_state_dict(saved)
        assert plain.state_dict()["wrapper"] == before["wrapper"]
        del saved["wrapper"]["outer"]  # dropping the momentum, as the message says, loads
        plain.load_state_dict(saved)
        assert plain.state_dict()["wrapper"]["steps"] == saved["wrapper"]["steps"] == 1
        plain.close()


class TestConfigKeys:
    def test_supervised_optim_keys_reach_wagma_and_local_sgd(self):
        from pathlib import Path

        from wagma_rl.config import load_config
        from wagma_rl.supervised import SupervisedConfig
        yaml_path = Path(__file__).resolve().parents[1] / "configs/resnet_shapes.yaml"
        for name in ("wagma", "local_sgd"):
            cfg = load_config(SupervisedConfig, yaml_path, [f"averaging.name={name}", "averaging.outer=nesterov",
                                                            "averaging.outer_lr=0.5", "averaging.outer_momentum=0.25"])
            kw = cfg.averaging.options(world_size=1)
            assert (kw["outer"], kw["outer_lr"], kw["outer_momentum"]) == ("nesterov", 0.5, 0.25)

    def test_rl_distrib_keys_reach_the_optimizer(self):
        from pathlib import Path

        from wagma_rl.config import load_config
        from wagma_rl.distrib import build_strategy
        from wagma_rl.rl.config import DDPPOConfig
        yaml_path = Path(__file__).resolve().parents[1] / "configs/wagma_pointnav.yaml"
        for mode in ("wagma", "local_sgd"):
            spec = load_config(DDPPOConfig, yaml_path, [f"averaging.name={mode}", "averaging.outer=nesterov",
                                                        "averaging.outer_lr=0.5"]).averaging
            strategy = build_strategy(spec, comm=MPI.COMM_SELF)
            opt = strategy.wrap_optimizer(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1))
            assert opt.state_dict()["wrapper"]["options"]["outer_lr"] == 0.5
            assert opt._outer is not None and opt._outer.momentum == 0.9
            opt.close()

    def test_an_outer_optimizer_for_a_mode_without_global_averages_is_one_line(self, tmp_path):
        from pathlib import Path

        from wagma_rl.config import ConfigError, load_config
        from wagma_rl.rl.config import DDPPOConfig
        from wagma_rl.rl.setup import check_config
        from wagma_rl.supervised import SupervisedConfig, train
        repo = Path(__file__).resolve().parents[1]
        cfg = load_config(DDPPOConfig, repo / "configs/wagma_pointnav.yaml",
                          ["averaging.name=allreduce", "averaging.outer=nesterov"])
        with pytest.raises(ConfigError, match="config key 'averaging.outer': .* allreduce has none"):
            check_config(cfg, 1)
        cfg = load_config(SupervisedConfig, repo / "configs/resnet_shapes.yaml",
                          ["averaging.name=dpsgd", "averaging.outer=nesterov", f"run.dir={tmp_path}"])
        with pytest.raises(ConfigError, match="config key 'averaging.outer': .* dpsgd has none"):
            train(cfg)
        assert not any(tmp_path.iterdir())  # refused before the run folder is touched

    def test_an_unknown_outer_optimizer_names_the_choices(self):
        from pathlib import Path

        from wagma_rl.config import ConfigError, load_config
        from wagma_rl.rl.config import DDPPOConfig
        repo = Path(__file__).resolve().parents[1]
        with pytest.raises(ConfigError, match=r"'averaging.outer': 'adam' is not one of \['nesterov'\] \(or empty\)"):
            load_config(DDPPOConfig, repo / "configs/wagma_pointnav.yaml", ["averaging.outer=adam"])
