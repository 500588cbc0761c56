"""The DD-PPO run configuration schema (every field has a default and a one-line description).

Defaults are DD-PPO's (Wijmans et al. 2020) where they are about the algorithm, and small where
they are about model and rollout size, so a run trains on a CPU; ``configs/*.yaml`` override them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from wagma_rl.config import ranged
from wagma_rl.distrib.spec import LEGACY_DISTRIB, TrainerAveragingConfig
from wagma_rl.heterogeneity import HeterogeneityConfig
from wagma_rl.job.run_config import RunConfig

__all__ = ["DDPPOConfig", "DDPPORunConfig", "EnvConfig", "PolicyConfig", "PPOConfig",
           "EvalConfig", "RolloutConfig"]


@dataclass
class DDPPORunConfig(RunConfig):
    """The shared ``run:`` section (:class:`wagma_rl.job.run_config.RunConfig`) plus the trainer's own
    keys. Its intervals count PPO updates (WAGMA logs and checkpoints at the next global sync); rank
    r seeds its environments and sampling with seed + 1000 r; on ``cuda`` the policy and the update
    run on the GPU, and so does the embedded simulator (``env.device=auto``)."""

    total_frames: int = ranged(2_000_000, ">= 1")
    """Training budget in environment steps summed over all workers."""
    stats_window: int = ranged(50, ">= 1")
    """Episodes per worker in the windowed success / SPL / reward averages."""
    trace: bool = True
    """Write every worker's per-update timings to trace/rank_<r>.csv (input of wagma_rl.scale)."""


@dataclass
class EnvConfig:
    RENAMED: ClassVar[dict[str, str]] = {
        "slowdown": "'heterogeneity.slowdown'", "slow_ranks": "'heterogeneity.slow_ranks'",
        "step_delay_s": "'heterogeneity.stall_s'", "step_delay_prob": "'heterogeneity.stall_prob'"}

    backend: Literal["pointnav", "habitat"] = "pointnav"
    """'pointnav' (embedded simulator) or 'habitat' (habitat-sim through the adapter)."""
    num_envs: int = ranged(4, ">= 1")
    """Environments stepped by each worker."""
    scenes: str = "default"
    """Scene set name or path (see envs/)."""
    split: str = "train"
    """Episode split used for training."""
    depth_size: int = ranged(64, ">= 1")
    """Depth image side in pixels."""
    max_episode_steps: int = ranged(500, ">= 1")
    """Steps before an episode is cut off."""
    workers: Literal["auto", "inprocess", "process"] = "auto"
    """Where the envs run, in training and evaluation: inprocess (one batched vector env in the
    trainer's process), process (one worker process per env: habitat-sim's one simulator per
    process, VER), auto (process for habitat, and in training for rollout.mode=ver; else
    inprocess)."""
    device: str = "auto"
    """Where the embedded simulator runs. auto: on the run's GPU as a batch simulator when
    run.device is a GPU (lock-step rollouts, in-process envs), else the numpy simulator (on cpu it
    is 5-12x faster than the batch simulator there: docs/gpu.md); numpy: the numpy simulator;
    cpu, cuda, cuda:N: the batch simulator on that device (envs/pointnav/torch_sim.py)."""
    sensors: list[str] = field(default_factory=lambda: ["depth"])
    """The cameras the policy sees: [depth] or [depth, rgb] (an RGB camera of the depth size,
    stored as uint8 in the rollout, read as RGB/255 beside depth by the visual encoder)."""
    options: dict = field(default_factory=dict)
    """Further keyword options passed to envs.make_vector_env (e.g. Habitat settings)."""


@dataclass
class PolicyConfig:
    hidden_size: int = ranged(128, ">= 1")
    """Recurrent state size (DD-PPO: 512)."""
    rnn_type: Literal["gru", "lstm"] = "gru"
    """Recurrent cell (DD-PPO: lstm)."""
    rnn_layers: int = ranged(1, ">= 1")
    """Recurrent layers (DD-PPO: 2)."""
    use_depth: bool = True
    """Use the depth encoder (False: a blind agent with GPS+compass only)."""
    base_planes: int = ranged(8, ">= 1")
    """ResNet width of the first stage (DD-PPO's ResNet50: 32)."""
    resnet_layers: list[int] = field(default_factory=lambda: [1, 1, 1])
    """Basic blocks per ResNet stage."""
    ngroups: int = ranged(4, ">= 1")
    """GroupNorm groups."""
    memory_format: Literal["auto", "channels_last", "contiguous"] = "contiguous"
    """Layout of the visual encoder's activations and convolution weights: contiguous (NCHW),
    channels_last (NHWC, what tensor cores take) or auto (channels_last on cuda); docs/gpu.md
    says which a GPU run should take."""
    norm_precision: Literal["fp32", "autocast"] = "fp32"
    """Where the encoder's GroupNorms compute under ``run.precision=bf16``: fp32 (autocast's
    rule: bf16 activations cast to fp32 and back) or autocast (in bf16 as the convolutions
    around them, statistics still accumulated in fp32 inside the kernel; no casts, half the
    memory traffic). No effect at fp32 and tf32."""


