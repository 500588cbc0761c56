"""Rollout storage for a recurrent policy, with rollouts that may end early (DD-PPO preemption).

Index convention (as habitat-lab): slot ``t`` holds the inputs the policy saw at step ``t``
(observation, recurrent state, previous action, mask) and what it did (action, log-prob, value);
``rewards[t]`` and ``masks[t + 1]`` come from the environment step that followed. ``step`` is how
many steps this rollout holds; a preempted rollout simply has a smaller ``step``.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import torch

__all__ = ["RolloutStorage", "MiniBatch"]


@dataclasses.dataclass(frozen=True)
class MiniBatch:
    """One mini-batch: a subset of environments over the whole rollout, time-major flattened.

    Every field is (T*n, ...) except ``h0`` (L, n, H), the recurrent state at the rollout start.
    """

    depth: torch.Tensor
    goal: torch.Tensor
    prev_actions: torch.Tensor
    masks: torch.Tensor
    actions: torch.Tensor
    old_log_probs: torch.Tensor
    old_values: torch.Tensor
    returns: torch.Tensor
    advantages: torch.Tensor
    h0: torch.Tensor


class RolloutStorage:
    """Fixed-capacity buffers of ``num_steps + 1`` slots for ``num_envs`` environments."""

    def __init__(self, *, num_steps: int, num_envs: int, depth_shape: tuple[int, ...],
                 num_recurrent_layers: int, hidden_size: int, device: torch.device | str = "cpu"):
        t, n = num_steps, num_envs
        dev = torch.device(device)
        self.num_steps, self.num_envs, self.device = t, n, dev
        self.depth = torch.zeros(t + 1, n, *depth_shape, device=dev)
        self.goal = torch.zeros(t + 1, n, 2, device=dev)
        self.hidden = torch.zeros(t + 1, num_recurrent_layers, n, hidden_size, device=dev)
        self.prev_actions = torch.full((t + 1, n), -1, dtype=torch.long, device=dev)
        self.masks = torch.zeros(t + 1, n, device=dev)  # 0: an episode starts at this slot
        self.actions = torch.zeros(t, n, dtype=torch.long, device=dev)
        self.log_probs = torch.zeros(t, n, device=dev)
        self.values = torch.zeros(t + 1, n, device=dev)
        self.rewards = torch.zeros(t, n, device=dev)
        self.step = 0

    def set_first(self, *, depth: torch.Tensor, goal: torch.Tensor) -> None:
        """Put the first observation of a fresh start into slot 0."""
        self.depth[0].copy_(depth)
        self.goal[0].copy_(goal)
        self.masks[0].zero_()
        self.prev_actions[0].fill_(-1)
        self.hidden[0].zero_()
        self.step = 0

    def insert(self, *, actions, log_probs, values, rewards, next_depth, next_goal, next_hidden,
               next_masks) -> None:
        """Record step ``self.step``'s action and outcome, and the inputs of the next step."""
        if self.step >= self.num_steps:
            raise RuntimeError(f"rollout storage is full ({self.num_steps} steps)")
        t = self.step
        self.actions[t].copy_(actions)
        self.log_probs[t].copy_(log_probs)
        self.values[t].copy_(values)
        self.rewards[t].copy_(rewards)
        self.depth[t + 1].copy_(next_depth)
        self.goal[t + 1].copy_(next_goal)
        self.hidden[t + 1].copy_(next_hidden)
        self.masks[t + 1].copy_(next_masks)
        self.prev_actions[t + 1].copy_(actions)
        self.step = t + 1

    def current(self) -> dict[str, torch.Tensor]:
        """The policy inputs for the next step (slot ``step``)."""
        t = self.step
        return {"depth": self.depth[t], "goal": self.goal[t], "prev_actions": self.prev_actions[t],
                "masks": self.masks[t], "h": self.hidden[t]}

    def after_update(self) -> None:
        """Carry the last slot over as slot 0 of the next rollout."""
        t = self.step
        for buf in (self.depth, self.goal, self.hidden, self.prev_actions, self.masks):
            buf[0].copy_(buf[t])
        self.step = 0

    def mini_batches(self, advantages: torch.Tensor, returns: torch.Tensor, num_mini_batch: int, *,
                     generator: torch.Generator | None = None) -> Iterator[MiniBatch]:
        """Yield ``num_mini_batch`` mini-batches that split the environments (never time, so the
        recurrent core re-runs whole sequences and every worker yields the same number of batches
        whatever its rollout length)."""
        n, t = self.num_envs, self.step
        if num_mini_batch < 1 or num_mini_batch > n:
            raise ValueError(f"num_mini_batch ({num_mini_batch}) must be between 1 and the number of "
                             f"environments per worker ({n})")
        if t == 0:
            raise RuntimeError("mini_batches() on an empty rollout")
        perm = torch.randperm(n, generator=generator).to(self.device)
        for idx in perm.chunk(num_mini_batch):
            k = idx.numel()

            def flat(buf: torch.Tensor) -> torch.Tensor:
                return buf[:t, idx].reshape(t * k, *buf.shape[2:])

            yield MiniBatch(
                depth=flat(self.depth), goal=flat(self.goal), prev_actions=flat(self.prev_actions),
                masks=flat(self.masks), actions=flat(self.actions), old_log_probs=flat(self.log_probs),
                old_values=flat(self.values), returns=flat(returns), advantages=flat(advantages),
                h0=self.hidden[0][:, idx])
