"""The configuration schema of a supervised run (filled from ``configs/*.yaml`` plus overrides)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..heterogeneity import HeterogeneityConfig
from ..job.run_config import RunConfig

__all__ = ["DataConfig", "ModelConfig", "OptimConfig", "LoopConfig", "SupervisedConfig"]


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
    RENAMED: ClassVar[dict[str, str]] = {"period": "'optim.local_steps'"}
    RANGES: ClassVar[dict[str, str]] = {"outer_lr": "> 0", "outer_momentum": "[0, 1)",
                                        "micro_batches": ">= 1", "timeout": "> 0",
                                        "warmup_steps": ">= 0", "lr": "> 0", "bucket_mb": ">= 0"}

    name: Literal["wagma", "allreduce", "local_sgd", "dpsgd", "nonblocking", "nonblocking_dpsgd"] = "wagma"
    """Distributed optimizer (the RL trainer's distrib.mode uses the same names)."""
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
    """WAGMA: ranks per averaging group (a job with fewer ranks averages in groups of all of them,
    saying so in its log, as the RL trainer does)."""
    sync_period: int = 10
    """WAGMA: every sync_period-th average is global."""
    local_steps: int | None = None
    """wagma, local_sgd, dpsgd: optimizer steps per model average (empty: 4 for local_sgd, 1 for
    the others; steps_per_average() resolves it)."""
    late: Literal["apply", "merge"] = "apply"
    """WAGMA: what a rank gets whose group averaged with its stale model: apply (the result plus
    all its progress since then: the sum of the models is conserved, the others receive that
    progress at their next average with this rank) or merge (the result plus that progress divided
    by the group size: what it would have got on time, but the others never receive it, so a late
    rank's steps are lost to the job; docs/optimizers.md#why-plain-wagma-lost-on-the-transformer)."""
    global_mode: Literal["blocking", "overlap"] = "blocking"
    """WAGMA: blocking global averages (everyone waits for the slowest) or overlapped ones (the
    average completes in the background; docs/overlap.md)."""
    outer: Literal["nesterov"] | None = None
    """wagma, local_sgd: an outer optimizer on every global average (DiLoCo): nesterov takes a
    Nesterov-momentum step on the change since the last global model; empty: the plain average
    (docs/optimizers.md#outer-optimizer-on-the-global-average-outernesterov)."""
    outer_lr: float = 0.7
    """wagma, local_sgd with outer=nesterov: the outer learning rate (> 0; 1 with momentum 0 is
    the plain average)."""
    outer_momentum: float = 0.9
    """wagma, local_sgd with outer=nesterov: the outer momentum, in [0, 1)."""
    global_precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """wagma, local_sgd: what the global model averages send: fp32, or
    16-bit pseudo-gradients (the model minus the last global model, rounded to nearest even),
    half the bytes (docs/optimizers.md#low-precision-global-exchange)."""
    bucket_mb: float | None = None
    """allreduce: MiB of gradients per bucket averaged while the backward pass runs (as DDP's
    bucket_cap_mb; 0: one allreduce after the backward pass); nonblocking, nonblocking_dpsgd: MiB
    of each micro-batch's gradients copied out per bucket while the backward pass runs (0: one
    copy after it). Empty: 25 on cuda, 0 on cpu."""
    background: bool = False
    """wagma, local_sgd, dpsgd: run each model average on a thread while the next forward and
    backward pass compute (docs/optimizers.md#model-averaging-in-the-background); refused for the
    others."""
    micro_batches: int = 4
    """NonBlockingSGD / NonBlockingDPSGD: micro-batches per batch (keep batch_size / micro_batches
    at 16 or more on a CPU: smaller ones compute several times slower per sample)."""
    timeout: float = 300.0
    """Seconds any wait for other ranks may last before the unresponsive ones are reported."""
    average_buffers: bool = True
    """Average BatchNorm running statistics with the model."""

    def steps_per_average(self) -> int:
        """``local_steps``, or when it is empty the default of optimizer ``name``."""
        if self.local_steps is not None:
            return self.local_steps
        return 4 if self.name == "local_sgd" else 1


@dataclass
class LoopConfig:
    RENAMED: ClassVar[dict[str, str]] = {k: f"'run.{k}'" for k in (
        "log_interval", "checkpoint_interval", "keep_checkpoints", "seed", "torch_threads", "dir",
        "auto_resume", "device")}
    RANGES: ClassVar[dict[str, str]] = {"batch_size": ">= 1", "steps": ">= 1",
                                        "eval_every": ">= 1", "eval_batches": ">= 0",
                                        "time_budget_s": ">= 0"}

    task: Literal["image", "translation"] = "image"
    """Image classification or sequence-to-sequence translation."""
    batch_size: int = 32
    """Samples per rank per step."""
    steps: int = 1000
    """Optimizer steps per rank."""
    time_budget_s: float = 0.0
    """Stop at the first evaluation at which the training time (the slowest rank's, evaluation
    excluded) reached this many seconds (0 = no limit; ``steps`` still bounds the run). Budgets
    runs of optimizers whose steps take different times (benchmarks/optim_convergence.py)."""
    eval_every: int = 100
    """Steps between evaluations (each synchronises the models first)."""
    eval_batches: int = 0
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

    run: RunConfig = field(default_factory=lambda: RunConfig(
        name="supervised", seed=0, log_interval=20, checkpoint_interval=500, keep_checkpoints=2))
    """Output, seed, device and bookkeeping (the section the trainer has too; intervals count
    optimizer steps). ``run.seed`` seeds the model and the batch order."""
    data: DataConfig = field(default_factory=DataConfig)
    """Where the data comes from."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The network."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The distributed optimizer and its local optimizer."""
    heterogeneity: HeterogeneityConfig = field(default_factory=HeterogeneityConfig)
    """Emulated slow ranks and stalls (off by default; applied after each batch's gradient)."""
    train: LoopConfig = field(default_factory=LoopConfig)
    """The task and the loop: batch, steps, evaluation, stopping targets."""
