"""Which checkpoint a run continues from, and whether it fits the configured run.

Resume takes the newest checkpoint that loads and verifies (see ``wagma_rl.job.checkpoint``), naming
each newer one it skips and why; a checkpoint trained with another ``averaging.name`` or another
model (or an outer optimizer's state this run leaves out) is refused with one message that says
which setting differs, and a supervised job's checkpoint with the entry point that continues it;
both on rank 0 while the run starts, so a refused resume writes nothing to the run folder.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from wagma_rl.config import ConfigError, foreign_checkpoint
from wagma_rl.job.checkpoint import CheckpointError, CheckpointManager, load_checkpoint
from wagma_rl.job.exits import JobError
from wagma_rl.job.run_config import fresh_start_problem

from .config import DDPPOConfig, TrainerAveragingConfig
from .policy import _STEM, SENSOR_SETS
from .setup import build_policy

__all__ = ["choose_checkpoint", "resume_problem", "model_difference"]


def choose_checkpoint(cfg: DDPPOConfig, resume: str | Path | None, *,
                      on_skip: Callable[[Path, str], None]) -> tuple[Path | None, dict | None]:
    """``(path, state)`` to continue from, or ``(None, None)`` for a fresh run.

    ``resume``: a checkpoint file (used as given: it must verify), or a run folder (its newest good
    checkpoint); without it, the run folder's newest good checkpoint when ``run.auto_resume``.
    ``on_skip(path, why)`` hears of every damaged checkpoint passed over. A new run
    (``run.auto_resume=false``) in a folder holding checkpoints raises :class:`JobError`; a
    checkpoint that cannot continue this run (:func:`resume_problem`, or a supervised job's)
    raises ConfigError, before the run folder is written.
    """
    path, state = _choose(cfg, resume, on_skip=on_skip)
    if state is not None:
        problem = foreign_checkpoint(DDPPOConfig, state, path) or \
            resume_problem(state, path, cfg, build_policy(cfg))
        if problem:
            raise ConfigError(problem)
    return path, state


def _choose(cfg: DDPPOConfig, resume: str | Path | None, *,
            on_skip: Callable[[Path, str], None]) -> tuple[Path | None, dict | None]:
    if resume is not None:
        resume = Path(resume)
        if resume.is_file():
            return resume, load_checkpoint(resume)
        if not resume.is_dir():
            raise FileNotFoundError(f"--resume {str(resume)!r}: no such run folder or checkpoint file")
        mgr = CheckpointManager(resume)
        if not mgr.all():
            raise FileNotFoundError(f"--resume {str(resume)!r}: no checkpoint found there "
                                    f"(expected {resume}/checkpoints/ckpt_*.pt)")
        path, state = mgr.latest_good(on_skip=on_skip)
        if path is None:
            raise CheckpointError(f"--resume {str(resume)!r}: none of its {len(mgr.all())} "
                                  "checkpoints verifies (each is named above); start a new run")
        return path, state
    if cfg.run.auto_resume:
        return CheckpointManager(cfg.run.run_dir()).latest_good(on_skip=on_skip)
    problem = fresh_start_problem(cfg.run)
    if problem:
        raise JobError(problem)
    return None, None


def resume_problem(ckpt: dict, path: Path, cfg: DDPPOConfig, policy: torch.nn.Module) -> str | None:
    """Why ``ckpt`` cannot continue this run (None when it can): another mode, an outer optimizer
    this run leaves out, another model."""
    mode = ckpt.get("mode")
    # A checkpoint is a record, not a spelling to edit: one written under a mode's old name is
    # that mode's.
    mode = TrainerAveragingConfig.RENAMED_VALUES["name"].get(mode, mode)
    if mode is not None and mode != cfg.averaging.name:
        return (f"checkpoint {str(path)!r} was trained with averaging.name={mode}, this run asks "
                f"for averaging.name={cfg.averaging.name}; resume with averaging.name={mode}, or "
                "start a new run in another run.dir (a strategy's optimizer state does not carry over)")
    written = ckpt.get("config") or {}
    # (a checkpoint written before the averaging section holds it as distrib)
    outer = (written.get("averaging") or written.get("distrib") or {}).get("outer")
    if outer and not cfg.averaging.outer:
        return (f"checkpoint {str(path)!r} was trained with averaging.outer={outer} and holds its "
                f"momentum, which this run leaves out; resume with averaging.outer={outer} (and the "
                "saved outer_lr, outer_momentum), or start a new run in another run.dir")
    other = model_difference(ckpt, cfg, policy)
    if other:
        return (f"checkpoint {str(path)!r} holds another model ({other}); resume with the run's "
                "own settings or start a new run in another run.dir")
    return None


def model_difference(ckpt: dict, cfg: DDPPOConfig, policy: torch.nn.Module) -> str | None:
    """How the model in ``ckpt`` differs from ``policy`` (built from ``cfg``): the first tensor
    whose shape differs and the saved settings that explain it, or None when every shape fits."""
    mine = {k: tuple(v.shape) for k, v in policy.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in ckpt.get("model", {}).items()}
    if mine == theirs:
        return None
    diff = sorted(set(mine) ^ set(theirs)) or sorted(k for k in mine if mine[k] != theirs[k])
    key = diff[0]
    saved = (ckpt.get("config") or {}).get("policy", {})
    settings = ", ".join(f"policy.{k}={saved[k]}" for k in ("hidden_size", "rnn_type", "rnn_layers",
                                                              "base_planes", "resnet_layers")
                         if k in saved and saved[k] != getattr(cfg.policy, k, None))
    sensors = ((ckpt.get("config") or {}).get("env") or {}).get("sensors", ["depth"])
    if _STEM in theirs:  # the visual encoder's input channels tell the cameras, config or not
        sensors = SENSOR_SETS[theirs[_STEM][1] == 4]
    if list(sensors) != list(cfg.env.sensors):
        settings += f"{', ' if settings else ''}env.sensors={list(sensors)}"
    return (f"{key}: {theirs.get(key, 'absent')} there, {mine.get(key, 'absent')} here"
            f"{'; it was trained with ' + settings if settings else ''}")
