"""The configuration schema of a supervised run (filled from ``configs/*.yaml`` plus overrides)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..config import ranged
from ..heterogeneity import HeterogeneityConfig
from ..optim.spec import LEGACY_OPTIM_KEYS, AveragingConfig
from ..job.run_config import RunConfig

__all__ = ["DataConfig", "ModelConfig", "OptimConfig", "AveragingConfig", "LoopConfig", "SupervisedConfig"]


@dataclass
class DataConfig:
    source: Literal["generated", "path"] = "generated"
    """``generated`` (shapes / grammar, nothing downloaded) or ``path`` (the user's files)."""
    path: str = ""
    """Image folder root (``train/`` and ``val/`` class subfolders) or parallel text folder."""
    train_size: int = 16384
    """Generated training items in all (split over the ranks)."""
    val_size: int = 1024
    """Generated validation items in all (split over the ranks)."""
    image_size: int = 32
    """Images are square, this many pixels per side."""
    src_ext: str = "src"
    """Parallel text: source file extension (``train.src``)."""
    tgt_ext: str = "tgt"
    """Parallel text: target file extension (``train.tgt``)."""
    max_vocab: int = 32000
    """Parallel text: vocabulary size limit per language."""
    max_len: int = 64
    """Translation: longer sentences are dropped."""
    seed: int = 0
    """Seed of the generated data."""
    loader_workers: int = 2
    """Image folder (``source: path``): DataLoader worker processes per rank that read, decode and
    resize the images of each batch from disk (0: in the training process). Generated data sets
    stay in memory."""


@dataclass
class ModelConfig:
    arch: Literal["resnet18", "resnet50", "transformer"] = "resnet18"
    """Network."""
    width: int = 64
    """ResNet: channels of the first stage (64 in the paper)."""
    small_input: bool = True
    """ResNet: CIFAR stem (3x3, no max-pool) for small images."""
    d_model: int = 128
    """Transformer: model width."""
    nhead: int = 4
    """Transformer: attention heads."""
    layers: int = 2
    """Transformer: encoder and decoder layers each."""
    dim_feedforward: int = 256
    """Transformer: feed-forward width."""
    dropout: float = 0.1
    """Transformer: dropout."""
    memory_format: Literal["auto", "channels_last", "contiguous"] = "auto"
    """ResNet: layout of the activations and convolution weights: channels_last (NHWC, what
    tensor cores and cuDNN's fastest kernels take), contiguous (NCHW), or auto (channels_last on
    cuda, contiguous on cpu, where oneDNN gains little and the flat buffer's views are NCHW)."""


@dataclass
class OptimConfig:
    RENAMED: ClassVar[dict[str, str]] = {"period": "'averaging.local_steps'"}

    base: Literal["sgd", "adam", "adamw"] = "sgd"
    """The local torch optimizer (the distributed one, ``averaging.name``, wraps it)."""
    lr: float = ranged(0.1, "> 0")
    """Learning rate (after warm-up)."""
    momentum: float = 0.9
    """SGD momentum."""
    weight_decay: float = 5e-4
    """Weight decay."""
    schedule: Literal["constant", "cosine"] = "cosine"
    """Learning-rate schedule over ``train.steps``."""
    warmup_steps: int = ranged(0, ">= 0")
    """Linear warm-up steps."""


@dataclass
class LoopConfig:
    RENAMED: ClassVar[dict[str, str]] = {k: f"'run.{k}'" for k in (
        "log_interval", "checkpoint_interval", "keep_checkpoints", "seed", "torch_threads", "dir",
        "auto_resume", "device")}

    task: Literal["image", "translation"] = "image"
    """Image classification or sequence-to-sequence translation."""
    batch_size: int = ranged(32, ">= 1")
    """Samples per rank per step."""
    steps: int = ranged(1000, ">= 1")
    """Optimizer steps per rank."""
    time_budget_s: float = ranged(0.0, ">= 0")
    """Stop at the first evaluation at which the training time (the slowest rank's, evaluation
    excluded) reached this many seconds (0 = no limit; ``steps`` still bounds the run). Budgets
    runs of optimizers whose steps take different times (benchmarks/optim_convergence.py)."""
    eval_every: int = ranged(100, ">= 1")
    """Steps between evaluations (each synchronises the models first)."""
    eval_batches: int = ranged(0, ">= 0")
    """Limit evaluation to this many batches per rank (0 = the whole validation shard)."""
    target_metric: float = 0.0
    """Stop when the validation accuracy (or BLEU) reaches this (0 = never)."""
    target_loss: float = 0.0
    """Stop when the training loss since the last evaluation is at most this (0 = never); with
    ``target_metric`` too, the run stops once both are reached."""


@dataclass
class SupervisedConfig:
    FOREIGN: ClassVar[dict[str, str]] = dict.fromkeys(
        ("env", "policy", "ppo", "rollout", "distrib", "eval"),
        "it is a DD-PPO run's section: run that config (or run folder) with "
        "python run_ddppo.py --config FILE")
    RENAMED: ClassVar[dict[str, str]] = {"straggler": (
        "the 'heterogeneity' section (straggler mode random: stall_ranks=max_ranks, "
        "stall_s=delay_s; mode slow_rank: slow_ranks=[rank], slowdown=factor)")}
    LEGACY: ClassVar[dict[str, str]] = {f"optim.{k}": f"averaging.{k}" for k in LEGACY_OPTIM_KEYS}

    run: RunConfig = field(default_factory=lambda: RunConfig(
        name="supervised", seed=0, log_interval=20, checkpoint_interval=500, keep_checkpoints=2))
    """Output, seed, device and bookkeeping (the section the trainer has too; intervals count
    optimizer steps). ``run.seed`` seeds the model and the batch order."""
    data: DataConfig = field(default_factory=DataConfig)
    """Where the data comes from."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The network."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The local optimizer and its learning-rate schedule."""
    averaging: AveragingConfig = field(default_factory=AveragingConfig)
    """How the ranks average: the distributed optimizer that wraps the local one (the averaging
    spec the RL trainer shares; docs/optimizers.md)."""
    heterogeneity: HeterogeneityConfig = field(default_factory=HeterogeneityConfig)
    """Emulated slow ranks and stalls (off by default; applied after each batch's gradient)."""
    train: LoopConfig = field(default_factory=LoopConfig)
    """The task and the loop: batch, steps, evaluation, stopping targets."""

    def check(self) -> None:
        """Refuse settings that do not go together (the ranges are checked beside each field)."""
        self.averaging.check()
