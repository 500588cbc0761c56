"""Evaluate a checkpoint on a fixed episode set: success, SPL and distance to goal.

The result is reproducible: the episodes are fixed, and sampled actions (``eval.deterministic``
false) are drawn from ``run.seed`` (override it, ``run.seed=N``, for another draw). It is written
beside the checkpoint, in the run folder the checkpoint is in now (a moved run's checkpoint still
records the old ``run.dir``), one JSON per checkpoint, split and mode
(``eval_<checkpoint>_<split>_<sampled|deterministic>[_<N>ep].json``, ``_<N>ep`` for the first
``eval.num_episodes`` only) recording that mode, the seed and the
checkpoint, and TensorBoard events per mode (``eval/<mode>``). ``eval.maps`` and ``eval.video``
add top-down maps and videos of the first episodes (:mod:`wagma_rl.rl.eval_video`): GIFs in
:func:`video_dir`, and TensorBoard images.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from envs import make_eval_env
from wagma_rl.job.checkpoint import (CheckpointError, CheckpointManager, load_checkpoint,
                                     run_folder_of)
from wagma_rl.config import ConfigError, foreign_checkpoint
from wagma_rl.job.tblog import RunLogger

from .config import DDPPOConfig
from .eval_video import FRAME_MS, EpisodeRecorder, strip, video_name, write_gif
from .metrics import episode_measures
from .resume import model_difference
from .setup import build_policy, env_workers, obs_to_torch, resolve_device, sensor_options

__all__ = ["evaluate", "evaluate_folder", "result_path", "table_path", "video_dir",
           "eval_env_options"]

EPISODE_SEED = 20260
MAP_PIXELS = 256
"""Longest side of the habitat backend's top-down maps (habitat draws them 1024 wide)."""


def _mode(cfg: DDPPOConfig) -> str:
    return "deterministic" if cfg.eval.deterministic else "sampled"


def result_path(cfg: DDPPOConfig, checkpoint: str | Path) -> Path:
    """Where :func:`evaluate` writes the JSON result of ``checkpoint`` under ``cfg.eval`` (a run
    of the first ``eval.num_episodes`` episodes says how many, so it never overwrites the whole
    set's result)."""
    count = f"_{cfg.eval.num_episodes}ep" if cfg.eval.num_episodes > 0 else ""
    name = f"eval_{Path(checkpoint).stem}_{cfg.eval.split}_{_mode(cfg)}{count}.json"
    return run_folder_of(checkpoint) / name


def video_dir(cfg: DDPPOConfig, checkpoint: str | Path) -> Path:
    """The folder of ``eval.video``'s GIFs: ``<run>/eval/videos/<split>_<mode>``."""
    return run_folder_of(checkpoint) / "eval" / "videos" / f"{cfg.eval.split}_{_mode(cfg)}"


def eval_env_options(cfg: DDPPOConfig, device: torch.device) -> tuple[dict, str | None]:
    """The backend options of the evaluation set (``env.options``, ``eval.episodes``, the
    workers) and a note for the log, or None. A habitat renderer goes on ``device``'s GPU, as
    the training envs of a rank do, unless ``env.options`` chooses one (then the note says so:
    :func:`envs.habitat.renderer_gpu`)."""
    options, note = dict(sensor_options(cfg), **cfg.env.options), None
    if cfg.env.backend == "habitat":
        from envs.habitat.placement import renderer_gpu

        gpu = (device.index or 0) if device.type == "cuda" else None
        options, note = renderer_gpu(gpu, options)
        if cfg.eval.maps or cfg.eval.video:  # habitat's TopDownMap measure, in infos
            options["top_down_map"] = MAP_PIXELS
    if cfg.eval.episodes:
        options["episodes"] = cfg.eval.episodes
    if env_workers(cfg, evaluation=True) == "process":  # habitat-sim: one simulator per process
        options.update(workers="process", timeout=cfg.averaging.timeout)
    return options, note


