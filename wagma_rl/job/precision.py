"""The one precision rule of every job: ``run.precision`` as torch settings (applied with the run's
other process-wide torch setting, ``run.cudnn_benchmark``, by :func:`apply_run_settings`).

``fp32`` computes in float32. ``tf32`` keeps float32 tensors and lets matmuls and convolutions use
TF32 tensor cores (CUDA only; on cpu it is fp32). ``bf16`` runs the forward pass and the loss under
``torch.autocast`` to bfloat16 (cpu and cuda). In every case the parameters, the gradients, the
optimizer state and what the averaging sends stay float32 (the autocast "master weights" rule), so
the 16-bit wire of the global average stays a separate setting.
"""
from __future__ import annotations

import contextlib

import torch

__all__ = ["PRECISIONS", "apply_precision", "apply_run_settings", "autocast"]

PRECISIONS = ("fp32", "tf32", "bf16")


def apply_precision(precision: str) -> None:
    """Set the process-wide matmul / convolution precision for ``precision``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def apply_run_settings(precision: str, *, cudnn_benchmark: bool) -> None:
    """A job's process-wide torch settings from its ``run:`` section, once per job (both loops):
    its precision (:func:`apply_precision`) and whether cuDNN times its convolution algorithms
    and keeps the fastest (``run.cudnn_benchmark``)."""
    apply_precision(precision)
    torch.backends.cudnn.benchmark = bool(cudnn_benchmark)


def autocast(device: torch.device, precision: str):
    """A context that runs its body in ``precision`` on ``device``'s type (a no-op unless bf16)."""
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
