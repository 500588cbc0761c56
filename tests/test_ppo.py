"""PPO pieces in isolation: GAE, the losses, recurrent state resets, rollout storage, the update."""
from __future__ import annotations

import math

import pytest
import torch

from wagma_rl.rl.policy import PointNavPolicy, RecurrentCore
from mpi4py import MPI

from wagma_rl.optim import AllreduceSGD
from wagma_rl.rl.ppo import compute_gae, ppo_losses, ppo_update
from wagma_rl.rl.storage import RolloutStorage


def test_gae_matches_hand_computed_example():
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [1.5], [2.0]])
    not_done = torch.tensor([[1.0], [0.0], [1.0]])  # the episode ends at step 1
    adv, ret = compute_gae(rewards, values, not_done, gamma=0.9, lam=0.8)
    # t=2: 3 + .9*2 - 1.5 = 3.3; t=1: 2 - 1 = 1 (no bootstrap, no carry); t=0: 1 + .9 - .5 + .72*1
    torch.testing.assert_close(adv[:, 0], torch.tensor([2.12, 1.0, 3.3]))
    torch.testing.assert_close(ret[:, 0], torch.tensor([2.62, 2.0, 4.8]))


def test_gae_rejects_values_without_bootstrap_row():
    with pytest.raises(ValueError, match="T\\+1"):
        compute_gae(torch.zeros(3, 1), torch.zeros(3, 1), torch.ones(3, 1), gamma=0.99, lam=0.95)


class TestLosses:
    kw = dict(log_probs=torch.log(torch.tensor([1.5, 0.5])), old_log_probs=torch.zeros(2),
              advantages=torch.tensor([1.0, -1.0]), values=torch.tensor([1.0, 0.0]),
              old_values=torch.tensor([0.5, 0.5]), returns=torch.tensor([2.0, 0.0]),
              entropy=torch.tensor([1.0, 2.0]), clip=0.2, value_coef=0.5, entropy_coef=0.01)

    def test_clipped_surrogate(self):
        # ratios 1.5 and 0.5 -> min(1.5, 1.2) = 1.2 and min(-0.5, -0.8) = -0.8 -> -(0.2) mean
        out = ppo_losses(**self.kw)
        assert out.policy.item() == pytest.approx(-0.2)
        assert out.clip_fraction.item() == pytest.approx(1.0)

    def test_clipped_value_loss_takes_the_larger_error(self):
        # clipped predictions 0.7, 0.3 -> errors max(1, 1.69), max(0, 0.09) -> 0.5 * mean = 0.445
        assert ppo_losses(**self.kw).value.item() == pytest.approx(0.445)

    def test_unclipped_value_loss(self):
        assert ppo_losses(**self.kw, clip_value=False).value.item() == pytest.approx(0.25)

    def test_total_combines_terms(self):
        assert ppo_losses(**self.kw).total.item() == pytest.approx(-0.2 + 0.5 * 0.445 - 0.01 * 1.5, abs=1e-6)


def _policy(rnn_type="gru"):
    torch.manual_seed(0)
    return PointNavPolicy(depth_size=16, hidden_size=8, rnn_type=rnn_type, base_planes=4,
                          resnet_layers=(1,), goal_embed=4, action_embed=4)


def _inputs(t, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(t * n, 16, 16, 1, generator=g), torch.rand(t * n, 2, generator=g) * 3,
            torch.randint(0, 4, (t * n,), generator=g))


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_recurrent_state_resets_at_episode_start(rnn_type):
    pol = _policy(rnn_type)
    t, n = 5, 2
    depth, goal, prev = _inputs(t, n)
    masks = torch.ones(t, n)
    masks[0] = 0
    masks[3, 0] = 0  # env 0 starts a new episode at step 3
    h0 = torch.randn(pol.num_recurrent_layers, n, 8)
    _, values, _ = pol(depth, goal, prev, masks.flatten(), h0)
    # The same env-0 steps 3..4 run alone from a zero state give the same values.
    sel = torch.tensor([3 * n, 4 * n])
    m2 = torch.tensor([0.0, 1.0])
    _, v2, _ = pol(depth[sel], goal[sel], prev[sel], m2, torch.zeros(pol.num_recurrent_layers, 1, 8))
    torch.testing.assert_close(values.view(t, n)[3:, 0], v2)


