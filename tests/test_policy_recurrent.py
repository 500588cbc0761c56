"""The recurrent core over a rollout equals the step-by-step recurrence, outputs, final state and
gradients, whichever way it runs (stretches between episode starts, or episodes packed into one
call), for GRU and LSTM."""
from __future__ import annotations

import pytest
import torch

from wagma_rl.rl.policy import RecurrentCore, packs


def step_by_step(core, x, h, masks):
    t_len, n = masks.shape
    outs, xs = [], x.view(t_len, n, -1)
    for t in range(t_len):
        h = h * masks[t].view(1, n, 1)
        out, state = core.rnn(xs[t:t + 1], core._unpack(h))
        h = core._pack(state)
        outs.append(out)
    return torch.cat(outs).view(t_len * n, -1), h


@pytest.mark.parametrize("rnn_type,layers", [("gru", 1), ("lstm", 2)])
@pytest.mark.parametrize("start_prob,path", [(0.02, "_by_stretch"), (0.3, "_by_episode")])
def test_a_rollout_equals_the_step_by_step_recurrence(rnn_type, layers, start_prob, path,
                                                      monkeypatch):
    torch.manual_seed(1)
    core = RecurrentCore(input_size=10, hidden_size=12, num_layers=layers,
                         rnn_type=rnn_type).double()
    t_len, n = 48, 5
    masks = (torch.rand(t_len, n) > start_prob).double()
    masks[0, 1] = 0.0  # an env whose rollout opens with a new episode
    x = torch.randn(t_len * n, 10, dtype=torch.float64, requires_grad=True)
    h = torch.randn(core.num_recurrent_layers, n, 12, dtype=torch.float64)
    used = []
    original = getattr(RecurrentCore, path)
    monkeypatch.setattr(RecurrentCore, path,
                        lambda self, *a: used.append(path) or original(self, *a))
    out, h_t = core(x, h, masks.reshape(-1))
    ref, ref_h = step_by_step(core, x, h, masks)
    assert used == [path]
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(h_t, ref_h, atol=1e-12, rtol=0)
    grad, = torch.autograd.grad(out.square().sum() + h_t.sum(), x)
    ref_grad, = torch.autograd.grad(ref.square().sum() + ref_h.sum(), x)
    torch.testing.assert_close(grad, ref_grad, atol=1e-12, rtol=0)


def test_the_way_a_rollout_runs_follows_the_devices_measured_crossover():
    # benchmarks/recurrent_core.py: on cpu the stretches win below about T / 4; on a GPU packing
    # won at every count measured (14 stretches and up), so it packs past 4 there.
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert [packs(k, 128, cpu) for k in (4, 14, 32, 33, 112)] == [False, False, False, True, True]
    assert [packs(k, 128, gpu) for k in (0, 4, 5, 14, 112)] == [False, False, True, True, True]
