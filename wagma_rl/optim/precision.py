"""The 16-bit wire of the global model average (``global_precision="bf16"`` or ``"fp16"``).

What travels is not the model but each rank's pseudo-gradient ``d = x - B``, where B is the last
global model, identical on every rank: rounding the weights themselves to 16 bits at every global
average would wipe out updates smaller than their last bits. The conversions here give the
native collective's (``native_coll/src/wa_internal.h``, ``wa_set_global_precision``) bit for bit:
round to nearest even; NaN stays NaN; a value beyond the format's range becomes inf (bfloat16 has
float32's range; IEEE binary16 overflows at 65520). LocalSGD's exchange
(:func:`wagma_rl.optim.averaging.global_average`) uses them; WAGMA's runs in the native collective.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["GLOBAL_PRECISIONS", "check_precision_option", "precision_options", "encode16", "decode16",
           "nonfinite16"]

GLOBAL_PRECISIONS = ("fp32", "bf16", "fp16")

_TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16}
_EXPONENT = {"bf16": np.uint16(0x7F80), "fp16": np.uint16(0x7C00)}


def check_precision_option(owner: str, value) -> str:
    """Validate ``global_precision=`` (ValueError in one line naming the choices)."""
    if not isinstance(value, str) or value not in GLOBAL_PRECISIONS:
        raise ValueError(f"{owner} global_precision must be one of {list(GLOBAL_PRECISIONS)}, "
                         f"got {value!r}")
    return value


def precision_options(owner: str, value) -> dict[str, str]:
    """Validate ``global_precision=`` and return the options to record: empty for the default
    (as :func:`~wagma_rl.optim.outer.check_outer_options`, so a plain run's state is unchanged)."""
    check_precision_option(owner, value)
    return {} if value == "fp32" else {"global_precision": value}


def encode16(values: np.ndarray, precision: str) -> np.ndarray:
    """``values`` (float32) rounded to nearest even to ``precision``'s 16 bits, as uint16
    (torch's conversions: vectorised, and bit for bit the native collective's, which the tests
    check; NaN stays NaN, overflow gives inf)."""
    x = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    return x.to(_TORCH[precision]).view(torch.int16).numpy().view(np.uint16)


def decode16(bits: np.ndarray, precision: str) -> np.ndarray:
    """The float32 values of ``precision``'s 16-bit ``bits`` (exact: every 16-bit value is one)."""
    h = np.ascontiguousarray(bits, dtype=np.uint16)
    if precision == "bf16":  # the upper half of a float32
        return (h.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return torch.from_numpy(h.view(np.int16)).view(_TORCH[precision]).float().numpy()


def nonfinite16(bits: np.ndarray, precision: str) -> bool:
    """True when one of the 16-bit values is NaN or inf (exponent all ones; e.g. an fp16 overflow)."""
    mask = _EXPONENT[precision]
    h = np.ascontiguousarray(bits, dtype=np.uint16)
    return bool(np.any((h & mask) == mask))
