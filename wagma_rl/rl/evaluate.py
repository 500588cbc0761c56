"""Evaluate a checkpoint on a fixed episode set: success, SPL and distance to goal."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from envs.pointnav import save_episodes
from envs.pointnav.make_episodes import make_episodes
from wagma_rl.checkpoint import load_checkpoint
from wagma_rl.config import ConfigError
from wagma_rl.tblog import RunLogger

from .config import TrainConfig
from .trainer import build_policy, make_envs, obs_to_torch, resolve_device

__all__ = ["evaluate", "episode_ids"]

DEFAULT_EPISODES = 100  # without an episode file and with eval.num_episodes 0
EPISODE_SEED = 20260


def episode_ids(path: str | Path) -> list[str]:
    """The episode ids of a Habitat episode file (gzipped or plain JSON); ConfigError naming the
    file when it is missing or not such a file."""
    try:
        raw = Path(path).read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw.decode("utf-8"))
        ids = [str(e["episode_id"]) for e in data["episodes"]]
    except FileNotFoundError:
        raise ConfigError(f"eval.episodes: episode file {str(path)!r} not found") from None
    except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"eval.episodes: {str(path)!r} is not a Habitat episode file (gzipped JSON "
                          f"{{\"episodes\": [{{\"episode_id\": ...}}, ...]}}): {type(exc).__name__}: "
                          f"{str(exc)[:120]}") from None
    if not ids:
        raise ConfigError(f"eval.episodes: {str(path)!r} holds no episodes")
    return ids


@torch.no_grad()
def evaluate(cfg: TrainConfig, checkpoint: str | Path, *, log: bool = True) -> dict[str, float]:
    """Run the policy of ``checkpoint`` on ``cfg.eval``'s episodes; return mean success, spl,
    distance_to_goal, reward and the episode count. With ``log``, print them and write them to
    TensorBoard (``<run dir>/eval``) at the checkpoint's frame count and to ``eval_<ckpt>.json``."""
    ckpt = load_checkpoint(checkpoint)
    device, warning = resolve_device(cfg.run.device, MPI.COMM_SELF)
    if warning:
        print(warning, flush=True)
    policy = build_policy(cfg).to(device)
    try:
        policy.load_state_dict(ckpt["model"])
    except RuntimeError as exc:
        raise ConfigError(f"checkpoint {str(checkpoint)!r} does not fit the configured policy "
                          f"(policy.* / env.depth_size differ from training?): {exc}") from exc
    policy.eval()

    file = cfg.eval.episodes or None
    if file is None:
        # No file given: a fixed set drawn from the scene set's split, kept beside the run.
        n = cfg.eval.num_episodes or DEFAULT_EPISODES
        file = str(Path(cfg.run_dir()) / "eval_episodes" /
                   f"{Path(cfg.env.scenes).name}_{cfg.eval.split}_{n}.json.gz")
        if not Path(file).is_file():
            save_episodes(file, make_episodes(scenes=cfg.env.scenes, split=cfg.eval.split,
                                              count=n, seed=[EPISODE_SEED, n],
                                              id_prefix=f"{cfg.eval.split}-"))
    ids = episode_ids(file)
    target = min(cfg.eval.num_episodes or len(ids), len(ids))
    num_envs = max(1, min(cfg.eval.num_envs, target))
    try:
        envs = make_envs(cfg, rank=0, num_envs=num_envs, split=cfg.eval.split, seed=EPISODE_SEED,
                         episodes=file, heterogeneity=False, repeat_episodes=False)
    except (ValueError, KeyError, TypeError) as exc:  # episodes the simulator cannot place
        raise ConfigError(f"eval.episodes {file!r}: {type(exc).__name__}: {str(exc)[:200]}") from None
    obs, _ = envs.reset(seed=EPISODE_SEED)
    h = policy.initial_state(num_envs, device)
    prev = torch.full((num_envs,), -1, dtype=torch.long, device=device)
    masks = torch.zeros(num_envs, device=device)
    returns = np.zeros(num_envs)
    results: dict[str, tuple[float, float, float, float]] = {}
    max_steps = (target // num_envs + 2) * cfg.env.max_episode_steps
    for _ in range(max_steps):
        depth, goal = obs_to_torch(obs, device)
        actions, _, _, h = policy.act(depth, goal, prev, masks, h,
                                      deterministic=cfg.eval.deterministic)
        obs, rewards, terminated, truncated, infos = envs.step(actions.cpu().numpy())
        dones = np.logical_or(terminated, truncated)
        returns += rewards
        for i in np.flatnonzero(dones):
            # Envs that ran out of file episodes replay their last one uncounted.
            if infos["counted"][i] and len(results) < target:
                results[str(infos["episode_id"][i])] = (
                    float(infos["success"][i]), float(infos["spl"][i]),
                    float(infos["distance_to_goal"][i]), float(returns[i]))
            returns[i] = 0.0
        prev = actions
        masks = torch.as_tensor(~dones, dtype=torch.float32, device=device)
        if len(results) >= target:
            break
    envs.close()
    if not results:
        raise RuntimeError("evaluation finished no episode; raise env.max_episode_steps or check the episodes")
    arr = np.asarray(list(results.values()))
    out = {"success": float(arr[:, 0].mean()), "spl": float(arr[:, 1].mean()),
           "distance_to_goal": float(arr[:, 2].mean()), "reward": float(arr[:, 3].mean()),
           "episodes": float(len(arr)), "frames": float(ckpt.get("frames", 0))}
    if log:
        run_dir = Path(cfg.run_dir())
        where = file
        print(f"eval {Path(checkpoint).name} on {where}: episodes={len(arr)} "
              f"success={out['success']:.3f} spl={out['spl']:.3f} "
              f"distance_to_goal={out['distance_to_goal']:.3f} reward={out['reward']:.3f}", flush=True)
        with RunLogger(run_dir, tb_subdir="eval", log_name="eval_log.txt", echo=False) as tb:
            tb.scalars({k: out[k] for k in ("success", "spl", "distance_to_goal", "reward")},
                       int(out["frames"]), prefix="eval/")
            tb.info(f"{checkpoint}: {out}")
        (run_dir / f"eval_{Path(checkpoint).stem}.json").write_text(json.dumps(out, indent=2))
    return out