def test_previous_action_ignored_at_episode_start():
    pol = _policy()
    depth, goal, _ = _inputs(1, 3)
    h = pol.initial_state(3)
    masks = torch.zeros(3)
    a = pol(depth, goal, torch.tensor([0, 1, 2]), masks, h)[1]
    b = pol(depth, goal, torch.tensor([3, 3, 3]), masks, h)[1]
    torch.testing.assert_close(a, b)


def test_sequence_evaluation_matches_step_by_step_acting():
    pol = _policy("lstm")
    t, n = 6, 3
    depth, goal, prev = _inputs(t, n)
    masks = (torch.rand(t, n, generator=torch.Generator().manual_seed(3)) > 0.3).float()
    h = pol.initial_state(n)
    h0 = h.clone()
    step_values = []
    for i in range(t):
        s = slice(i * n, (i + 1) * n)
        _, _, v, h = pol.act(depth[s], goal[s], prev[s], masks[i], h)
        step_values.append(v)
    seq_values, _, _ = pol.evaluate_actions(depth, goal, prev, masks.flatten(), h0,
                                            torch.zeros(t * n, dtype=torch.long))
    torch.testing.assert_close(seq_values, torch.cat(step_values))


def test_padding_never_reaches_the_depth_encoder_and_leaves_the_valid_steps_as_they_were():
    # VER's segments: env i holds its first lengths[i] steps, the rest of its column is padding.
    pol = _policy()
    t, n = 5, 3
    depth, goal, prev = _inputs(t, n)
    masks = torch.ones(t * n)
    valid = (torch.arange(t)[:, None] < torch.tensor([5, 2, 4])[None, :]).float().flatten()
    actions = torch.randint(0, 4, (t * n,), generator=torch.Generator().manual_seed(2))
    h0 = pol.initial_state(n)

    def masked_loss_and_grads(depth, **kw):
        pol.zero_grad()
        values, log_probs, entropy = pol.evaluate_actions(depth, goal, prev, masks, h0, actions, **kw)
        keep = valid > 0
        loss = (torch.where(keep, values, 0.0).sum() + torch.where(keep, log_probs, 0.0).sum()
                + torch.where(keep, entropy, 0.0).sum())
        loss.backward()
        return values, log_probs, [p.grad.clone() for p in pol.parameters()]

    seen = []
    pol.encoder.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].shape[0]))
    values, log_probs, grads = masked_loss_and_grads(depth)
    stale = depth.clone()
    stale[valid == 0] = float("nan")  # what padding holds is never read
    v2, lp2, grads2 = masked_loss_and_grads(stale, valid=valid)
    assert seen == [t * n, int(valid.sum())]
    keep = valid > 0
    torch.testing.assert_close(v2[keep], values[keep])
    torch.testing.assert_close(lp2[keep], log_probs[keep])
    for a, b in zip(grads2, grads):
        torch.testing.assert_close(a, b)


def test_rnn_type_is_checked():
    with pytest.raises(ValueError, match="gru"):
        RecurrentCore(input_size=3, hidden_size=4, rnn_type="rnn")


def _filled_storage(pol, steps, num_steps=8, n=4):
    st = RolloutStorage(num_steps=num_steps, num_envs=n, depth_shape=(16, 16, 1),
                        num_recurrent_layers=pol.num_recurrent_layers, hidden_size=8)
    depth, goal, _ = _inputs(1, n)
    st.set_first(depth=depth, goal=goal)
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        cur = st.current()
        a, lp, v, h = pol.act(cur["depth"], cur["goal"], cur["prev_actions"], cur["masks"], cur["h"])
        d2, g2, _ = _inputs(1, n, seed=int(torch.randint(0, 1000, (1,), generator=g)))
        st.insert(actions=a, log_probs=lp, values=v, rewards=torch.rand(n, generator=g),
                  next_depth=d2, next_goal=g2, next_hidden=h,
                  next_masks=(torch.rand(n, generator=g) > 0.2).float())
    cur = st.current()
    st.values[st.step] = pol.act(cur["depth"], cur["goal"], cur["prev_actions"], cur["masks"], cur["h"])[2]
    return st


