"""PPO pieces: generalised advantage estimation, the clipped losses, and one PPO update.

The update steps whatever optimizer it is given: a plain torch one, or a distributed one from
``wagma_rl.optim`` (DD-PPO modes average gradients, WAGMA mode averages models after the update).
Each mini-batch runs backward, reduce gradients, clip, step, in that order, so the clip sees the
gradient the step applies (the averaged one in DD-PPO modes, as DDP + ``clip_grad_norm_``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from wagma_rl.job.precision import autocast
from wagma_rl.optim import DistributedOptimizer

from .storage import RolloutStorage

__all__ = ["compute_gae", "ppo_losses", "PPOLosses", "ppo_update"]


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, not_done: torch.Tensor, *,
                gamma: float, lam: float,
                lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over a (T, N) rollout.

    ``rewards[t]``: reward of step t; ``values``: (T+1, N), ``values[T]`` the bootstrap value of the
    state after the last step; ``not_done[t]``: 0 when the episode ended at step t (the value after
    it belongs to a new episode and is not bootstrapped). ``lengths`` (N,): env i's segment holds
    only its first ``lengths[i]`` steps and bootstraps from ``values[lengths[i], i]`` (variable
    experience rollouts); its slots past the segment get advantage 0. Returns (advantages,
    returns), each (T, N).
    """
    t_len = rewards.shape[0]
    if values.shape[0] != t_len + 1 or not_done.shape[0] != t_len:
        raise ValueError(f"shapes: rewards {tuple(rewards.shape)}, values {tuple(values.shape)} "
                         f"(need T+1 rows), not_done {tuple(not_done.shape)} (need T rows)")
    inside = None
    if lengths is not None:
        inside = (torch.arange(t_len)[:, None] < lengths.cpu()[None, :]).to(rewards)
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(t_len)):
        delta = rewards[t] + gamma * values[t + 1] * not_done[t] - values[t]
        last = delta + gamma * lam * not_done[t] * last
        if inside is not None:  # past a segment's end: nothing to carry back into it
            last = torch.where(inside[t] > 0, last, 0.0)
        advantages[t] = last
    return advantages, advantages + values[:-1]


@dataclass
class PPOLosses:
    """The terms of one PPO mini-batch loss (``total`` is what is differentiated)."""

    total: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor


def ppo_losses(*, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
               values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               entropy: torch.Tensor, clip: float, value_coef: float, entropy_coef: float,
               clip_value: bool = True, valid: torch.Tensor | None = None) -> PPOLosses:
    """PPO's clipped surrogate, (clipped) value loss and entropy bonus, each a mean over samples.

    policy = -mean(min(r A, clip(r, 1-clip, 1+clip) A)), r = exp(log_probs - old_log_probs);
    value = 0.5 mean(max((V - R)^2, (V_old + clip(V - V_old, -clip, clip) - R)^2)) when
    ``clip_value`` else 0.5 mean((V - R)^2); total = policy + value_coef value - entropy_coef entropy.
    ``valid``: a 0/1 weight per sample (padding of variable-length segments is 0); the means are
    then over the valid samples only (0 when there are none).
    """
    def mean(x: torch.Tensor) -> torch.Tensor:
        if valid is None:
            return x.mean()
        # where, not a product: padding holds stale inputs whose outputs need not be finite
        return torch.where(valid > 0, x, 0.0).sum() / valid.sum().clamp(min=1.0)

    ratio = torch.exp(log_probs - old_log_probs)
    surr1 = ratio * advantages
    surr2 = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages
    policy_loss = -mean(torch.min(surr1, surr2))
    if clip_value:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        value_loss = 0.5 * mean(torch.max((values - returns).pow(2), (clipped - returns).pow(2)))
    else:
        value_loss = 0.5 * mean((values - returns).pow(2))
    ent = mean(entropy)
    total = policy_loss + value_coef * value_loss - entropy_coef * ent
    with torch.no_grad():
        clip_fraction = mean(((ratio - 1.0).abs() > clip).float())
        approx_kl = mean(old_log_probs - log_probs)
    return PPOLosses(total, policy_loss, value_loss, ent, clip_fraction, approx_kl)


def ppo_update(policy: nn.Module, optimizer, storage: RolloutStorage, *, gamma: float, lam: float,
               clip: float, ppo_epoch: int, num_mini_batch: int, value_coef: float,
               entropy_coef: float, max_grad_norm: float, normalize_advantage: bool = True,
               clip_value: bool = True, generator: torch.Generator | None = None,
               precision: str = "fp32") -> dict[str, float]:
    """Run PPO on the rollout in ``storage`` (its ``values[step]`` must hold the bootstrap value).

    The gradient norm is clipped to ``max_grad_norm`` after the gradients are reduced over the
    workers. Returns mean statistics: value_loss, policy_loss, entropy, clip_fraction, approx_kl,
    grad_norm (before clipping).
    Every call makes exactly ``ppo_epoch * num_mini_batch`` optimizer steps, whatever the rollout
    length, so gradient-averaging optimizers stay in lock-step across workers. ``precision``
    (``run.precision``): bf16 runs the forward pass and the losses under autocast; the backward
    pass, the parameters and the optimizer stay fp32. The statistics are summed on the device and
    read once, after the last step.
    """
    t = storage.step
    lengths = None if storage.uniform else storage.lengths
    advantages, returns = compute_gae(storage.rewards[:t], storage.values[:t + 1],
                                      storage.masks[1:t + 1], gamma=gamma, lam=lam, lengths=lengths)
    if normalize_advantage:
        if lengths is None:
            advantages = (advantages - advantages.mean()) / (advantages.std(unbiased=False) + 1e-5)
        else:  # over the steps the segments hold, not their padding
            inside = storage.valid_mask().bool()
            real = advantages[inside]
            advantages = torch.where(inside, (advantages - real.mean()) / (real.std(unbiased=False) + 1e-5), 0.0)
    params = [p for p in policy.parameters() if p.requires_grad]
    keys = ("value_loss", "policy_loss", "entropy", "clip_fraction", "approx_kl", "grad_norm")
    sums = torch.zeros(len(keys), dtype=torch.float64, device=storage.device)
    n = 0
    for _ in range(ppo_epoch):
        for mb in storage.mini_batches(advantages, returns, num_mini_batch, generator=generator):
            with autocast(storage.device, precision):
                values, log_probs, entropy = policy.evaluate_actions(
                    mb.depth, mb.goal, mb.prev_actions, mb.masks, mb.h0, mb.actions, valid=mb.valid)
                losses = ppo_losses(log_probs=log_probs.float(), old_log_probs=mb.old_log_probs,
                                    advantages=mb.advantages, values=values.float(),
                                    old_values=mb.old_values, returns=mb.returns,
                                    entropy=entropy.float(), clip=clip, value_coef=value_coef,
                                    entropy_coef=entropy_coef, clip_value=clip_value,
                                    valid=mb.valid)
            optimizer.zero_grad()
            losses.total.backward()
            if isinstance(optimizer, DistributedOptimizer):
                optimizer.reduce_gradients()  # DD-PPO modes: the average over workers, here
            grad_norm = nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            sums += torch.stack([losses.value.detach(), losses.policy.detach(),
                                 losses.entropy.detach(), losses.clip_fraction,
                                 losses.approx_kl, grad_norm.detach()]).to(sums)
            n += 1
    return dict(zip(keys, (sums / n).tolist()))
