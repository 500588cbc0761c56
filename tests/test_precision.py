"""The 16-bit wire of the global average (global_precision) on one process: the rounding helpers
against independent conversions (bfloat16 rounded on the float32 bits, numpy's float16), the
native collective's conversion against them bit for bit, the options and config keys, and
one-rank averages.
Multi-rank exact values: tests/mpi/precision_cases.py."""
import numpy as np
import pytest
import torch

from native_coll import WaitAvoidingAllreduce, wire_round
from mpi4py import MPI
from wagma_rl.optim import WAGMA, LocalSGD
from wagma_rl.optim.precision import check_precision_option, decode16, encode16, nonfinite16

F32 = np.float32


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def same(a, b) -> bool:
    """Bitwise equal, any NaN matching any NaN."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return bool(np.all((bits(a) == bits(b)) | (np.isnan(a) & np.isnan(b))))


def reference(x, precision):
    """An independent conversion: round to nearest even on the float32 bits for bfloat16 (NaN kept
    as NaN), numpy's IEEE float16."""
    x = np.asarray(x, np.float32)
    if precision == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16) & 0xFFFFFFFF
        return np.where(np.isnan(x), x, r.astype(np.uint32).view(np.float32))
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


def samples() -> np.ndarray:
    rng = np.random.default_rng(0)
    every_bit_pattern = rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32).view(F32)
    wide = (rng.standard_normal(200_000) * np.exp(rng.uniform(-35, 15, 200_000))).astype(F32)
    return np.concatenate([every_bit_pattern, wide])


class TestRounding:
    @pytest.mark.parametrize("precision", ["bf16", "fp16"])
    def test_round_trip_is_the_independent_conversion_bit_for_bit(self, precision):
        x = samples()
        assert same(decode16(encode16(x, precision), precision), reference(x, precision))

    @pytest.mark.parametrize("precision", ["bf16", "fp16"])
    def test_the_native_conversion_is_the_numpy_one_bit_for_bit(self, precision):
        x = samples()
        assert same(wire_round(x, precision), decode16(encode16(x, precision), precision))

    def test_bf16_ties_round_to_even(self):
        x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -9, -(1 + 2 ** -8)], F32)
        assert same(decode16(encode16(x, "bf16"), "bf16"), [1.0, 1 + 2 ** -6, 1.0, -1.0])

    def test_fp16_range_overflow_is_inf_and_underflow_subnormal_then_zero(self):
        x = np.array([65504, 65519.996, 65520, 1e6, -1e6, 6.1035156e-05, 2 ** -24, 2 ** -26], F32)
        got = decode16(encode16(x, "fp16"), "fp16")
        assert same(got, [65504, 65504, np.inf, np.inf, -np.inf, 6.1035156e-05, 2 ** -24, 0.0])

    def test_bf16_overflows_only_past_float32s_largest_values(self):
        x = np.array([3.38e38, np.finfo(F32).max, -np.finfo(F32).max], F32)
        got = decode16(encode16(x, "bf16"), "bf16")
        assert np.isfinite(got[0]) and same(got[1:], [np.inf, -np.inf])

    @pytest.mark.parametrize("precision", ["bf16", "fp16"])
    def test_nan_stays_nan_whatever_its_payload(self, precision):
        # 0x7fffffff would carry into the sign bit and 0x7f800001 truncate to inf without care.
        x = np.array([0x7FFFFFFF, 0x7F800001, 0xFFC00001, 0x7FC00000], np.uint32).view(F32)
        h = encode16(x, precision)
        assert np.isnan(decode16(h, precision)).all() and nonfinite16(h, precision)
        assert np.isnan(wire_round(x, precision)).all()

    @pytest.mark.parametrize("precision", ["bf16", "fp16"])
    def test_nonfinite16_sees_inf_and_nan_only(self, precision):
        finite = encode16(np.array([0.0, -1.5, 65504, 1e-30], F32), precision)
        assert not nonfinite16(finite, precision)
        assert nonfinite16(encode16(np.array([1.0, np.inf], F32), precision), precision)