@dataclass
class PPOConfig:
    num_steps: int = ranged(128, ">= 1")
    """Rollout length per worker and update."""
    ppo_epoch: int = ranged(2, ">= 1")
    """Passes over each rollout."""
    num_mini_batch: int = 2
    """Mini-batches per epoch (split by environment)."""
    clip: float = ranged(0.2, "> 0")
    """PPO ratio clip (also the value clip)."""
    value_coef: float = ranged(0.5, ">= 0")
    """Value loss weight."""
    entropy_coef: float = ranged(0.01, ">= 0")
    """Entropy bonus weight."""
    lr: float = ranged(2.5e-4, "> 0")
    """Adam learning rate."""
    eps: float = ranged(1e-5, "> 0")
    """Adam epsilon."""
    max_grad_norm: float = ranged(0.2, "> 0")
    """Gradient norm clip."""
    gamma: float = ranged(0.99, "[0, 1]")
    """Discount."""
    lam: float = ranged(0.95, "[0, 1]")
    """GAE lambda."""
    normalize_advantage: bool = False
    """Normalise advantages per mini-batch set (DD-PPO: off)."""
    clip_value_loss: bool = True
    """Clip the value loss as PPO2 does."""
    linear_lr_decay: bool = False
    """Decay the learning rate linearly to 0 over total_frames."""


@dataclass
class RolloutConfig:
    mode: Literal["lockstep", "ver"] = "lockstep"
    """lockstep: every env steps together, the rank waits for its slowest env at each step (DD-PPO);
    ver: variable experience rollouts (Wijmans et al. 2022): each env steps on its own, inference
    is batched over the envs that are ready, an env contributes as many steps as it produced
    before the rank's cut-off, and the envs go on stepping while the rank learns."""
    max_env_steps: float = ranged(2.0, ">= 1")
    """ver: an env holds at most this many times ppo.num_steps steps of a rollout."""
    cutoff: Literal["auto", "full"] = "auto"
    """ver: full: a rollout ends at ppo.num_steps * env.num_envs steps; auto: also earlier, when the
    envs that still have room produce steps more slowly than collect+learn turns them into
    updates (the rule that maximises steps per second, from measured step and update times)."""
    min_frac: float = ranged(0.25, "[0, 1]")
    """ver: the auto cut-off never ends a rollout below this fraction of num_steps * num_envs."""
    min_batch: int = ranged(0, ">= 0")
    """ver: ready envs wait for inference until this many are ready (or, at most, half a typical
    env step, or until no other env is stepping); 0: half of env.num_envs. Fewer, larger
    inference batches cost less CPU than one forward pass per env step."""
    cuda_graph: bool = False
    """GPU runs on the batch simulator: capture the policy's step once as a CUDA graph and replay
    it at every step of the rollout (one launch instead of one per kernel; the same actions as
    eager calls; docs/gpu.md). Refused where the run collects otherwise."""


@dataclass
class EvalConfig:
    episodes: str = ""
    """Habitat-format episode file (.json.gz); empty = the scene set's `split` episodes."""
    split: str = "val"
    """Episode split when no file is given."""
    num_episodes: int = ranged(0, ">= 0")
    """Episodes to run: the first N of the set; 0: every episode of eval.episodes once, or
    without a file 100 drawn episodes of eval.split (the embedded simulator)."""
    num_envs: int = ranged(4, ">= 1")
    """Environments stepped in parallel during evaluation."""
    deterministic: bool = False
    """Take the most likely action instead of sampling."""
    maps: int = ranged(0, ">= 0")
    """Top-down maps (scene, path, start, goal) of the first N evaluation episodes per
    checkpoint, as TensorBoard images eval/map_<k> (the embedded simulator in this process, or
    habitat's top_down_map measure)."""
    video: int = ranged(0, ">= 0")
    """Videos of the first N evaluation episodes per checkpoint (depth, RGB, top-down map):
    animated GIFs under <run>/eval/videos/ and TensorBoard images eval/video_<k>; 0: none."""


@dataclass
class DDPPOConfig:
    FOREIGN: ClassVar[dict[str, str]] = dict.fromkeys(
        ("data", "model", "optim", "train"),
        "it is a supervised job's section: run that config (or run folder) with "
        "python -m wagma_rl.supervised --config FILE")
    LEGACY: ClassVar[dict] = LEGACY_DISTRIB

    run: DDPPORunConfig = field(default_factory=lambda: DDPPORunConfig(name="pointnav"))
    """Output, budget and bookkeeping."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environments each worker steps."""
    heterogeneity: HeterogeneityConfig = field(default_factory=HeterogeneityConfig)
    """Emulated slow workers and stalls (off by default; applied around the environment steps)."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """Actor-critic architecture."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO hyper-parameters."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How each worker collects its rollout from its envs."""
    averaging: TrainerAveragingConfig = field(default_factory=TrainerAveragingConfig)
    """How workers cooperate: the averaging spec the supervised jobs share (docs/optimizers.md)
    plus preemption."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation (run_ddppo.py --eval)."""

    def check(self) -> None:
        """Refuse settings that do not go together (the ranges are checked beside each field)."""
        self.averaging.check()