class TestStorage:
    def test_mini_batches_split_envs_and_keep_the_whole_rollout(self):
        st = _filled_storage(_policy(), steps=3)
        adv = torch.zeros(3, 4)
        batches = list(st.mini_batches(adv, adv, 2))
        assert len(batches) == 2 and all(b.actions.shape == (3 * 2,) for b in batches)
        assert all(b.h0.shape == (1, 2, 8) for b in batches)

    def test_after_update_carries_last_slot_to_first(self):
        st = _filled_storage(_policy(), steps=5)
        last_goal, last_prev = st.goal[5].clone(), st.prev_actions[5].clone()
        st.after_update()
        assert st.step == 0
        assert torch.equal(st.goal[0], last_goal) and torch.equal(st.prev_actions[0], last_prev)

    def test_more_mini_batches_than_envs_is_an_error(self):
        st = _filled_storage(_policy(), steps=2)
        with pytest.raises(ValueError, match="num_mini_batch"):
            list(st.mini_batches(torch.zeros(2, 4), torch.zeros(2, 4), 5))

    def test_full_storage_refuses_another_step(self):
        with pytest.raises(RuntimeError, match="full"):
            _filled_storage(_policy(), steps=3, num_steps=2)


class CountingAdam(torch.optim.Adam):
    steps = 0

    def step(self, closure=None):
        type(self).steps += 1
        return super().step(closure)


@pytest.mark.parametrize("steps", [2, 8])
def test_update_makes_epochs_times_mini_batches_steps_whatever_the_rollout_length(steps):
    pol = _policy()
    st = _filled_storage(pol, steps=steps)
    CountingAdam.steps = 0
    before = [p.detach().clone() for p in pol.parameters()]
    opt = CountingAdam(pol.parameters(), lr=1e-3)
    stats = ppo_update(pol, opt, st, gamma=0.99, lam=0.95, clip=0.2, ppo_epoch=2, num_mini_batch=2,
                       value_coef=0.5, entropy_coef=0.01, max_grad_norm=0.5)
    assert CountingAdam.steps == 4
    assert any(not torch.equal(a, b) for a, b in zip(before, pol.parameters()))
    assert all(math.isfinite(v) for v in stats.values())


def test_update_clips_the_applied_gradient_to_max_grad_norm():
    pol = _policy()
    st = _filled_storage(pol, steps=4)
    before = torch.cat([p.detach().reshape(-1).clone() for p in pol.parameters()])
    stats = ppo_update(pol, torch.optim.SGD(pol.parameters(), lr=1.0), st, gamma=0.99, lam=0.95,
                       clip=0.2, ppo_epoch=1, num_mini_batch=1, value_coef=0.5, entropy_coef=0.01,
                       max_grad_norm=1e-3)
    moved = torch.cat([p.detach().reshape(-1) for p in pol.parameters()]) - before
    assert stats["grad_norm"] > 1e-3  # the norm before clipping is reported
    # One SGD step with lr 1 moves the parameters by the clipped gradient, of norm max_grad_norm.
    assert float(moved.norm()) == pytest.approx(1e-3, rel=1e-4)


class ReducingTwice(AllreduceSGD):
    """One rank's AllreduceSGD whose gradient reduction doubles the gradients (a stand-in for an
    average that changes them) and that records the order of the calls."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls, self.reduced_norms = [], []

    def reduce_gradients(self):
        super().reduce_gradients()
        for p in self._params:
            if p.grad is not None:
                p.grad.mul_(2.0)
        self.calls.append("reduce")
        self.reduced_norms.append(float(torch.nn.utils.get_total_norm(
            [p.grad for p in self._params if p.grad is not None])))

    def step(self, closure=None):
        self.calls.append("step")
        return super().step(closure)


def test_update_reduces_the_gradients_before_clipping_them():
    pol = _policy()
    st = _filled_storage(pol, steps=4)
    opt = ReducingTwice(torch.optim.SGD(pol.parameters(), lr=1.0), comm=MPI.COMM_SELF)
    before = torch.cat([p.detach().reshape(-1).clone() for p in pol.parameters()])
    stats = ppo_update(pol, opt, st, gamma=0.99, lam=0.95, clip=0.2, ppo_epoch=1, num_mini_batch=1,
                       value_coef=0.5, entropy_coef=0.01, max_grad_norm=1e-3)
    moved = torch.cat([p.detach().reshape(-1) for p in pol.parameters()]) - before
    assert opt.calls == ["reduce", "step"]
    # The norm clipped and reported is the reduced gradient's, and the step applied it clipped.
    assert stats["grad_norm"] == pytest.approx(opt.reduced_norms[0], rel=1e-6)
    assert float(moved.norm()) == pytest.approx(1e-3, rel=1e-4)
    opt.close()
