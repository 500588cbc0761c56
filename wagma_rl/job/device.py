"""The one device rule of every job (RL trainer, evaluation, supervised jobs).

``cpu`` (or any explicit torch device such as ``cuda:1``) is used as given. ``cuda`` picks the GPU
by the rank's index on its node, so the ranks of a node spread over the node's GPUs. Without CUDA
a ``cuda`` request runs on the CPU with a warning that the job logs (a job that asked for a GPU
on a CPU-only node still runs and says so).
"""
from __future__ import annotations

import torch
from mpi4py import MPI

__all__ = ["resolve_device", "memory_format", "MEMORY_FORMATS"]

MEMORY_FORMATS = ("auto", "channels_last", "contiguous")


def resolve_device(name: str, comm: MPI.Comm) -> tuple[torch.device, str | None]:
    """The torch device for this rank of ``comm`` and a warning to log (or None)."""
    if not name.startswith("cuda"):
        return torch.device(name), None
    if not torch.cuda.is_available():
        return torch.device("cpu"), f"device={name} requested but CUDA is not available: using the CPU"
    if ":" in name:
        return torch.device(name), None
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local = node.Get_rank()
    node.Free()
    return torch.device(f"cuda:{local % torch.cuda.device_count()}"), None


def memory_format(name: str, device: torch.device) -> torch.memory_format:
    """A config's memory format name as a torch memory format on ``device`` (``auto``:
    channels_last on cuda, contiguous elsewhere). channels_last (NHWC) is the layout tensor cores
    and cuDNN's fastest kernels take; on cpu the contiguous layout is the fast one."""
    if name == "auto":
        name = "channels_last" if torch.device(device).type == "cuda" else "contiguous"
    if name not in MEMORY_FORMATS:
        raise ValueError(f"memory format must be one of {MEMORY_FORMATS}, got {name!r}")
    return {"channels_last": torch.channels_last, "contiguous": torch.contiguous_format}[name]
