"""Multi-rank specification of the outer optimizer on the global average (DiLoCo's outer Nesterov
step) in LocalSGD and WAGMA (both global modes); run on every rank under mpiexec.

Launched by tests/test_optim_mpi.py at 2, 3 and 4 ranks. Rank r's local progress in each round is
``4 * SIZE * (r + 1)`` (SGD, lr 1), so every global average is the integer ``a = 2 * SIZE * (SIZE + 1)``
above the previous model, and with outer_lr = outer_momentum = 0.5 the rule gives, from the start
model 0: after the first global T1 = 0.75 a, after the second T3 = 1.625 a (d = -a both times;
momentum -a, then -1.5 a). All exact in float32: results are compared with ``==``.
"""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from wagma_rl.optim import WAGMA, LocalSGD

torch.set_num_threads(1)
COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
A = 2.0 * SIZE * (SIZE + 1)
T1, T3 = 0.75 * A, 1.625 * A
OUTER = dict(outer="nesterov", outer_lr=0.5, outer_momentum=0.5)
MODES = ["local_sgd", "blocking", "overlap"]


def build(mode: str, *, group_size: int = 1, sync_period: int = 2, **kw):
    model = torch.nn.Linear(5, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    inner = torch.optim.SGD(model.parameters(), lr=1.0)
    if mode == "local_sgd":
        return model, LocalSGD(inner, local_steps=0, comm=COMM, **kw)
    return model, WAGMA(inner, group_size=group_size, sync_period=sync_period, local_steps=0,
                        global_mode=mode, comm=COMM, **kw)


def grow(model, opt, by) -> None:
    """One local SGD step (lr 1) that adds ``by`` to every weight."""
    model.weight.grad = -torch.as_tensor(by, dtype=torch.float32).expand_as(model.weight).clone()
    opt.step()


def global_round(model, opt, by) -> None:
    """Local progress ``by``, then one global average (WAGMA: a group average of one first)."""
    grow(model, opt, by)
    if isinstance(opt, WAGMA):
        opt.average()
        assert opt.is_global()
    opt.average()


def weights(model) -> np.ndarray:
    return model.weight.detach().reshape(-1).numpy().copy()


def identical_everywhere(w: np.ndarray) -> bool:
    return all(np.array_equal(w.view(np.uint32), o.view(np.uint32)) for o in COMM.allgather(w))


def progress() -> float:
    return 4.0 * SIZE * (RANK + 1)


class TestNesterovRule:
    @pytest.mark.parametrize("mode", MODES)
    def test_every_rank_holds_the_hand_computed_model_after_each_global(self, mode):
        model, opt = build(mode, **OUTER)
        with opt:
            global_round(model, opt, progress())
            if mode == "overlap":  # snapshot taken, the average is applied later
                assert np.all(weights(model) == progress())
            else:
                assert np.all(weights(model) == T1) and identical_everywhere(weights(model))
            global_round(model, opt, progress())
            if mode == "overlap":
                # The second global waited for the first and applied T1 before its snapshot.
                assert np.all(weights(model) == T1 + progress())
                opt.synchronize()  # applies the second global (T3), then a plain identical average
            assert np.all(weights(model) == T3) and identical_everywhere(weights(model))

    @pytest.mark.parametrize("mode", MODES)
    def test_outer_lr_one_momentum_zero_is_plain_averaging_bit_for_bit(self, mode):
        results = []
        for kw in ({}, dict(outer="nesterov", outer_lr=1.0, outer_momentum=0.0)):
            gen = torch.Generator().manual_seed(100 + RANK)
            model, opt = build(mode, **kw)
            with opt:
                for _ in range(3):
                    global_round(model, opt, torch.randn(5, generator=gen).view(1, 5))
                opt.synchronize()
            results.append(weights(model))
        assert np.array_equal(results[0].view(np.uint32), results[1].view(np.uint32))

    @pytest.mark.parametrize("mode", MODES)
    def test_state_dict_round_trip_continues_exactly(self, mode):
        model, opt = build(mode, **OUTER)
        global_round(model, opt, progress())
        opt.synchronize()  # overlap: the outstanding global is applied before saving
        saved = opt.state_dict()
        opt.close()
        assert saved["wrapper"]["outer"]["buf"].eq(-A).all()
        inner = torch.optim.SGD(model.parameters(), lr=1.0)
        resumed = (LocalSGD(inner, local_steps=0, comm=COMM, **OUTER) if mode == "local_sgd" else
                   WAGMA(inner, group_size=1, sync_period=2, local_steps=0, global_mode=mode,
                         comm=COMM, **OUTER))
        with resumed:
            resumed.load_state_dict(saved)  # without the momentum the next T would be 1.5 a
            global_round(model, resumed, progress())
            resumed.synchronize()
            assert np.all(weights(model) == T3) and identical_everywhere(weights(model))


class TestGroupIterations:
    @pytest.mark.parametrize("mode", ["blocking", "overlap"])
    def test_group_averages_between_globals_are_untouched(self, mode):
        group_size = min(2, SIZE)
        runs = []
        for kw in ({}, OUTER):
            gen = torch.Generator().manual_seed(7 + RANK)
            model, opt = build(mode, group_size=group_size, sync_period=3, late="apply", **kw)
            with opt:
                for _ in range(2):  # two group averages, every contribution fresh
                    grow(model, opt, torch.randn(5, generator=gen).view(1, 5))
                    opt.publish()
                    COMM.Barrier()
                    assert opt.average().kind == "group"
                runs.append(weights(model))
                if kw:
                    assert not opt._outer.prev.any() and not opt._outer.buf.any()
        assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))
