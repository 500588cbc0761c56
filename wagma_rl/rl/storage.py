"""Rollout storage for a recurrent policy, with rollouts whose length differs between workers
(DD-PPO preemption) and between environments (variable experience rollouts, VER).

Index convention (as habitat-lab): slot ``t`` of environment ``i`` holds the inputs the policy saw
at that env's step ``t`` (observation, recurrent state, previous action, mask) and what it did
(action, log-prob, value); ``rewards[t]`` and ``masks[t + 1]`` come from the environment step that
followed. ``lengths[i]`` is how many completed steps env ``i`` holds. A step happens in two parts:
:meth:`RolloutStorage.act` records the action chosen at slot ``lengths[i]`` (the step is *pending*
while the environment simulates it), :meth:`RolloutStorage.complete` records its outcome and
advances ``lengths[i]``. Lock-step collection does both at once (:meth:`RolloutStorage.insert`);
VER leaves a step pending across the update, so slot ``lengths[i]`` always holds the bootstrap
value of env ``i`` and, after :meth:`RolloutStorage.after_update`, slot 0 of the next rollout holds
the step still being simulated.

Observations: ``depth`` arguments and results are (…, H, W, C) visual tensors (see
:func:`wagma_rl.rl.setup.obs_to_torch`): depth alone (C = 1), or depth then RGB as 0-255
values (C = 4). RGB is kept as uint8 (a quarter of float's memory): :attr:`RolloutStorage.depth`
holds channel 0 as float, :attr:`RolloutStorage.rgb` channels 1-3, allocated on the first
observation with them.
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
    ``valid`` is None when every environment of the batch holds T steps, else a (T*n,) float mask
    of the slots that hold a step (shorter segments are padded at their end).
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
    valid: torch.Tensor | None = None


class RolloutStorage:
    """Buffers of ``num_steps + 1`` slots for each of ``num_envs`` environments.
    ``depth_shape``: (H, W, C) of an observation (C = 4: depth and RGB)."""

    def __init__(self, *, num_steps: int, num_envs: int, depth_shape: tuple[int, ...],
                 num_recurrent_layers: int, hidden_size: int, device: torch.device | str = "cpu"):
        t, n = num_steps, num_envs
        dev = torch.device(device)
        self.num_steps, self.num_envs, self.device = t, n, dev
        *hw, channels = depth_shape
        self.depth = torch.zeros(t + 1, n, *hw, 1, device=dev)
        self.rgb: torch.Tensor | None = None
        """(T + 1, N, H, W, 3) uint8 when the observations have RGB, else None."""
        if channels == 4:
            self._add_rgb()
        self.goal = torch.zeros(t + 1, n, 2, device=dev)
        self.hidden = torch.zeros(t + 1, num_recurrent_layers, n, hidden_size, device=dev)
        self.prev_actions = torch.full((t + 1, n), -1, dtype=torch.long, device=dev)
        self.masks = torch.zeros(t + 1, n, device=dev)  # 0: an episode starts at this slot
        # Slot t of actions/log_probs/values may hold a pending step (VER: one that goes on
        # during the update and opens the next rollout).
        self.actions = torch.zeros(t + 1, n, dtype=torch.long, device=dev)
        self.log_probs = torch.zeros(t + 1, n, device=dev)
        self.values = torch.zeros(t + 1, n, device=dev)
        self.rewards = torch.zeros(t, n, device=dev)
        self.next_hidden = torch.zeros(num_recurrent_layers, n, hidden_size, device=dev)
        """The recurrent state after each env's pending step (slot ``lengths + 1``'s, once it ends)."""
        self.lengths = torch.zeros(n, dtype=torch.long)
        self.all_envs = torch.arange(n)
        self._set_common(0)

    def _set_common(self, length: int | None) -> None:
        """Record that every env holds ``length`` steps (None: not known). Lock-step collection
        then indexes slots from this int and never reads a tensor back; a change to ``lengths``
        made elsewhere (its version moves) voids the record."""
        self._common = length
        self._common_of = (self.lengths, self.lengths._version)

    def _lockstep(self) -> int | None:
        """Every env's length when the record of :meth:`_set_common` still holds, else None."""
        tensor, version = self._common_of
        if self._common is None or tensor is not self.lengths or version != tensor._version:
            return None
        return self._common

    @property
    def step(self) -> int:
        """The longest segment's length (every env's when collection is lock-step)."""
        common = self._lockstep()
        return common if common is not None else int(self.lengths.max())

    @property
    def frames(self) -> int:
        """Completed steps over all environments."""
        common = self._lockstep()
        return common * self.num_envs if common is not None else int(self.lengths.sum())

    @property
    def uniform(self) -> bool:
        """Whether every environment holds the same number of steps."""
        return self._lockstep() is not None or bool((self.lengths == self.lengths[0]).all())

    def _add_rgb(self) -> None:
        self.rgb = torch.zeros(*self.depth.shape[:-1], 3, dtype=torch.uint8, device=self.device)

    def _put(self, index, visual: torch.Tensor) -> None:
        """Write observations ``visual`` (…, C) at ``index`` of the visual buffers."""
        if visual.shape[-1] != (1 if self.rgb is None else 4):
            raise ValueError(f"an observation of {visual.shape[-1]} channels for a storage of "
                             f"{1 if self.rgb is None else 4}")
        self.depth[index] = visual[..., :1]
        if self.rgb is not None:
            self.rgb[index] = visual[..., 1:].to(torch.uint8)  # 0-255 integers: exact

    def _get(self, buf_index) -> torch.Tensor:
        """The observations at ``buf_index(buffer)`` as float (…, C) (RGB back from uint8)."""
        depth = buf_index(self.depth)
        if self.rgb is None:
            return depth
        return torch.cat([depth, buf_index(self.rgb).to(depth.dtype)], dim=-1)

    def set_first(self, *, depth: torch.Tensor, goal: torch.Tensor) -> None:
        """Put the first observation of a fresh start into slot 0 (its channel count fixes the
        buffers': RGB ones are added for a 4-channel one)."""
        if depth.shape[-1] == 4 and self.rgb is None:
            self._add_rgb()
        self._put(0, depth)
        self.goal[0].copy_(goal)
        self.masks[0].zero_()
        self.prev_actions[0].fill_(-1)
        self.hidden[0].zero_()
        self.lengths.zero_()
        self._set_common(0)

    def _ids(self, env_ids) -> torch.Tensor:
        return self.all_envs if env_ids is None else torch.as_tensor(env_ids, dtype=torch.long)

    def current(self, env_ids=None) -> dict[str, torch.Tensor]:
        """The policy inputs of the next step of ``env_ids`` (default all), each env at its own
        slot ``lengths[i]``."""
        t = self._lockstep() if env_ids is None else None
        if t is not None:  # views, no gather
            return {"depth": self._get(lambda b: b[t]), "goal": self.goal[t],
                    "prev_actions": self.prev_actions[t], "masks": self.masks[t],
                    "h": self.hidden[t]}
        ids = self._ids(env_ids)
        pos = self.lengths[ids]
        ids_d, pos_d = ids.to(self.device), pos.to(self.device)
        return {"depth": self._get(lambda b: b[pos_d, ids_d]), "goal": self.goal[pos_d, ids_d],
                "prev_actions": self.prev_actions[pos_d, ids_d], "masks": self.masks[pos_d, ids_d],
                "h": self.hidden[pos_d, :, ids_d].transpose(0, 1)}

    def act(self, *, actions, log_probs, values, next_hidden, env_ids=None) -> None:
        """Record the action chosen for ``env_ids`` (default all) at their current slot: the
        step is pending until :meth:`complete`. ``values`` at that slot is also the bootstrap
        value should the rollout end before the step completes."""
        t = self._lockstep() if env_ids is None else None
        if t is not None:  # lock-step: one slot, an int index
            self.actions[t] = actions
            self.log_probs[t] = log_probs
            self.values[t] = values
            self.next_hidden.copy_(next_hidden)
            return
        ids = self._ids(env_ids)
        pos_d, ids_d = self.lengths[ids].to(self.device), ids.to(self.device)
        self.actions[pos_d, ids_d] = actions
        self.log_probs[pos_d, ids_d] = log_probs
        self.values[pos_d, ids_d] = values
        self.next_hidden[:, ids_d] = next_hidden

    def complete(self, *, rewards, next_depth, next_goal, next_masks, env_ids=None) -> None:
        """Record the outcome of the pending steps of ``env_ids`` (default all): their reward
        and the inputs of their next step; each env's length grows by one."""
        t = self._lockstep() if env_ids is None else None
        if t is not None:  # lock-step: slot copies, an int index
            if t >= self.num_steps:
                raise RuntimeError(f"rollout storage is full ({self.num_steps} steps per "
                                   "environment)")
            self.rewards[t] = rewards
            self._put(t + 1, next_depth)
            self.goal[t + 1] = next_goal
            self.masks[t + 1] = next_masks
            self.prev_actions[t + 1] = self.actions[t]
            self.hidden[t + 1] = self.next_hidden
            self.lengths += 1
            self._set_common(t + 1)
            return
        ids = self._ids(env_ids)
        pos = self.lengths[ids]
        if bool((pos >= self.num_steps).any()):
            raise RuntimeError(f"rollout storage is full ({self.num_steps} steps per environment)")
        self._set_common(None)  # some envs advance without the others (VER)
        pos_d, ids_d = pos.to(self.device), ids.to(self.device)
        self.rewards[pos_d, ids_d] = rewards
        self._put((pos_d + 1, ids_d), next_depth)
        self.goal[pos_d + 1, ids_d] = next_goal
        self.masks[pos_d + 1, ids_d] = next_masks
        self.prev_actions[pos_d + 1, ids_d] = self.actions[pos_d, ids_d]
        self.hidden[pos_d + 1, :, ids_d] = self.next_hidden[:, ids_d].transpose(0, 1)
        self.lengths[ids] += 1

    def insert(self, *, actions, log_probs, values, rewards, next_depth, next_goal, next_hidden,
               next_masks) -> None:
        """Record one lock-step step of every environment: :meth:`act` then :meth:`complete`."""
        self.act(actions=actions, log_probs=log_probs, values=values, next_hidden=next_hidden)
        self.complete(rewards=rewards, next_depth=next_depth, next_goal=next_goal,
                      next_masks=next_masks)

    def after_update(self) -> None:
        """Carry each env's last slot (with its pending step, if any) over as slot 0."""
        bufs = (self.depth, self.goal, self.prev_actions, self.masks, self.actions,
                self.log_probs, self.values) + (() if self.rgb is None else (self.rgb,))
        t = self._lockstep()
        if t is not None:  # lock-step: one slot, copied
            for buf in bufs + (self.hidden,):
                buf[0] = buf[t]
        else:
            ids_d, pos_d = self.all_envs.to(self.device), self.lengths.to(self.device)
            for buf in bufs:
                buf[0] = buf[pos_d, ids_d]
            self.hidden[0] = self.hidden[pos_d, :, ids_d].transpose(0, 1)
        self.lengths.zero_()
        self._set_common(0)

    def valid_mask(self) -> torch.Tensor:
        """(T, N) float: 1 where slot t of env i holds a completed step (T: the longest segment)."""
        t = self.step
        return (torch.arange(t)[:, None] < self.lengths[None, :]).to(self.device, torch.float32)

    def mini_batches(self, advantages: torch.Tensor, returns: torch.Tensor, num_mini_batch: int, *,
                     generator: torch.Generator | None = None) -> Iterator[MiniBatch]:
        """Yield ``num_mini_batch`` mini-batches that split the environments (never time, so the
        recurrent core re-runs whole sequences and every worker yields the same number of batches
        whatever its rollout length). Segments shorter than the batch's longest are padded at
        their end and masked by ``valid``; a batch ends at its own longest segment."""
        n, t = self.num_envs, self.step
        if num_mini_batch < 1 or num_mini_batch > n:
            raise ValueError(f"num_mini_batch ({num_mini_batch}) must be between 1 and the number of "
                             f"environments per worker ({n})")
        if t == 0:
            raise RuntimeError("mini_batches() on an empty rollout")
        valid = None if self.uniform else self.valid_mask()
        perm = torch.randperm(n, generator=generator).to(self.device)
        for idx in perm.chunk(num_mini_batch):
            k = idx.numel()
            # Past its own envs' longest segment a batch holds only padding: the recurrent core
            # would run over it for nothing (its steps are sequential).
            tb = t if valid is None else max(1, int(self.lengths[idx.cpu()].max()))

            def flat(buf: torch.Tensor) -> torch.Tensor:
                return buf[:tb, idx].reshape(tb * k, *buf.shape[2:])

            yield MiniBatch(
                depth=self._get(flat), goal=flat(self.goal), prev_actions=flat(self.prev_actions),
                masks=flat(self.masks), actions=flat(self.actions), old_log_probs=flat(self.log_probs),
                old_values=flat(self.values), returns=flat(returns), advantages=flat(advantages),
                h0=self.hidden[0][:, idx], valid=None if valid is None else flat(valid))