class TestOptions:
    @pytest.mark.parametrize("value", ["fp8", "bfloat16", None, 16])
    @pytest.mark.parametrize("cls,base", [(LocalSGD, {"local_steps": 1}),
                                          (WAGMA, {"group_size": 1, "sync_period": 2})])
    def test_bad_values_raise_one_line(self, cls, base, value):
        m = torch.nn.Linear(2, 1)
        with pytest.raises(ValueError, match="global_precision must be one of") as info:
            cls(torch.optim.SGD(m.parameters(), lr=0.1), **base, global_precision=value)
        assert "\n" not in str(info.value)

    def test_default_records_nothing_in_the_state(self):
        assert check_precision_option("X", "fp32") == "fp32"
        m = torch.nn.Linear(2, 1)
        with LocalSGD(torch.optim.SGD(m.parameters(), lr=0.1), local_steps=1) as opt:
            assert "global_precision" not in opt.state_dict()["wrapper"]["options"]

    @pytest.mark.parametrize("kw,match", [
        ({"global_precision": "bf16"}, "needs global_base"),
        ({"global_precision": "bf16", "global_base": np.zeros(3, F32)}, "global_base: must have buf's length 4"),
        ({"global_precision": "fp16", "global_base": np.zeros(4, np.float64)}, "global_base: must have dtype float32"),
        ({"global_precision": "half"}, "global_precision must be one of"),
    ])
    def test_the_collective_refuses_a_bad_wire_in_one_line(self, kw, match):
        with pytest.raises(ValueError, match=match) as info:
            WaitAvoidingAllreduce(MPI.COMM_WORLD, np.zeros(4, F32), group_size=1, sync_period=2, **kw)
        assert "\n" not in str(info.value)


def one_rank(cls, precision, **kw):
    m = torch.nn.Linear(5, 1, bias=False)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([[1.0, -2.0, 3.0, 1000.0, 1e-3]]))
    extra = {"local_steps": 0} if cls is LocalSGD else {"group_size": 1, "sync_period": 2, "local_steps": 0}
    return m, cls(torch.optim.SGD(m.parameters(), lr=1.0), global_precision=precision, **extra, **kw)


def weights(m) -> np.ndarray:
    return m.weight.detach().reshape(-1).numpy().copy()


def global_average(m, opt, progress):
    m.weight.grad = -torch.as_tensor(progress, dtype=torch.float32).view(1, -1).clone()
    opt.step()
    if isinstance(opt, WAGMA):
        assert opt.average().kind == "group"
        info = opt.average()
        assert info.kind == "global"
        return info
    opt.average()
    return None


def expected_one_rank(B, x, precision):
    d = decode16(encode16(x - B, precision), precision)
    return B + decode16(encode16(d / F32(1), precision), precision)


class TestOneRank:
    @pytest.mark.parametrize("precision", ["bf16", "fp16"])
    @pytest.mark.parametrize("cls", [LocalSGD, WAGMA])
    def test_two_global_averages_are_B_plus_the_rounded_delta_and_B_follows(self, cls, precision):
        m, opt = one_rank(cls, precision)
        with opt:
            B = weights(m)
            for progress in (np.array([0.1, 1e-4, -0.3, 0.123456, 7.0], F32),
                             np.array([-1e-5, 2.5, 0.3, 3e-3, -7.0], F32)):
                global_average(m, opt, progress)
                x = (B + progress).astype(F32)
                want = expected_one_rank(B, x, precision)
                assert same(weights(m), want)
                B = want
            assert opt.state_dict()["wrapper"]["options"]["global_precision"] == precision

    @pytest.mark.parametrize("precision", ["bf16", "fp16"])
    def test_overlapped_wagma_applies_B_plus_the_rounded_delta_and_makes_it_B(self, precision):
        m, opt = one_rank(WAGMA, precision, global_mode="overlap")

        def grow(by):
            m.weight.grad = -torch.as_tensor(by, dtype=torch.float32).view(1, -1).clone()
            opt.step()

        with opt:
            B = weights(m)
            assert opt.average().kind == "group"
            grow(np.array([0.1, 1e-4, -0.3, 0.123456, 7.0], F32))
            U = weights(m)
            assert opt.average().kind == "global"  # the snapshot U; nothing applied yet
            assert same(weights(m), U)
            grow(np.full(5, 0.5, F32))  # progress after the snapshot
            W = weights(m)
            A = expected_one_rank(B, U, precision)
            assert opt.average().applied_global == 1  # A applied first, then a group of one
            assert same(weights(m), (A + (W - U)).astype(F32))
            assert same(opt._base.numpy()[:5], A)  # the engine made A the next B
            grow(np.array([-1e-5, 2.5, 0.3, 3e-3, -7.0], F32))
            U = weights(m)
            assert opt.average().kind == "global"  # deltas against A this time
            assert opt.average().applied_global == 3
            A2 = expected_one_rank(A, U, precision)
            assert same(weights(m), A2) and same(opt._base.numpy()[:5], A2)

    def test_an_overlapped_fp16_overflow_is_refused_at_the_global_call(self):
        m, opt = one_rank(WAGMA, "fp16", nonfinite="drop", global_mode="overlap")
        with opt:
            base = opt._base.numpy().copy()
            assert opt.average().kind == "group"
            m.weight.grad = -torch.tensor([[0.0, 0.0, 0.0, 1e5, 0.0]])
            opt.step()
            kept = weights(m)
            assert opt.average() is None  # its own snapshot's delta overflowed: told at once
            assert opt.average().applied_global is None  # the poisoned average is never applied
            assert same(weights(m), kept) and same(opt._base.numpy(), base)

    def test_wagma_one_rank_sends_nothing(self):
        m, opt = one_rank(WAGMA, "bf16")
        with opt:
            assert global_average(m, opt, np.ones(5, F32)).bytes_sent == 0

    def test_fp16_overflow_of_the_delta_is_refused_not_applied(self):
        m, opt = one_rank(WAGMA, "fp16", nonfinite="drop")
        with opt:
            before = weights(m)
            m.weight.grad = -torch.tensor([[0.0, 0.0, 0.0, 1e5, 0.0]])
            opt.step()
            assert opt.average().kind == "group"
            assert opt.average() is None  # the global average was refused
            assert opt.stats.extra["nonfinite_skipped"] == 1
            assert weights(m)[3] == before[3] + 1e5  # the finite model is kept as it was


