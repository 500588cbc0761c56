"""The DD-PPO PointNav actor-critic: depth ResNet (GroupNorm) + goal and previous-action embeddings,
a recurrent core (GRU or LSTM), and categorical policy / value heads.

Recurrent state is one tensor ``(num_recurrent_layers, N, hidden_size)``; for an LSTM the ``h`` and
``c`` layers are stacked in it, so storage and checkpoints never care which cell is used. A ``mask``
of 0 for an environment means "a new episode starts here": its state and previous action are reset.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["ResNetEncoder", "RecurrentCore", "PointNavPolicy", "goal_features", "count_parameters",
           "packs", "NUM_ACTIONS", "SENSOR_SETS"]

NUM_ACTIONS = 4  # STOP, MOVE_FORWARD, TURN_LEFT, TURN_RIGHT
#: The camera sets the visual encoder reads: depth (1 channel), or depth then RGB (4 channels).
SENSOR_SETS = (("depth",), ("depth", "rgb"))
_STEM = "encoder.stem.0.weight"  # (planes, channels, 5, 5): the channels tell the sensors


def _groups(channels: int, ngroups: int) -> int:
    # GroupNorm needs groups | channels; fall back to the largest divisor not above ngroups.
    g = max(1, min(ngroups, channels))
    while channels % g:
        g -= 1
    return g


class _GroupNorm(nn.GroupNorm):
    """GroupNorm that, with ``in_autocast_dtype`` and under autocast, computes in the dtype of
    its (autocast-made) input instead of autocast's float32: no casts around it, half the memory
    traffic, and the next convolution reads its output as it is. Torch's kernels accumulate the
    statistics in float32 either way; the parameters stay float32 and are cast for the call."""

    def __init__(self, num_groups: int, num_channels: int, *, in_autocast_dtype: bool = False):
        super().__init__(num_groups, num_channels)
        self.in_autocast_dtype = in_autocast_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.in_autocast_dtype and x.dtype in (torch.bfloat16, torch.float16)
                and torch.is_autocast_enabled(x.device.type)):
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            return F.group_norm(x, self.num_groups, self.weight.to(x.dtype),
                                self.bias.to(x.dtype), self.eps)


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, ngroups: int, low: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.gn1 = _GroupNorm(_groups(cout, ngroups), cout, in_autocast_dtype=low)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.gn2 = _GroupNorm(_groups(cout, ngroups), cout, in_autocast_dtype=low)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                      _GroupNorm(_groups(cout, ngroups), cout, in_autocast_dtype=low))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNetEncoder(nn.Module):
    """A ResNet of basic blocks with GroupNorm (DD-PPO normalises with GroupNorm because batch
    statistics differ between workers). ``layers`` gives blocks per stage; each stage after the
    first halves the resolution and doubles the width. Output: a flat feature vector."""

    def __init__(self, *, in_channels: int = 1, input_size: int = 64, base_planes: int = 8,
                 layers: tuple[int, ...] | list[int] = (1, 1, 1), ngroups: int = 4,
                 compressed_channels: int = 32, norm_in_autocast_dtype: bool = False):
        super().__init__()
        low = norm_in_autocast_dtype
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, base_planes, 5, stride=2, padding=2, bias=False),
            _GroupNorm(_groups(base_planes, ngroups), base_planes, in_autocast_dtype=low),
            nn.ReLU(True), nn.MaxPool2d(3, stride=2, padding=1))
        blocks, cin = [], base_planes
        for i, n in enumerate(layers):
            cout = base_planes * (2 ** i)
            for j in range(n):
                blocks.append(_BasicBlock(cin, cout, 2 if (i > 0 and j == 0) else 1, ngroups, low))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        # A 3x3 compression like DD-PPO's, so the flat feature stays small whatever the width.
        self.compress = nn.Sequential(
            nn.Conv2d(cin, compressed_channels, 3, padding=1, bias=False),
            _GroupNorm(_groups(compressed_channels, ngroups), compressed_channels,
                       in_autocast_dtype=low), nn.ReLU(True))
        with torch.no_grad():
            self.output_size = int(self.forward(torch.zeros(1, in_channels, input_size, input_size)).shape[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.compress(self.blocks(self.stem(x))).flatten(1)


def packs(stretches: int, t_len: int, device: torch.device) -> bool:
    """Whether :class:`RecurrentCore` runs a rollout of ``t_len`` steps whose envs start episodes
    at ``stretches`` steps as one packed call (else one call per stretch between those steps).
    Measured with benchmarks/recurrent_core.py (LSTM 2 x 512, 128 steps x 8 envs): on cpu the
    stretches win below about T / 4 (1.8x at 20 of 128) and packing above (5.8x at 112); on a
    GPU, where each stretch is a kernel launch sequence of its own, packing won at every count
    measured (1.6x at 14, 3.7x at 52, 14x at 109 on an H200), so there it packs past 4."""
    if device.type == "cuda":
        return stretches > 4
    return stretches > t_len // 4


class RecurrentCore(nn.Module):
    """GRU or LSTM over time with per-step episode-start masks."""

    def __init__(self, *, input_size: int, hidden_size: int, num_layers: int = 1,
                 rnn_type: Literal["gru", "lstm"] = "gru"):
        super().__init__()
        if rnn_type not in ("gru", "lstm"):
            raise ValueError(f"rnn_type must be 'gru' or 'lstm', got {rnn_type!r}")
        self.rnn_type = rnn_type
        self.num_layers = num_layers
        self.hidden_size = hidden_size
        cls = nn.GRU if rnn_type == "gru" else nn.LSTM
        self.rnn = cls(input_size, hidden_size, num_layers=num_layers)
        for name, p in self.rnn.named_parameters():
            if "weight" in name:
                nn.init.orthogonal_(p)
            else:
                nn.init.zeros_(p)

    @property
    def num_recurrent_layers(self) -> int:
        return self.num_layers * (2 if self.rnn_type == "lstm" else 1)

    def _unpack(self, h: torch.Tensor):
        if self.rnn_type == "lstm":
            return (h[: self.num_layers].contiguous(), h[self.num_layers:].contiguous())
        return h

    def _pack(self, h) -> torch.Tensor:
        return torch.cat(h, 0) if self.rnn_type == "lstm" else h

    def forward(self, x: torch.Tensor, h: torch.Tensor, masks: torch.Tensor):
        """``x`` (T*N, F) time-major, ``h`` (L, N, H), ``masks`` (T*N,) -> (out (T*N, H), h_T)."""
        n = h.shape[1]
        t_len = x.shape[0] // n
        x = x.view(t_len, n, -1)
        masks = masks.view(t_len, n)
        if t_len == 1:  # one step (acting): no episode boundary to find, nothing read back
            h = h * masks[0].view(1, n, 1)
            out, hh = self.rnn(x, self._unpack(h))
            return out.view(n, -1), self._pack(hh)
        opens = (masks == 0).cpu().numpy()  # (T, N): the one read back of a sequence
        steps = np.flatnonzero(opens[1:].any(axis=1)) + 1
        if not packs(len(steps), t_len, x.device):
            return self._by_stretch(x, h, masks, steps.tolist())
        return self._by_episode(x, h, masks, opens)

    def _by_stretch(self, x, h, masks, starts):
        """The cell over the longest stretches with no episode start in any env: one call per
        stretch (the faster way when episodes start at few steps of the rollout)."""
        t_len, n = masks.shape
        bounds = [0] + starts + [t_len]
        outs = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            h = h * masks[a].view(1, n, 1)
            out, hh = self.rnn(x[a:b], self._unpack(h))
            h = self._pack(hh)
            outs.append(out)
        return torch.cat(outs, 0).view(t_len * n, -1), h

    def _by_episode(self, x, h, masks, opens):
        """The cell over a (T, N) rollout in one call: every env's segment between episode starts
        is its own sequence of a packed batch (as habitat-baselines packs episodes), the first
        segment of env i starting from ``h[:, i] * masks[0, i]``, the others from zeros: one
        cuDNN/MKL call where the stretches would be many short ones (benchmarks/recurrent_core.py
        on cpu, LSTM 2 x 512, 128 steps x 8 envs: 112 stretches 5.8x faster, 49 1.3x; at 20
        the stretches win 1.8x; on an H200 packing won at every count measured, 1.6x at 14
        stretches, 14x at 109: :func:`packs` decides)."""
        t_len, n = masks.shape
        opens = opens.T.copy()  # (N, T)
        opens[:, 0] = True
        seg_env, seg_start = np.nonzero(opens)  # by env, then time
        last = np.append(seg_env[1:] != seg_env[:-1], True)  # each env's last segment
        seg_end = np.where(last, t_len, np.append(seg_start[1:], 0))
        lengths = seg_end - seg_start
        order = np.argsort(-lengths, kind="stable")
        env_s, start_s, len_s = seg_env[order], seg_start[order], lengths[order]
        k = np.arange(int(len_s[0]))[:, None]
        inside = k < len_s[None, :]  # (maxlen, S)
        flat = np.where(inside, (start_s[None, :] + k) * n + env_s[None, :], 0)
        device = x.device
        flat_d = torch.as_tensor(flat, device=device)
        padded = x.reshape(t_len * n, -1)[flat_d]
        packed = nn.utils.rnn.pack_padded_sequence(padded, torch.as_tensor(len_s), enforce_sorted=True)
        first = np.flatnonzero(start_s == 0)
        h0 = h.new_zeros(h.shape[0], len(order), h.shape[2])
        h0[:, torch.as_tensor(first, device=device)] = (h * masks[0].view(1, n, 1))[
            :, torch.as_tensor(env_s[first], device=device)]
        out, hh = self.rnn(packed, self._unpack(h0))
        out, _ = nn.utils.rnn.pad_packed_sequence(out)
        inside_d = torch.as_tensor(inside, device=device)
        result = out.new_zeros(t_len * n, out.shape[-1])
        result[flat_d[inside_d]] = out[inside_d]
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        h_last = self._pack(hh)[:, torch.as_tensor(rank[last], device=device)]  # env order
        return result, h_last


def goal_features(goal: torch.Tensor) -> torch.Tensor:
    """(distance, angle) -> (distance, cos angle, sin angle), as DD-PPO embeds the point goal."""
    return torch.stack([goal[:, 0], torch.cos(-goal[:, 1]), torch.sin(-goal[:, 1])], dim=-1)


class PointNavPolicy(nn.Module):
    """Actor-critic for PointGoal navigation.

    Inputs: ``depth`` (B, H, W, C): depth in [0, 1], and with ``sensors=("depth", "rgb")`` RGB
    as 0-255 values (any dtype) in channels 1-3, which the encoder reads as RGB / 255 beside
    depth (habitat-baselines' ResNet encoder concatenates them so); ``goal`` (B, 2) (distance,
    angle), ``prev_actions`` (B,) with -1 meaning "none", ``masks`` (B,) episode-not-starting
    flags; B = T*N, time-major.
    """

    def __init__(self, *, depth_size: int = 64, use_depth: bool = True,
                 sensors: tuple[str, ...] = ("depth",), hidden_size: int = 128,
                 rnn_type: Literal["gru", "lstm"] = "gru", rnn_layers: int = 1, base_planes: int = 8,
                 resnet_layers: tuple[int, ...] | list[int] = (1, 1, 1), ngroups: int = 4,
                 goal_embed: int = 32, action_embed: int = 32, num_actions: int = NUM_ACTIONS,
                 memory_format: torch.memory_format = torch.contiguous_format,
                 norm_precision: Literal["fp32", "autocast"] = "fp32",
                 compile_encoder: bool | str = False):
        super().__init__()
        self.memory_format = memory_format  # of the visual encoder's weights and activations
        self.num_actions = num_actions
        if tuple(sensors) not in SENSOR_SETS:
            raise ValueError(f"sensors must be one of {[list(s) for s in SENSOR_SETS]}, got "
                             f"{list(sensors)}")
        self.use_depth = use_depth
        self.sensors = tuple(sensors)
        self.rgb = "rgb" in self.sensors
        feat = 0
        if use_depth:
            self.encoder = ResNetEncoder(in_channels=4 if self.rgb else 1, input_size=depth_size,
                                         base_planes=base_planes,
                                         layers=tuple(resnet_layers), ngroups=ngroups,
                                         norm_in_autocast_dtype=norm_precision == "autocast")
            self.encoder.to(memory_format=memory_format)
            if compile_encoder:  # experimental, not a config key: docs/gpu.md says why
                self.encoder.compile(backend="inductor" if compile_encoder is True
                                     else compile_encoder)  # a string: another backend
            self.visual_fc = nn.Sequential(nn.Linear(self.encoder.output_size, hidden_size), nn.ReLU(True))
            feat += hidden_size
        self.goal_fc = nn.Linear(3, goal_embed)
        self.prev_action_embed = nn.Embedding(num_actions + 1, action_embed)
        feat += goal_embed + action_embed
        self.core = RecurrentCore(input_size=feat, hidden_size=hidden_size, num_layers=rnn_layers,
                                  rnn_type=rnn_type)
        self.actor = nn.Linear(hidden_size, num_actions)
        self.critic = nn.Linear(hidden_size, 1)
        nn.init.orthogonal_(self.actor.weight, gain=0.01)
        nn.init.zeros_(self.actor.bias)
        nn.init.orthogonal_(self.critic.weight)
        nn.init.zeros_(self.critic.bias)

    @property
    def num_recurrent_layers(self) -> int:
        return self.core.num_recurrent_layers

    @property
    def hidden_size(self) -> int:
        return self.core.hidden_size

    def initial_state(self, n: int, device=None) -> torch.Tensor:
        return torch.zeros(self.num_recurrent_layers, n, self.hidden_size, device=device)

    def _features(self, depth, goal, prev_actions, masks, h, valid=None):
        parts = []
        if self.use_depth:
            parts.append(self._visual(depth, valid))
        parts.append(self.goal_fc(goal_features(goal)))
        # Index 0 means "no previous action": at an episode start (mask 0) or before the first step.
        idx = ((prev_actions.long() + 1) * masks.long()).clamp(min=0)
        parts.append(self.prev_action_embed(idx))
        return self.core(torch.cat(parts, dim=-1), h, masks)

    def _visual(self, depth, valid):
        """The visual encoder's features; with ``valid`` (B,) only for the rows it marks (the
        others, padding of a variable-length segment, get zeros). Padding sits at the end of each
        env's sequence, so no valid step's output depends on it (the recurrent core runs forward
        in time)."""
        want = 4 if self.rgb else 1
        if depth.shape[-1] != want:
            raise ValueError(f"the policy reads sensors {list(self.sensors)} ({want} channel"
                             f"{'s' if want > 1 else ''}); the observation has {depth.shape[-1]}")
        if valid is None:
            return self.visual_fc(self.encoder(self._channels(depth)))
        rows = (valid > 0).nonzero().squeeze(-1)
        feats = self.visual_fc(self.encoder(self._channels(depth[rows])))
        return feats.new_zeros(depth.shape[0], feats.shape[1]).index_copy(0, rows, feats)

    def _channels(self, visual):
        """(B, H, W, C) observation -> (B, C, H, W) float input: depth, then RGB / 255."""
        x = visual.permute(0, 3, 1, 2).float()
        x = torch.cat([x[:, :1], x[:, 1:] / 255.0], dim=1) if self.rgb else x
        return x.contiguous(memory_format=self.memory_format)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """:meth:`torch.nn.Module.load_state_dict`, refusing in one line a state trained on other
        cameras (depth alone against depth and RGB)."""
        mine, theirs = self.state_dict().get(_STEM), state_dict.get(_STEM)
        if mine is not None and theirs is not None and theirs.shape[1] != mine.shape[1]:
            saved = list(SENSOR_SETS[theirs.shape[1] == 4])
            raise RuntimeError(f"the model was trained on sensors {saved}, this policy reads "
                               f"{list(self.sensors)}: set env.sensors={saved} (or train anew)")
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def forward(self, depth, goal, prev_actions, masks, h, *, valid=None):
        """Return (logits (B, A), values (B,), new state). ``valid``: see :meth:`evaluate_actions`."""
        x, h = self._features(depth, goal, prev_actions, masks, h, valid)
        return self.actor(x), self.critic(x).squeeze(-1), h

    @torch.no_grad()
    def act(self, depth, goal, prev_actions, masks, h, *, deterministic: bool = False,
            noise: torch.Tensor | None = None):
        """One step for N envs: (actions, log_probs, values, new state). ``noise``: the (N,
        actions) uniform draws of the sampling, made by the caller (a CUDA graph draws them
        outside the graph); default: drawn here from the default generator."""
        logits, values, h = self.forward(depth, goal, prev_actions, masks, h)
        # A diverged model must not crash one worker alone here (its peers would wait for it):
        # sampling uses finite logits, while the NaN values and log-probs flow on into the loss,
        # the gradients and the model, where the optimizers' finiteness check stops every worker
        # together with one message.
        safe = torch.nan_to_num(logits, nan=0.0, posinf=0.0, neginf=0.0)
        if deterministic:
            actions = safe.argmax(-1)
        else:
            # Gumbel-max: argmax(logits + Gumbel noise) is a draw from softmax(logits), with
            # nothing read back to the host (torch.multinomial checks its input with two reads,
            # a device synchronisation at every step on a GPU).
            u = noise if noise is not None else torch.rand(safe.shape, device=safe.device,
                                                           dtype=torch.float32)
            actions = (safe.float() - torch.log(-torch.log(u))).argmax(-1)
        log_probs = torch.distributions.Categorical(logits=logits, validate_args=False).log_prob(actions)
        return actions, log_probs, values, h

    def evaluate_actions(self, depth, goal, prev_actions, masks, h0, actions, *, valid=None):
        """Re-run a (T, N) sequence from state ``h0``: (values, log_probs, entropy), each (T*N,).

        ``valid`` (T*N,), 0/1: the steps of variable-length segments padded at their end (VER);
        the outputs at padding are then meaningless (the loss must mask them) and the depth
        encoder does not run there."""
        logits, values, _ = self.forward(depth, goal, prev_actions, masks, h0, valid=valid)
        dist = torch.distributions.Categorical(logits=logits, validate_args=False)
        return values, dist.log_prob(actions), dist.entropy()


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters in ``model``."""
    return sum(p.numel() for p in model.parameters())