@torch.no_grad()
def evaluate(cfg: DDPPOConfig, checkpoint: str | Path, *, log: bool = True) -> dict:
    """Run the policy of ``checkpoint`` on ``cfg.eval``'s episodes; return mean success, spl,
    distance_to_goal, reward, the episode count and frames, and what was run (mode, seed,
    checkpoint, split). With ``log``, print them and write them to TensorBoard (``eval/<mode>``
    of the checkpoint's run folder, at its frame count) and to :func:`result_path`, with
    ``eval.maps``' maps and ``eval.video``'s videos (GIFs in :func:`video_dir`, listed under
    ``videos`` in the result)."""
    ckpt = load_checkpoint(checkpoint)
    run_dir = run_folder_of(checkpoint)
    device, warning = resolve_device(cfg.run.device, MPI.COMM_SELF)
    if warning:
        print(warning, flush=True)
    policy = build_policy(cfg, device)
    problem = foreign_checkpoint(DDPPOConfig, ckpt, checkpoint)
    other = None if problem else model_difference(ckpt, cfg, policy)
    if other:  # one line, as a resume says it (torch would list every differing tensor)
        problem = (f"checkpoint {str(checkpoint)!r} holds another model than the configured "
                   f"policy ({other}); evaluate without --config to use the checkpoint's own "
                   "settings")
    if problem:
        raise ConfigError(problem)
    policy.load_state_dict(ckpt["model"])
    policy.eval()

    # The backend owns its evaluation set (the embedded one draws and keeps it in the run folder).
    options, note = eval_env_options(cfg, device)
    if note:
        print(note, flush=True)
    try:
        eval_set = make_eval_env(cfg.env.backend, cfg.eval.num_envs, split=cfg.eval.split,
                                 num_episodes=cfg.eval.num_episodes, seed=EPISODE_SEED,
                                 episode_dir=str(run_dir / "eval_episodes"),
                                 scenes=cfg.env.scenes, depth_size=cfg.env.depth_size,
                                 max_episode_steps=cfg.env.max_episode_steps, **options)
    except (ValueError, TypeError, KeyError, OSError, EOFError, ImportError) as exc:
        # One line naming the episode file when one was given (a broken or foreign file).
        file = cfg.eval.episodes.replace("{split}", cfg.eval.split)  # habitat's path template
        if file and not Path(file).is_file():
            raise ConfigError(f"eval.episodes: episode file {file!r} not found") from None
        where = (f"eval.episodes {file!r} is not a Habitat episode file (gzipped "
                 "JSON {\"episodes\": [...]}) this backend can place" if cfg.eval.episodes
                 else f"eval env ({cfg.env.backend}, split={cfg.eval.split!r})")
        raise ConfigError(f"{where}: {type(exc).__name__}: {str(exc)[:200]}") from None
    # Sampled actions from run.seed, without disturbing the caller's random streams.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(cfg.run.seed)
        # (without log nothing is written: nothing recorded)
        recorder = EpisodeRecorder(eval_set.env, maps=cfg.eval.maps if log else 0,
                                   videos=cfg.eval.video if log else 0)
        results = _run_episodes(cfg, policy, eval_set, device, recorder)
    if not results:
        raise RuntimeError("evaluation finished no episode; raise env.max_episode_steps or check the episodes")
    means = _means(results.values())
    out = {**{k: means.pop(k) for k in ("success", "spl", "distance_to_goal", "reward")},
           "episodes": float(len(results)), "frames": float(ckpt.get("frames", 0)),
           "mode": _mode(cfg), "seed": int(cfg.run.seed), "checkpoint": str(checkpoint),
           "split": cfg.eval.split, "episode_set": str(eval_set.source),
           # every other measure the env reports at an episode's end (habitat's soft_spl,
           # collisions.count, ...): its mean over the episodes that report it
           "measures": means}
    videos = _write_videos(cfg, checkpoint, recorder)
    if videos:
        out["videos"] = videos
    if log:
        extra = "".join(f" {k}={v:.3f}" for k, v in sorted(out["measures"].items()))
        print(f"eval {Path(checkpoint).name} on {eval_set.source}: episodes={len(results)} "
              f"success={out['success']:.3f} spl={out['spl']:.3f} "
              f"distance_to_goal={out['distance_to_goal']:.3f} reward={out['reward']:.3f}{extra} "
              f"({out['mode']} actions, seed {out['seed']}; {result_path(cfg, checkpoint)})",
              flush=True)
        with RunLogger(run_dir, tb_subdir=f"eval/{out['mode']}", log_name="eval_log.txt",
                       echo=False) as tb:
            tb.scalars({**{k: out[k] for k in ("success", "spl", "distance_to_goal", "reward")},
                        **out["measures"]}, int(out["frames"]), prefix="eval/")
            for k, (episode, image) in enumerate(recorder.maps):
                tb.image(f"eval/map_{k}", image, int(out["frames"]))
                tb.info(f"{checkpoint}: eval/map_{k} is episode {episode}")
            for k, (video, row) in enumerate(zip(recorder.videos, videos)):
                if not tb.video(f"eval/video_{k}", video.frames, int(out["frames"]),
                                fps=1000 // FRAME_MS):  # no moviepy: a strip of frames instead
                    tb.image(f"eval/video_{k}", strip(video.frames), int(out["frames"]))
                tb.info(f"{checkpoint}: eval/video_{k} is episode {video.episode}: {row['file']}")
            tb.info(f"{checkpoint}: {out}")
        result_path(cfg, checkpoint).write_text(json.dumps(out, indent=2))
    return out


def _means(rows) -> dict[str, float]:
    """The mean of each measure over the episodes that report it (NaN ones left out)."""
    sums: dict[str, list[float]] = {}
    for row in rows:
        for k, v in row.items():
            if not math.isnan(v):
                sums.setdefault(k, []).append(v)
    return {k: float(np.mean(v)) for k, v in sums.items()}


def _write_videos(cfg: DDPPOConfig, checkpoint, recorder: EpisodeRecorder) -> list[dict]:
    """Write the recorded videos as GIFs in :func:`video_dir`; one row each: file, episode,
    steps, success, spl."""
    rows = []
    for video in recorder.videos:
        folder = video_dir(cfg, checkpoint)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / video_name(video.episode, checkpoint, video.measures)
        write_gif(path, video.frames)
        rows.append({"file": str(path), "episode": video.episode, "steps": video.steps,
                     "success": video.measures["success"], "spl": video.measures["spl"]})
    return rows


def _run_episodes(cfg: DDPPOConfig, policy, eval_set, device,
                  recorder: EpisodeRecorder) -> dict[str, dict[str, float]]:
    """Step the evaluation set until each of its episodes ended once; ``{episode id: {measure:
    value}}`` with ``success``, ``spl``, ``distance_to_goal``, ``reward`` (the return) and every
    other measure the env reports (:func:`wagma_rl.rl.metrics.episode_measures`)."""
    envs, wanted = eval_set.env, set(eval_set.episode_ids)
    target, num_envs = len(wanted), eval_set.env.num_envs
    obs, infos = envs.reset(seed=EPISODE_SEED)
    recorder.started(obs, infos)
    if not recorder.drawn:
        envs.close()
        raise ConfigError(f"eval.maps={cfg.eval.maps}, eval.video={cfg.eval.video}: this env "
                          f"({cfg.env.backend}, {type(envs).__name__}) gives no top-down map "
                          "(the embedded simulator in this process, or habitat's "
                          "top_down_map measure): set both to 0, or run the embedded "
                          "simulator's eval envs in this process (env.workers=inprocess)")
    h = policy.initial_state(num_envs, device)
    prev = torch.full((num_envs,), -1, dtype=torch.long, device=device)
    masks = torch.zeros(num_envs, device=device)
    returns = np.zeros(num_envs)
    results: dict[str, dict[str, float]] = {}
    max_steps = (target // num_envs + 2) * cfg.env.max_episode_steps
    for _ in range(max_steps):
        depth, goal = obs_to_torch(obs, device)
        actions, _, _, h = policy.act(depth, goal, prev, masks, h,
                                      deterministic=cfg.eval.deterministic)
        obs, rewards, terminated, truncated, infos = envs.step(actions.cpu().numpy())
        dones = np.logical_or(terminated, truncated)
        returns += rewards
        recorder.stepped(obs, dones, [bool(infos["counted"][i]) and
                                      str(infos["episode_id"][i]) in wanted
                                      for i in range(num_envs)], infos,
                         lambda i: episode_measures(infos, i))
        for i in np.flatnonzero(dones):
            # Envs that ran out of file episodes replay their last one uncounted.
            if infos["counted"][i] and str(infos["episode_id"][i]) in wanted:
                results[str(infos["episode_id"][i])] = dict(
                    episode_measures(infos, i), reward=float(returns[i]))
            returns[i] = 0.0
        prev = actions
        masks = torch.as_tensor(~dones, dtype=torch.float32, device=device)
        if len(results) >= target:
            break
    envs.close()
    return results


#: The columns of :func:`evaluate_folder`'s table before the other measures.
TABLE_COLUMNS = ("checkpoint", "frames", "episodes", "success", "spl", "distance_to_goal",
                 "reward")


def table_path(cfg: DDPPOConfig, run_dir: str | Path) -> Path:
    """Where :func:`evaluate_folder` writes its table: ``eval_<split>_<mode>[_<N>ep].csv`` in
    the run folder (the JSON results' naming, for every checkpoint)."""
    count = f"_{cfg.eval.num_episodes}ep" if cfg.eval.num_episodes > 0 else ""
    return Path(run_dir) / f"eval_{cfg.eval.split}_{_mode(cfg)}{count}.csv"


def evaluate_folder(cfg: DDPPOConfig, run_dir: str | Path) -> list[dict]:
    """:func:`evaluate` every checkpoint of the run folder ``run_dir``, oldest first (as
    habitat-baselines' evaluation of a checkpoint folder), each logged as one checkpoint is (its
    JSON, TensorBoard at its frame count); then one row per checkpoint in :func:`table_path`
    (columns :data:`TABLE_COLUMNS`, then every other measure). A checkpoint that does not
    verify is skipped with a line saying why. Returns the results in that order."""
    run_dir = Path(run_dir)
    paths = CheckpointManager(run_dir).all()
    if not paths:
        raise FileNotFoundError(f"--checkpoint {str(run_dir)!r}: no checkpoints/ckpt_*.pt to "
                                "evaluate")
    results = []
    for path in paths:
        try:
            results.append(evaluate(cfg, path))
        except CheckpointError as exc:
            print(f"run_ddppo.py: skipping {path}: {exc}", flush=True)
    if not results:
        raise FileNotFoundError(f"--checkpoint {str(run_dir)!r}: no checkpoint that verifies")
    extra = sorted({k for r in results for k in r["measures"]})
    table = table_path(cfg, run_dir)
    with open(table, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([*TABLE_COLUMNS, *extra])
        for r in results:
            writer.writerow([Path(r["checkpoint"]).name, int(r["frames"]), int(r["episodes"]),
                             *(f"{r[k]:.6g}" for k in TABLE_COLUMNS[3:]),
                             *(f"{r['measures'][k]:.6g}" if k in r["measures"] else ""
                               for k in extra)])
    print(f"eval of {len(results)} checkpoint{'s' if len(results) > 1 else ''} of {run_dir}: "
          f"{table}", flush=True)
    return results
