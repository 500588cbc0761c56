"""What the training loop and the evaluation build from a config: the checks, the device, how a
rank collects (:func:`decide_collection`), the policy, the environments, observations as tensors,
random-generator state."""
from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import torch

from wagma_rl.config import ConfigError, check_ranges
from wagma_rl.job.device import memory_format, resolve_device
from wagma_rl.heterogeneity import check_heterogeneity
from wagma_rl.job.run_config import check_run

from .config import DDPPOConfig
from .policy import SENSOR_SETS, PointNavPolicy

__all__ = ["check_config", "resolve_device", "Collection", "decide_collection", "build_policy",
           "env_workers", "env_device", "batch_sim_problem", "make_envs", "sensor_options",
           "obs_to_torch", "rng_state", "set_rng_state", "seed_everything"]


def check_config(cfg: DDPPOConfig, world_size: int) -> None:
    """Reject settings that cannot work, before any work (raises ConfigError naming the key)."""
    def bad(key: str, why: str) -> None:
        raise ConfigError(f"config key '{key}': {why}")
    check_ranges(cfg)  # declared beside each field; load_config checked them, a caller may not have
    if not 1 <= cfg.ppo.num_mini_batch <= cfg.env.num_envs:
        bad("ppo.num_mini_batch", f"must be between 1 and env.num_envs ({cfg.env.num_envs}) because "
            f"mini-batches split the environments; got {cfg.ppo.num_mini_batch}")
    check_run(cfg.run)
    check_heterogeneity(cfg.heterogeneity, world_size=world_size, num_envs=cfg.env.num_envs)
    cfg.check()
    _refuse_impossible_collection(cfg)
    if tuple(cfg.env.sensors) not in SENSOR_SETS:
        bad("env.sensors", f"{list(cfg.env.sensors)} is not a camera set the policy reads; use "
            "[depth] or [depth, rgb]")
    if "sensors" in cfg.env.options:  # one key decides what the envs render and the policy reads
        bad("env.options.sensors", "the cameras are chosen by env.sensors ([depth] or [depth, "
            "rgb]), which the policy reads too: move it there")
    if "rgb" in cfg.env.sensors and not cfg.policy.use_depth:
        bad("env.sensors", "rgb feeds the visual encoder, which policy.use_depth=false leaves "
            "out: set policy.use_depth=true or env.sensors=[depth]")
    if cfg.policy.base_planes % cfg.policy.ngroups:
        bad("policy.ngroups", f"{cfg.policy.ngroups} must divide policy.base_planes ({cfg.policy.base_planes})")
    if cfg.policy.use_depth:  # last: the cameras and the encoder's shape are known good by now
        build_policy(cfg)  # a depth image too small for the encoder: refused before any rank works


@dataclasses.dataclass(frozen=True)
class Collection:
    """How a rank collects its rollouts, decided once per run by :func:`decide_collection` and
    passed to whoever acts on it (env construction, the collector, the slowdown emulation, the
    log). A combination no collector can run is a ValueError at construction."""

    mode: str
    """``lockstep`` (every env steps together) or ``ver`` (variable experience rollouts)."""
    workers: str
    """Where the envs run: ``inprocess`` or ``process`` (one worker process per env)."""
    simulator: torch.device | None = None
    """The batch simulator's device, or None for the numpy simulator."""
    backend: str = "pointnav"
    """``env.backend``: ``pointnav`` (the embedded simulator) or ``habitat`` (habitat-sim)."""
    compiled: bool = False
    """Whether the batch simulator casts its rays through ``torch.compile`` (``env.options:
    {compile: true}``)."""
    graphed: bool = False
    """Whether the policy's step is replayed from a CUDA graph (``rollout.cuda_graph``)."""

    def __post_init__(self):
        if self.mode not in ("lockstep", "ver"):
            raise ValueError(f"rollout.mode must be 'lockstep' or 'ver', got {self.mode!r}")
        if self.workers not in ("inprocess", "process"):
            raise ValueError(f"env.workers must be 'inprocess' or 'process', got {self.workers!r}")
        if self.simulator is not None and self.mode != "lockstep":
            raise ValueError(f"rollout.mode={self.mode!r} steps each env on its own; the device "
                             "batch simulator steps all of a rank's envs together: use "
                             "rollout.mode=lockstep, or env.device=numpy for VER")
        if self.simulator is not None and self.workers != "inprocess":
            raise ValueError("the device batch simulator runs in the trainer's process; "
                             "env.workers=process runs envs in worker processes: set "
                             "env.workers=inprocess, or env.device=numpy")

    @property
    def ver(self) -> bool:
        """Whether envs step on their own (VER): its cut-off rule may end a rollout early."""
        return self.mode == "ver"

    @property
    def process(self) -> bool:
        """Whether the envs run in worker processes (each sleeps its own emulated delays)."""
        return self.workers == "process"

    def describe(self) -> str:
        """The run's first log line's words for it: ``lockstep rollouts, inprocess envs,
        simulator numpy`` (``simulator habitat-sim`` for the habitat backend, ``simulator cuda:0,
        compiled cast`` for the batch simulator with ``compile: true``)."""
        if self.backend == "habitat":
            sim = "habitat-sim"
        else:
            sim = "numpy" if self.simulator is None else self.simulator
            sim = f"{sim}, compiled cast" if self.compiled else sim
        graphed = ", policy step as a CUDA graph" if self.graphed else ""
        return f"{self.mode} rollouts, {self.workers} envs, simulator {sim}{graphed}"