class TestConfigKeys:
    def test_supervised_optim_key_reaches_wagma_and_local_sgd(self):
        from pathlib import Path

        from wagma_rl.config import load_config
        from wagma_rl.supervised import SupervisedConfig
        yaml_path = Path(__file__).resolve().parents[1] / "configs/resnet_shapes.yaml"
        for name in ("wagma", "local_sgd"):
            cfg = load_config(SupervisedConfig, yaml_path, [f"averaging.name={name}",
                                                            "averaging.global_precision=bf16"])
            assert cfg.averaging.options(world_size=1)["global_precision"] == "bf16"

    @pytest.mark.parametrize("mode", ["wagma", "local_sgd"])
    def test_rl_distrib_key_reaches_the_optimizer(self, mode):
        from pathlib import Path

        from wagma_rl.config import load_config
        from wagma_rl.distrib import build_strategy
        from wagma_rl.rl.config import DDPPOConfig
        yaml_path = Path(__file__).resolve().parents[1] / "configs/wagma_pointnav.yaml"
        spec = load_config(DDPPOConfig, yaml_path, [f"averaging.name={mode}",
                                                    "averaging.global_precision=fp16"]).averaging
        strategy = build_strategy(spec, comm=MPI.COMM_SELF)
        opt = strategy.wrap_optimizer(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1))
        assert opt.state_dict()["wrapper"]["options"]["global_precision"] == "fp16"
        opt.close()

    @pytest.mark.parametrize("overrides,match", [
        (["averaging.name=dpsgd", "averaging.global_precision=bf16"], "dpsgd has none: leave it fp32"),
        (["averaging.name=allreduce", "averaging.global_precision=fp16"], "allreduce has none"),
    ])
    def test_rl_modes_without_a_global_average_refuse_it_in_one_line(self, overrides, match):
        from pathlib import Path

        from wagma_rl.config import ConfigError, load_config
        from wagma_rl.rl.config import DDPPOConfig
        from wagma_rl.rl.setup import check_config
        cfg = load_config(DDPPOConfig, Path(__file__).resolve().parents[1] / "configs/wagma_pointnav.yaml",
                          overrides)
        with pytest.raises(ConfigError, match="config key 'averaging.global_precision': .*" + match) as info:
            check_config(cfg, 1)
        assert "\n" not in str(info.value)

    def test_supervised_modes_without_a_global_average_refuse_it_before_the_run(self, tmp_path):
        from pathlib import Path

        from wagma_rl.config import ConfigError, load_config
        from wagma_rl.supervised import SupervisedConfig, train
        cfg = load_config(SupervisedConfig, Path(__file__).resolve().parents[1] / "configs/resnet_shapes.yaml",
                          ["averaging.name=dpsgd", "averaging.global_precision=bf16", f"run.dir={tmp_path}"])
        with pytest.raises(ConfigError, match="config key 'averaging.global_precision': .* dpsgd has none"):
            train(cfg)
        assert not any(tmp_path.iterdir())

    def test_an_unknown_precision_names_the_choices(self):
        from pathlib import Path

        from wagma_rl.config import ConfigError, load_config
        from wagma_rl.rl.config import DDPPOConfig
        with pytest.raises(ConfigError, match=r"'averaging.global_precision': 'fp8' is not one of "
                                              r"\['fp32', 'bf16', 'fp16'\]"):
            load_config(DDPPOConfig, Path(__file__).resolve().parents[1] / "configs/wagma_pointnav.yaml",
                        ["averaging.global_precision=fp8"])
