"""Our PPO pieces against habitat-baselines' on the same tensors: GAE returns
(``RolloutStorage.compute_returns``) and one PPO update (``PPO.update``), DD-PPO's settings.

One mini-batch per epoch: both pick the environments of a mini-batch at random, from different
random streams, so only the whole-rollout batch is the same data in both. Value-loss clipping
is on; habitat-baselines 0.3 clips it in another form (the clipped value where |V - V_old| >=
clip, instead of DD-PPO's max of the clipped and unclipped losses), and the two agree while
every value moved less than the clip range, as in these updates (checked).
"""

import copy

import numpy as np
import pytest
import torch
from gym import spaces
from habitat_baselines.common.rollout_storage import RolloutStorage as HabitatStorage
from habitat_baselines.rl.ppo import PPO
from torch import nn

from wagma_rl.rl.policy import PointNavPolicy
from wagma_rl.rl.ppo import compute_gae, ppo_update
from wagma_rl.rl.storage import RolloutStorage

T, N, SIZE = 12, 4, 16
GAMMA, LAM, CLIP, LR, EPS, MAX_NORM = 0.99, 0.95, 0.2, 2.5e-4, 1e-5, 0.2
VALUE_COEF, ENTROPY_COEF, EPOCHS = 0.5, 0.01, 2


class HabitatFacing(nn.Module):
    """Our policy behind the part of habitat-baselines' policy interface that PPO calls."""

    def __init__(self, policy, *, before=None):
        super().__init__()
        self.net = policy
        self.num_recurrent_layers = policy.num_recurrent_layers
        self.recurrent_hidden_size = policy.hidden_size
        self._before = [before]  # a list keeps the frozen copy out of this module's parameters
        self.value_moves = []  # per call: max |V - V_before| over the batch

    def evaluate_actions(self, observations, rnn_hidden_states, prev_actions, masks, action,
                         rnn_build_seq_info=None):
        # habitat's batch is time-major (T*k, ...) like ours; its hidden state is (k, L, H).
        args = (observations["depth"], observations["pointgoal_with_gps_compass"],
                prev_actions.view(-1), masks.view(-1).float(), rnn_hidden_states.transpose(0, 1),
                action.view(-1))
        values, log_probs, entropy = self.net.evaluate_actions(*args)
        if self._before[0] is not None:
            with torch.no_grad():
                old = self._before[0].evaluate_actions(*args)[0]
            self.value_moves.append(float((values.detach() - old).abs().max()))
        return values[:, None], log_probs[:, None], entropy[:, None], None, {}

    def policy_parameters(self):
        return list(self.net.parameters())

    def aux_loss_parameters(self):
        return {}


def _policy(rnn_type, rnn_layers):
    torch.manual_seed(7)
    policy = PointNavPolicy(depth_size=SIZE, hidden_size=16, base_planes=4, resnet_layers=(1,),
                            rnn_type=rnn_type, rnn_layers=rnn_layers)
    # A freshly initialised actor is almost uniform, where the entropy has no gradient; a
    # trained-looking one lets the entropy term count in the comparison.
    nn.init.normal_(policy.actor.weight, std=1.0)
    return policy


def _rollout(policy):
    """A rollout of ``policy`` on random observations with random rewards and episode ends."""
    g = torch.Generator().manual_seed(3)
    s = RolloutStorage(num_steps=T, num_envs=N, depth_shape=(SIZE, SIZE, 1),
                       num_recurrent_layers=policy.num_recurrent_layers,
                       hidden_size=policy.hidden_size)
    s.set_first(depth=torch.rand(N, SIZE, SIZE, 1, generator=g), goal=torch.randn(N, 2, generator=g))
    for _ in range(T):
        cur = s.current()
        actions, log_probs, values, h = policy.act(cur["depth"], cur["goal"], cur["prev_actions"],
                                                   cur["masks"], cur["h"])
        s.insert(actions=actions, log_probs=log_probs, values=values,
                 rewards=torch.randn(N, generator=g),
                 next_depth=torch.rand(N, SIZE, SIZE, 1, generator=g),
                 next_goal=torch.randn(N, 2, generator=g), next_hidden=h,
                 next_masks=(torch.rand(N, generator=g) > 0.15).float())
    cur = s.current()
    s.values[T] = policy.act(cur["depth"], cur["goal"], cur["prev_actions"], cur["masks"],
                             cur["h"])[2]  # the bootstrap value
    return s


