"""The 16-bit wire of the global model average (``global_precision="bf16"`` or ``"fp16"``).

What travels is not the model but each rank's pseudo-gradient ``d = x - B``, where B is the last
global model, identical on every rank: rounding the weights themselves to 16 bits at every global
average would wipe out updates smaller than their last bits. The conversions here are the numpy
twins of the native collective's (``native_coll/src/wa_internal.h``, ``wa_set_global_precision``),
bit for bit: round to nearest even; NaN stays NaN; a value beyond the format's range becomes inf
(bfloat16 has float32's range; IEEE binary16 overflows at 65520). LocalSGD's exchange
(:func:`wagma_rl.optim.averaging.global_average`) uses them; WAGMA's runs in the native collective.
"""
from __future__ import annotations

import numpy as np

__all__ = ["GLOBAL_PRECISIONS", "check_precision_option", "encode16", "decode16", "nonfinite16"]

GLOBAL_PRECISIONS = ("fp32", "bf16", "fp16")

# Added to the 16 bits without the sign: bit 15 then says "exponent all ones" (NaN or inf).
_NONFINITE_STEP = {"bf16": 0x0080, "fp16": 0x0400}


def check_precision_option(owner: str, value) -> str:
    """Validate ``global_precision=`` (ValueError in one line naming the choices)."""
    if not isinstance(value, str) or value not in GLOBAL_PRECISIONS:
        raise ValueError(f"{owner} global_precision must be one of {list(GLOBAL_PRECISIONS)}, "
                         f"got {value!r}")
    return value


def encode16(values: np.ndarray, precision: str) -> np.ndarray:
    """``values`` (float32) rounded to nearest even to ``precision``'s 16 bits, as uint16."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    if precision == "fp16":
        with np.errstate(over="ignore", invalid="ignore"):
            return x.astype(np.float16).view(np.uint16)
    if precision != "bf16":
        raise ValueError(f"precision must be 'bf16' or 'fp16', got {precision!r}")
    u = x.view(np.uint32)
    out = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    out = out.astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():  # the carry above could turn a NaN into inf: keep it a (quiet) NaN
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def decode16(bits: np.ndarray, precision: str) -> np.ndarray:
    """The float32 values of ``precision``'s 16-bit ``bits`` (exact: every 16-bit value is one)."""
    h = np.ascontiguousarray(bits, dtype=np.uint16)
    if precision == "fp16":
        return h.view(np.float16).astype(np.float32)
    if precision != "bf16":
        raise ValueError(f"precision must be 'bf16' or 'fp16', got {precision!r}")
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32)


def nonfinite16(bits: np.ndarray, precision: str) -> bool:
    """True when one of the 16-bit values is NaN or inf (e.g. an fp16 overflow)."""
    h = np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32)
    return bool((((h & 0x7FFF) + _NONFINITE_STEP[precision]) & 0x8000).any())
