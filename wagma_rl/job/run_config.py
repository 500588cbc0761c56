"""The ``run:`` section every job's config shares: where its output goes and how it is kept.

The DD-PPO trainer (``wagma_rl.rl.config``, which adds the RL-only keys in a subclass) and the
supervised jobs (``wagma_rl.supervised.config``) both use :class:`RunConfig`, so a key means the
same thing in both. Intervals count the job's own iterations: PPO updates for the trainer,
optimizer steps for a supervised job. Each schema gives the section its own defaults (the
trainer's run is called ``pointnav``, a supervised one ``supervised``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import ConfigError
from .precision import PRECISIONS

__all__ = ["RunConfig", "check_run", "fresh_start_problem"]


@dataclass
class RunConfig:
    name: str = "run"
    """Run name; the output folder defaults to runs/<name>."""
    dir: str = ""
    """Output folder (log, TensorBoard, checkpoints, resolved config); empty = runs/<name>."""
    seed: int = 1
    """Base random seed (of the model, the batch order or the environments and sampling)."""
    device: str = "cpu"
    """``cpu``, ``cuda`` (a rank uses the GPU of its index on its node; the CPU, with a logged
    warning, where CUDA is missing) or an explicit device such as ``cuda:1``
    (:func:`wagma_rl.job.device.resolve_device`)."""
    log_interval: int = 10
    """Iterations (PPO updates / optimizer steps) between progress lines and TensorBoard points."""
    checkpoint_interval: int = 50
    """Iterations between checkpoints (0 = only at the end and when the run is stopped)."""
    keep_checkpoints: int = 3
    """How many of the newest checkpoints to keep (0 = all)."""
    auto_resume: bool = True
    """Continue from the newest checkpoint in the output folder when there is one; ``false``
    starts a new run and refuses a folder that already holds checkpoints (two runs would mix)."""
    precision: str = "fp32"
    """Arithmetic of the forward and backward passes: fp32; tf32 (fp32 tensors, TF32 matmuls and
    convolutions on GPUs that have them); bf16 (autocast to bfloat16 for the forward pass and the
    loss). Parameters, optimizer state and averaged models stay fp32 in every case
    (:mod:`wagma_rl.job.precision`)."""
    cudnn_benchmark: bool = False
    """Let cuDNN time its convolution algorithms on the first call of each input shape and keep
    the fastest (``torch.backends.cudnn.benchmark``; CUDA only). Pays where shapes repeat (fixed
    rollouts and mini-batches); each new shape costs one timing pass."""
    torch_threads: int = 1
    """torch intra-op threads per rank (1: ranks already fill the cores)."""
    tensorboard: bool = True
    """Write TensorBoard event files."""

    def run_dir(self) -> str:
        """The output folder: ``dir``, or runs/<name>."""
        return self.dir or f"runs/{self.name}"


def check_run(run: RunConfig) -> None:
    """Reject ``run:`` values no job can work with (raises ConfigError naming the key)."""
    for name in ("log_interval", "torch_threads"):
        if getattr(run, name) < 1:
            raise ConfigError(f"config key 'run.{name}': must be >= 1, got {getattr(run, name)}")
    for name, zero in (("checkpoint_interval", "only at the end"), ("keep_checkpoints", "all")):
        if getattr(run, name) < 0:
            raise ConfigError(f"config key 'run.{name}': must be >= 0 (0: {zero}), "
                              f"got {getattr(run, name)}")
    if run.precision not in PRECISIONS:
        raise ConfigError(f"config key 'run.precision': {run.precision!r} is not one of "
                          f"{', '.join(PRECISIONS)}")
    device = run.device
    if not (device in ("cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ConfigError(f"config key 'run.device': {device!r} is not a device a job runs on; "
                          "use cpu, cuda or cuda:N")


def fresh_start_problem(run: RunConfig) -> str | None:
    """Why a new run (``run.auto_resume=false``) cannot start in ``run.run_dir()``, or None: the
    folder holds another run's checkpoints, and writing beside them would mix the two runs (their
    logs, TensorBoard curves and checkpoints)."""
    from .checkpoint import CheckpointManager

    if run.auto_resume:
        return None
    found = CheckpointManager(run.run_dir()).all()
    if not found:
        return None
    return (f"run.auto_resume=false starts a new run, but {run.run_dir()!r} holds another run's "
            f"checkpoints ({len(found)} in checkpoints/): choose a new run.name (or run.dir), or "
            "remove that folder; to continue that run, leave run.auto_resume at true")
