"""The configuration schema of a supervised run (filled from ``configs/*.yaml`` plus overrides)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["DataConfig", "ModelConfig", "OptimConfig", "StragglerConfig", "TrainConfig",
           "SupervisedConfig"]


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


@dataclass
class OptimConfig:
    name: Literal["wagma", "allreduce", "local_sgd", "dpsgd", "nonblocking", "nonblocking_dpsgd"] = "wagma"
    """Distributed optimizer."""
    base: Literal["sgd", "adam", "adamw"] = "sgd"
    """The local torch optimizer it wraps."""
    lr: float = 0.1
    """Learning rate (after warm-up)."""
    momentum: float = 0.9
    """SGD momentum."""
    weight_decay: float = 5e-4
    """Weight decay."""
    schedule: Literal["constant", "cosine"] = "cosine"
    """Learning-rate schedule over ``train.steps``."""
    warmup_steps: int = 0
    """Linear warm-up steps."""
    group_size: int = 2
    """WAGMA: ranks per averaging group."""
    sync_period: int = 10
    """WAGMA: every sync_period-th average is global."""
    local_steps: int = 1
    """WAGMA: optimizer steps per group average."""
    global_mode: Literal["blocking", "overlap"] = "blocking"
    """WAGMA: blocking global averages (everyone waits for the slowest) or overlapped ones (the
    average completes in the background; docs/overlap.md)."""
    period: int = 4
    """LocalSGD: steps between global averages."""
    micro_batches: int = 4
    """NonBlockingSGD / NonBlockingDPSGD: micro-batches per batch (keep batch_size / micro_batches
    at 16 or more on a CPU: smaller ones compute several times slower per sample)."""
    timeout: float = 300.0
    """Seconds any wait for other ranks may last before the unresponsive ones are reported."""
    average_buffers: bool = True
    """Average BatchNorm running statistics with the model."""


@dataclass
class StragglerConfig:
    mode: Literal["none", "slow_rank", "random"] = "none"
    """``slow_rank``: rank ``rank`` is ``factor`` times slower; ``random``: each step up to
    ``max_ranks`` random ranks sleep ``delay_s`` (the paper's ImageNet setting)."""
    rank: int = 0
    """slow_rank: which rank is slow."""
    factor: float = 2.0
    """slow_rank: slowdown factor of its compute."""
    delay_s: float = 0.2
    """random: seconds a delayed rank sleeps in a step."""
    max_ranks: int = 2
    """random: at most this many ranks are delayed per step (1 to max_ranks, chosen at random)."""
    seed: int = 1
    """random: seed of the delay schedule (the same on every rank, so no communication)."""


@dataclass
class TrainConfig:
    task: Literal["image", "translation"] = "image"
    """Image classification or sequence-to-sequence translation."""
    batch_size: int = 32
    """Samples per rank per step."""
    steps: int = 1000
    """Optimizer steps per rank."""
    eval_every: int = 100
    """Steps between evaluations (each synchronises the models first)."""
    eval_batches: int = 0
    """Limit evaluation to this many batches per rank (0 = the whole validation shard)."""
    log_interval: int = 20
    """Steps between progress lines / TensorBoard points."""
    checkpoint_interval: int = 500
    """Steps between checkpoints (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept."""
    target_metric: float = 0.0
    """Stop when the validation accuracy (or BLEU) reaches this (0 = never)."""
    target_loss: float = 0.0
    """Stop when the training loss since the last evaluation is at most this (0 = never); with
    ``target_metric`` too, the run stops once both are reached."""
    seed: int = 0
    """Seed of the model and the batch order."""
    torch_threads: int = 1
    """torch threads per rank."""
    dir: str = "runs/supervised"
    """Logs, TensorBoard events, checkpoints and the resolved config go here."""
    auto_resume: bool = True
    """Continue from the newest checkpoint in dir when there is one."""
    device: str = "cpu"
    """``cpu``, ``cuda`` (a rank uses the GPU of its index on its node; the CPU, with a logged
    warning, where CUDA is missing) or an explicit device such as ``cuda:1``
    (:func:`wagma_rl.device.resolve_device`, the trainer's rule too)."""


@dataclass
class SupervisedConfig:
    data: DataConfig = field(default_factory=DataConfig)
    """Where the data comes from."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The network."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The distributed optimizer and its local optimizer."""
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    """Emulated heterogeneity (off by default)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The loop."""