def decide_collection(cfg: DDPPOConfig, run_device: torch.device) -> Collection:
    """How every rank of this run collects on ``run_device``: ``rollout.mode``, the envs' place
    (:func:`env_workers`) and the simulator (:func:`env_device`). Settings that cannot go together
    are a ConfigError naming the key (:func:`check_config` refuses them before any work)."""
    _refuse_impossible_collection(cfg)
    simulator = env_device(cfg, run_device)
    compiled = simulator is not None and bool((cfg.env.options or {}).get("compile"))
    if cfg.rollout.cuda_graph and (simulator is None or simulator.type != "cuda"
                                   or run_device.type != "cuda"):
        where = "the numpy simulator" if simulator is None else f"a {simulator.type} simulator"
        raise ConfigError(f"config key 'rollout.cuda_graph': graphs replay the policy's step of a "
                          f"GPU run on the batch simulator (run.device=cuda, env.device auto or "
                          f"cuda); this run collects on {run_device.type} with {where}: leave it "
                          "false")
    return Collection(mode=cfg.rollout.mode, workers=env_workers(cfg), simulator=simulator,
                      backend=cfg.env.backend, compiled=compiled, graphed=cfg.rollout.cuda_graph)


def _refuse_impossible_collection(cfg: DDPPOConfig) -> None:
    """The ``env.device`` settings no rank can collect with, as a one-line ConfigError."""
    device = cfg.env.device
    if not (device in ("auto", "numpy", "cpu", "cuda")
            or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ConfigError(f"config key 'env.device': {device!r} is not where the simulator can "
                          "run; use auto, numpy, cpu, cuda or cuda:N")
    if device not in ("auto", "numpy") and (problem := batch_sim_problem(cfg)):
        raise ConfigError(f"config key 'env.device': {device} {problem} (or set env.device=numpy)")


def build_policy(cfg: DDPPOConfig, device: torch.device | str = "cpu") -> PointNavPolicy:
    """The actor-critic the config describes, on ``device``; a depth image too small for its
    encoder is a ConfigError naming ``env.depth_size`` (the encoder's trial pass at construction
    fails)."""
    p = cfg.policy
    try:
        return PointNavPolicy(depth_size=cfg.env.depth_size, use_depth=p.use_depth,
                              sensors=tuple(cfg.env.sensors),
                              hidden_size=p.hidden_size, rnn_type=p.rnn_type,
                              rnn_layers=p.rnn_layers, base_planes=p.base_planes,
                              resnet_layers=tuple(p.resnet_layers), ngroups=p.ngroups,
                              memory_format=memory_format(p.memory_format, device),
                              norm_precision=p.norm_precision).to(device)
    except (ValueError, RuntimeError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"config key 'env.depth_size': {cfg.env.depth_size} pixels are too few "
                          f"for the policy's encoder (policy.resnet_layers="
                          f"{list(p.resnet_layers)}, policy.ngroups={p.ngroups}: {why}); raise "
                          "env.depth_size (64 is the default)") from None


def env_workers(cfg: DDPPOConfig, *, evaluation: bool = False) -> str:
    """Where the envs run, ``"inprocess"`` or ``"process"`` (one worker process per env):
    ``env.workers``, or for ``auto`` a process per env for habitat-sim (one simulator per process)
    and for VER's training rollouts (each env steps on its own), else in-process, where the
    embedded simulator's batched step is faster (docs/environments.md). ``evaluation``: the envs
    of :func:`wagma_rl.rl.evaluate.evaluate`, stepped in lock-step whatever ``rollout.mode`` is."""
    if cfg.env.workers != "auto":
        return cfg.env.workers
    if cfg.env.backend == "habitat" or (cfg.rollout.mode == "ver" and not evaluation):
        return "process"
    return "inprocess"


def batch_sim_problem(cfg: DDPPOConfig) -> str | None:
    """Why this run cannot use the batch simulator (the rest of a sentence that starts with the
    device), or None: the one rule behind ``env.device``'s refusals and its ``auto`` choice."""
    for key, value, need in (("env.backend", cfg.env.backend, "pointnav"),
                             ("rollout.mode", cfg.rollout.mode, "lockstep")):
        if value != need:
            return (f"runs the embedded batch simulator, which steps all of a rank's envs together "
                    f"in this process: it needs {key}={need}, got {value}")
    if "rgb" in cfg.env.sensors:
        return ("runs the batch simulator, which renders depth only; env.sensors asks for rgb: "
                "leave it [depth]")
    if cfg.env.workers == "process":
        return ("runs the batch simulator in the trainer's process; env.workers=process runs envs "
                "in worker processes: set env.workers=inprocess")
    return None


def env_device(cfg: DDPPOConfig, run_device: torch.device) -> torch.device | None:
    """Where the training envs' simulator runs: a torch device for the batch simulator, or None
    for the numpy one (``env.device``; ``auto``: the run's device when it is a GPU and the run
    can use the batch simulator, else numpy)."""
    if cfg.env.device == "numpy":
        return None
    if cfg.env.device == "auto":
        usable = run_device.type == "cuda" and batch_sim_problem(cfg) is None
        return run_device if usable else None
    if cfg.env.device == "cuda" and run_device.type == "cuda":
        return run_device  # the rank's own GPU
    return torch.device(cfg.env.device)


def make_envs(cfg: DDPPOConfig, *, rank: int, num_envs: int, split: str, seed: int,
              world_size: int | None = None, episodes: str | None = None, **more: Any):
    """The vector environment of worker ``rank`` of ``world_size`` (as fast as it runs: the
    trainer wraps it in :class:`wagma_rl.heterogeneity.HeterogeneousVectorEnv`). Worker
    processes and habitat's in-process envs get ``shard_index=rank, num_shards=world_size``
    (their share of episodes and scenes; ``env.options: {scene_split: global}`` deals over the
    job's envs); ``world_size`` None: not known, no shard."""
    import envs  # imported here so config errors are reported before the simulator loads

    kwargs: dict[str, Any] = dict(scenes=cfg.env.scenes, split=split, seed=seed,
                                  depth_size=cfg.env.depth_size,
                                  max_episode_steps=cfg.env.max_episode_steps)
    kwargs.update(sensor_options(cfg))
    if episodes:
        kwargs["episodes"] = episodes
    sharded = more.get("workers") == "process" or cfg.env.backend == "habitat"
    if sharded and world_size is not None:
        kwargs.update(shard_index=rank, num_shards=world_size)
    kwargs.update(cfg.env.options)
    kwargs.update(more)
    return envs.make_vector_env(cfg.env.backend, num_envs, **kwargs)


def sensor_options(cfg: DDPPOConfig) -> dict[str, Any]:
    """The env option of ``env.sensors`` for training and evaluation envs alike (none for depth
    alone, every backend's default)."""
    return {} if tuple(cfg.env.sensors) == ("depth",) else {"sensors": list(cfg.env.sensors)}


def obs_to_torch(obs: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(visual (N, H, W, C), goal (N, 2)) float32 tensors on ``device``: the visual channels
    are depth in [0, 1] (C = 1), then with ``obs["rgb"]`` its red, green and blue as 0-255
    integers (C = 4; the rollout storage keeps them as uint8, the policy divides them by 255)."""
    if isinstance(obs["depth"], torch.Tensor):  # a device simulator's: no host round trip
        return (obs["depth"].to(device, torch.float32),
                obs["pointgoal_with_gps_compass"].to(device, torch.float32))
    visual = torch.as_tensor(np.asarray(obs["depth"], dtype=np.float32), device=device)
    if "rgb" in obs:  # copied as uint8, a quarter of the bytes of float
        rgb = torch.as_tensor(np.asarray(obs["rgb"], dtype=np.uint8), device=device)
        visual = torch.cat([visual, rgb.to(torch.float32)], dim=-1)
    goal = torch.as_tensor(np.asarray(obs["pointgoal_with_gps_compass"], dtype=np.float32),
                           device=device)
    return visual, goal


def rng_state() -> dict:
    """This process's random generator states (python, numpy, torch, cuda)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    """Restore :func:`rng_state`'s output."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