def _habitat_storage(s, actor_critic):
    """The same rollout in habitat-baselines' RolloutStorage, GAE returns computed by it."""
    obs_space = spaces.Dict({
        "depth": spaces.Box(0.0, 1.0, (SIZE, SIZE, 1), np.float32),
        "pointgoal_with_gps_compass": spaces.Box(-np.inf, np.inf, (2,), np.float32)})
    h = HabitatStorage(T, N, obs_space, spaces.Discrete(4), actor_critic)
    b = h.buffers
    b["observations"]["depth"][:] = s.depth
    b["observations"]["pointgoal_with_gps_compass"][:] = s.goal
    b["recurrent_hidden_states"][:] = s.hidden.transpose(1, 2)
    b["prev_actions"][:] = s.prev_actions[..., None]
    b["masks"][:] = s.masks.bool()[..., None]
    b["actions"][:T] = s.actions[:T, :, None]  # our slot T holds a pending step (VER)
    b["action_log_probs"][:T] = s.log_probs[:T, :, None]
    b["value_preds"][:T] = s.values[:T, :, None]
    b["rewards"][:T] = s.rewards[..., None]
    h.current_rollout_step_idxs = [T]
    h.compute_returns(s.values[T][:, None], True, GAMMA, LAM)
    return h


def test_gae_returns_equal_habitat_baselines_compute_returns():
    policy = _policy("gru", 1)
    s = _rollout(policy)
    assert 0 < int((s.masks[1:] == 0).sum()) < T * N  # some episodes end inside the rollout
    advantages, returns = compute_gae(s.rewards, s.values, s.masks[1:], gamma=GAMMA, lam=LAM)
    theirs = _habitat_storage(s, HabitatFacing(policy)).buffers["returns"][:T, :, 0]
    torch.testing.assert_close(returns, theirs, rtol=0, atol=1e-5)
    torch.testing.assert_close(advantages, theirs - s.values[:T], rtol=0, atol=1e-5)


@pytest.mark.parametrize("rnn_type,rnn_layers", [("gru", 1), ("lstm", 2)])
def test_one_ppo_update_equals_habitat_baselines_ppo(rnn_type, rnn_layers):
    policy = _policy(rnn_type, rnn_layers)
    s = _rollout(policy)
    ours, theirs = copy.deepcopy(policy), copy.deepcopy(policy)

    opt = torch.optim.Adam(ours.parameters(), lr=LR, eps=EPS)
    mine = ppo_update(ours, opt, s, gamma=GAMMA, lam=LAM, clip=CLIP, ppo_epoch=EPOCHS, num_mini_batch=1,
               value_coef=VALUE_COEF, entropy_coef=ENTROPY_COEF, max_grad_norm=MAX_NORM,
               normalize_advantage=False, clip_value=True)

    facing = HabitatFacing(theirs, before=policy)
    hs = _habitat_storage(s, facing)
    stats = PPO(actor_critic=facing, clip_param=CLIP, ppo_epoch=EPOCHS, num_mini_batch=1,
        value_loss_coef=VALUE_COEF, entropy_coef=ENTROPY_COEF, lr=LR, eps=EPS,
        max_grad_norm=MAX_NORM, use_clipped_value_loss=True,
        use_normalized_advantage=False).update(hs)

    # Mean losses and gradient norm (before clipping) over the update's optimizer steps.
    for key, theirs_key in (("value_loss", "value_loss"), ("policy_loss", "action_loss"),
                            ("entropy", "dist_entropy"), ("grad_norm", "grad_norm")):
        assert mine[key] == pytest.approx(stats[theirs_key], rel=1e-4, abs=1e-7), key
    assert mine["grad_norm"] > MAX_NORM  # so clipping took part
    # Adam's first steps are nearly lr * sign(gradient): the parameters agree to far below lr.
    assert len(facing.value_moves) == EPOCHS
    assert max(facing.value_moves) < CLIP  # where the two value-clipping forms agree
    with torch.no_grad():
        moved = max(float((a - p).abs().max())
                    for a, p in zip(ours.parameters(), policy.parameters()))
    assert moved > 0.5 * LR  # the update did something
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-3 * LR, msg=name)
