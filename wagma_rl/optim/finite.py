"""The finiteness check every optimizer runs before a rank contributes to an average.

A NaN or inf in one rank's contribution would reach every parameter of every rank within a few
averages. So each optimizer checks its contribution first and the ranks agree on the verdict
inside the average itself (a per-rank status slot folded into the reduced buffer, or one tiny
bounded allreduce where the average is not a reduction): every rank then raises the same
:class:`NonFiniteError`, naming the ranks and the step, and no non-finite value has been mixed in.
With ``nonfinite="drop"`` the offending ranks' contributions are left out instead and training goes
on (the offenders receive the average of the others). WAGMA needs no pass before its averages: its
native collective tests each result inside the reduction and refuses a poisoned one, and only then
does a rank run :func:`is_finite` on its own model (docs/faults.md).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

__all__ = ["NonFiniteError", "is_finite", "check_nonfinite_option", "NONFINITE_CHOICES"]

NONFINITE_CHOICES = ("raise", "drop")


class NonFiniteError(FloatingPointError):
    """A rank's contribution to an average held NaN or inf. ``ranks``: the offending ranks;
    ``step``: the optimizer step (or average) at which it was found; ``what``: what held it."""

    def __init__(self, ranks: Sequence[int], step: int, what: str = "model"):
        self.ranks, self.step, self.what = tuple(int(r) for r in ranks), int(step), what
        who = ", ".join(str(r) for r in self.ranks)
        super().__init__(
            f"non-finite values (NaN or inf) in the {what} of rank(s) {who} at step {step}; nothing "
            "was averaged in. Lower the learning rate or clip gradients, then resume from the last "
            "good checkpoint (or pass nonfinite='drop' to leave such contributions out)")


def is_finite(values) -> bool:
    """True when every element of the float tensor/array ``values`` is finite.

    One summation pass (memory-bound, a few ms for 25M floats): a NaN or inf anywhere makes the sum
    non-finite. Only when it is (rare) is the exact element-wise test run, so an overflowing sum of
    finite values is not mistaken for a NaN.
    """
    t = torch.from_numpy(values) if isinstance(values, np.ndarray) else values
    if t.numel() == 0:
        return True
    if bool(torch.isfinite(t.sum())):
        return True
    return bool(torch.isfinite(t).all())


def check_nonfinite_option(owner: str, value: str) -> str:
    """Validate the ``nonfinite=`` keyword (ValueError naming the choices)."""
    if value not in NONFINITE_CHOICES:
        raise ValueError(f"{owner} nonfinite must be one of {list(NONFINITE_CHOICES)}, got {value!r}")
    return value
