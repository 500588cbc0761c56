"""An outer optimizer on the global model average (DiLoCo, Douillard et al. 2023, arXiv 2311.08105).

Without it a global average A simply becomes every replica's model. With ``outer="nesterov"`` the
change since the last global model is treated as a gradient: keeping ``prev`` (the model all ranks
agreed on at the last global average; at the start the initial model) and a momentum buffer ``m``,

    d = prev - A;   m = mu * m + d;   T = prev - lr * (d + mu * m);   prev = T

and T becomes the model instead of A. This is PyTorch SGD's Nesterov form (``nesterov=True``,
no dampening) with pseudo-gradient d, computed in float32 as ``T = A + ((1 - lr) * d - (lr * mu) *
m)``, which gives A exactly for ``lr=1, mu=0`` (the plain average). ``native_coll``'s overlapped
global applies the same arithmetic in the same order (``wa_set_outer`` in ``wa.h``).

Memory: ``prev`` and ``m``, two float32 buffers of the model's size, kept on the host and saved
in the optimizer's ``state_dict``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["OUTER_CHOICES", "OuterNesterov", "check_outer_options", "build_outer"]

OUTER_CHOICES = (None, "nesterov")


def check_outer_options(owner: str, outer, outer_lr, outer_momentum) -> dict[str, Any]:
    """Validate ``outer=``, ``outer_lr=``, ``outer_momentum=`` (ValueError in one line); return
    the options to record (empty when ``outer`` is None, so a plain run's state is unchanged)."""
    if outer not in OUTER_CHOICES:
        raise ValueError(f"{owner} outer must be None or 'nesterov', got {outer!r}")
    for name, value in (("outer_lr", outer_lr), ("outer_momentum", outer_momentum)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            raise ValueError(f"{owner} {name} must be a number, got {value!r}")
    if not outer_lr > 0:
        raise ValueError(f"{owner} outer_lr must be > 0, got {outer_lr!r} (DiLoCo uses 0.7)")
    if not 0 <= outer_momentum < 1:
        raise ValueError(f"{owner} outer_momentum must be in [0, 1), got {outer_momentum!r} "
                         "(DiLoCo uses 0.9)")
    if outer is None:
        return {}
    return {"outer": outer, "outer_lr": float(outer_lr), "outer_momentum": float(outer_momentum)}


class OuterNesterov:
    """The outer Nesterov step on a flat float32 model (see the module docstring).

    Args:
        model: the flat model (1-D float32 CPU tensor) every rank holds now; ``prev`` starts as a
            copy of it, the momentum at zero.
        lr: outer learning rate (> 0).
        momentum: outer momentum mu, in [0, 1).
        extra: zero slots after the model (the averaged buffer's status slots, which stay zero);
            not saved, so a state resumes at another world size.
    """

    def __init__(self, model: torch.Tensor, *, lr: float, momentum: float, extra: int = 0):
        self.lr, self.momentum = float(lr), float(momentum)
        self.numel = model.numel()
        self.prev = torch.zeros(self.numel + extra, dtype=torch.float32)
        self.prev[:self.numel] = model.detach().reshape(-1)
        self.buf = torch.zeros_like(self.prev)
        # Rounded to float32 once, as the native twin does.
        self._keep = float(np.float32(1.0 - self.lr))
        self._push = float(np.float32(self.lr * self.momentum))
        self._mu = float(np.float32(self.momentum))

    @torch.no_grad()
    def step(self, average: torch.Tensor) -> None:
        """Replace ``average`` (A, the same on every rank) in place by the outer step's T, and
        make T the new ``prev``."""
        d = self.prev.sub_(average)  # prev is overwritten by T below; use its storage for d
        self.buf.mul_(self._mu).add_(d)
        d.mul_(self._keep).sub_(self.buf * self._push)
        average.add_(d)
        self.prev.copy_(average)

    def state_dict(self) -> dict[str, Any]:
        """``prev`` and the momentum buffer (copies) and the options."""
        return {"kind": "nesterov", "lr": self.lr, "momentum": self.momentum,
                "prev": self.prev[:self.numel].clone(), "buf": self.buf[:self.numel].clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output into the existing buffers (in place: the native
        collective may hold their addresses)."""
        for name in ("prev", "buf"):
            value = torch.as_tensor(state[name], dtype=torch.float32).reshape(-1)
            if value.numel() != self.numel:
                raise ValueError(f"outer optimizer state holds {value.numel()} values for "
                                 f"{name}, the model has {self.numel}: it was saved for "
                                 "another model")
            getattr(self, name)[:self.numel].copy_(value)
            getattr(self, name)[self.numel:].zero_()

    def restart(self, model: torch.Tensor) -> None:
        """Start afresh from ``model``: ``prev`` = model, momentum zero (a checkpoint without
        outer state)."""
        self.prev.zero_()
        self.prev[:self.numel].copy_(model.reshape(-1))
        self.buf.zero_()


def build_outer(options: dict[str, Any], model: torch.Tensor, *, extra: int = 0) -> OuterNesterov | None:
    """The outer optimizer :func:`check_outer_options` described, or None."""
    if not options:
        return None
    return OuterNesterov(model, lr=options["outer_lr"], momentum=options["outer_momentum"],
                         extra=extra)
