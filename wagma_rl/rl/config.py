"""The DD-PPO run configuration schema (every field has a default and a one-line description).

Defaults are DD-PPO's (Wijmans et al. 2020) where they are about the algorithm, and small where
they are about model and rollout size, so a run trains on a CPU; ``configs/*.yaml`` override them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from wagma_rl.heterogeneity import HeterogeneityConfig
from wagma_rl.job.run_config import RunConfig

__all__ = ["DDPPOConfig", "DDPPORunConfig", "EnvConfig", "PolicyConfig", "PPOConfig", "DistribConfig",
           "EvalConfig", "RolloutConfig"]


@dataclass
class DDPPORunConfig(RunConfig):
    """The shared ``run:`` section (:class:`wagma_rl.job.run_config.RunConfig`) plus the trainer's own
    keys. Its intervals count PPO updates (WAGMA logs and checkpoints at the next global sync); rank
    r seeds its environments and sampling with seed + 1000 r; on ``cuda`` the policy and the update
    run on the GPU, and so does the embedded simulator (``env.device=auto``)."""

    total_frames: int = 2_000_000
    """Training budget in environment steps summed over all workers."""
    stats_window: int = 50
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
    num_envs: int = 4
    """Environments stepped by each worker."""
    scenes: str = "default"
    """Scene set name or path (see envs/)."""
    split: str = "train"
    """Episode split used for training."""
    depth_size: int = 64
    """Depth image side in pixels."""
    max_episode_steps: int = 500
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
    hidden_size: int = 128
    """Recurrent state size (DD-PPO: 512)."""
    rnn_type: Literal["gru", "lstm"] = "gru"
    """Recurrent cell (DD-PPO: lstm)."""
    rnn_layers: int = 1
    """Recurrent layers (DD-PPO: 2)."""
    use_depth: bool = True
    """Use the depth encoder (False: a blind agent with GPS+compass only)."""
    base_planes: int = 8
    """ResNet width of the first stage (DD-PPO's ResNet50: 32)."""
    resnet_layers: list[int] = field(default_factory=lambda: [1, 1, 1])
    """Basic blocks per ResNet stage."""
    ngroups: int = 4
    """GroupNorm groups."""


@dataclass
class PPOConfig:
    RANGES: ClassVar[dict[str, str]] = {
        "gamma": "[0, 1]", "lam": "[0, 1]", "clip": "> 0", "value_coef": ">= 0",
        "entropy_coef": ">= 0", "max_grad_norm": "> 0"}

    num_steps: int = 128
    """Rollout length per worker and update."""
    ppo_epoch: int = 2
    """Passes over each rollout."""
    num_mini_batch: int = 2
    """Mini-batches per epoch (split by environment)."""
    clip: float = 0.2
    """PPO ratio clip (also the value clip)."""
    value_coef: float = 0.5
    """Value loss weight."""
    entropy_coef: float = 0.01
    """Entropy bonus weight."""
    lr: float = 2.5e-4
    """Adam learning rate."""
    eps: float = 1e-5
    """Adam epsilon."""
    max_grad_norm: float = 0.2
    """Gradient norm clip."""
    gamma: float = 0.99
    """Discount."""
    lam: float = 0.95
    """GAE lambda."""
    normalize_advantage: bool = False
    """Normalise advantages per mini-batch set (DD-PPO: off)."""
    clip_value_loss: bool = True
    """Clip the value loss as PPO2 does."""
    linear_lr_decay: bool = False
    """Decay the learning rate linearly to 0 over total_frames."""


@dataclass
class RolloutConfig:
    RANGES: ClassVar[dict[str, str]] = {"max_env_steps": ">= 1", "min_frac": "[0, 1]",
                                        "min_batch": ">= 0"}

    mode: Literal["lockstep", "ver"] = "lockstep"
    """lockstep: every env steps together, the rank waits for its slowest env at each step (DD-PPO);
    ver: variable experience rollouts (Wijmans et al. 2022): each env steps on its own, inference
    is batched over the envs that are ready, an env contributes as many steps as it produced
    before the rank's cut-off, and the envs go on stepping while the rank learns."""
    max_env_steps: float = 2.0
    """ver: an env holds at most this many times ppo.num_steps steps of a rollout."""
    cutoff: Literal["auto", "full"] = "auto"
    """ver: full: a rollout ends at ppo.num_steps * env.num_envs steps; auto: also earlier, when the
    envs that still have room produce steps more slowly than collect+learn turns them into
    updates (the rule that maximises steps per second, from measured step and update times)."""
    min_frac: float = 0.25
    """ver: the auto cut-off never ends a rollout below this fraction of num_steps * num_envs."""
    min_batch: int = 0
    """ver: ready envs wait for inference until this many are ready (or, at most, half a typical
    env step, or until no other env is stepping); 0: half of env.num_envs. Fewer, larger
    inference batches cost less CPU than one forward pass per env step."""


@dataclass
class DistribConfig:
    RENAMED_VALUES: ClassVar[dict[str, dict[str, str]]] = {"mode": {"localsgd": "local_sgd"}}
    RANGES: ClassVar[dict[str, str]] = {"outer_lr": "> 0", "outer_momentum": "[0, 1)",
                                        "short_rollout_frac": "[0, 1]"}

    mode: Literal["wagma", "preempt", "allreduce", "dpsgd", "local_sgd"] = "wagma"
    """wagma: group model averaging; preempt: DD-PPO with preemption; allreduce: synchronous DD-PPO;
    dpsgd: ring gossip after every update; local_sgd: local updates only (both: global average every
    sync_period updates). The names are the supervised optim.name values."""
    group_size: int = 2
    """WAGMA group size; when it does not divide the number of ranks, the groups hold between
    group_size and 2*group_size - 1 ranks (native_coll.group_of)."""
    sync_period: int = 10
    """wagma, dpsgd, local_sgd: every sync_period-th update's model average is global."""
    late: Literal["apply", "merge"] = "apply"
    """WAGMA: what a worker still collecting when its group averaged gets when it arrives. apply:
    the group's result plus its whole PPO update (nobody's update is lost); merge: plus its update
    divided by the group size (what it would have got on time; its partners never see the rest).
    Default apply, as in the supervised jobs' optim.late: a worker's partner is almost always
    still collecting, so merge would lose part of nearly every PPO update
    (docs/results/training.md, Mode comparison)."""
    global_mode: Literal["blocking", "overlap"] = "blocking"
    """wagma: blocking: every worker waits for the slowest at the global average (replicas then
    identical); overlap: the global average completes in the background and each worker keeps its
    own progress on top of it (no wait; docs/overlap.md)."""
    overlap_sync_every: int = 4
    """wagma with global_mode=overlap: every n-th global average is followed by a blocking
    synchronisation, where statistics, stop signals and checkpoints are handled."""
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
    sync_frac: float = 0.6
    """preempt: fraction of workers that must have finished before stragglers stop."""
    short_rollout_frac: float = 0.25
    """preempt: fraction of its steps a worker must have done before it can be preempted."""
    timeout: float = 300.0
    """Seconds a collective waits for an unresponsive rank before failing the job."""


@dataclass
class EvalConfig:
    RANGES: ClassVar[dict[str, str]] = {"num_envs": ">= 1", "num_episodes": ">= 0", "maps": ">= 0",
                                      "video": ">= 0"}

    episodes: str = ""
    """Habitat-format episode file (.json.gz); empty = the scene set's `split` episodes."""
    split: str = "val"
    """Episode split when no file is given."""
    num_episodes: int = 0
    """Episodes to run: the first N of the set; 0: every episode of eval.episodes once, or
    without a file 100 drawn episodes of eval.split (the embedded simulator)."""
    num_envs: int = 4
    """Environments stepped in parallel during evaluation."""
    deterministic: bool = False
    """Take the most likely action instead of sampling."""
    maps: int = 0
    """Top-down maps (scene, path, start, goal) of the first N evaluation episodes per
    checkpoint, as TensorBoard images eval/map_<k> (the embedded simulator in this process, or
    habitat's top_down_map measure)."""
    video: int = 0
    """Videos of the first N evaluation episodes per checkpoint (depth, RGB, top-down map):
    animated GIFs under <run>/eval/videos/ and TensorBoard images eval/video_<k>; 0: none."""


@dataclass
class DDPPOConfig:
    FOREIGN: ClassVar[dict[str, str]] = dict.fromkeys(
        ("data", "model", "optim", "train"),
        "it is a supervised job's section: run that config (or run folder) with "
        "python -m wagma_rl.supervised --config FILE")

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
    distrib: DistribConfig = field(default_factory=DistribConfig)
    """How workers cooperate."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation (run_ddppo.py --eval)."""
