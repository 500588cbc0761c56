#!/usr/bin/env python
"""Train or evaluate a PointNav agent with DD-PPO, WAGMA replacing DD-PPO's preemption.

    python run_ddppo.py --config configs/wagma_pointnav.yaml                  # one process
    mpiexec -n 4 python run_ddppo.py --config configs/wagma_pointnav.yaml     # four workers
    srun --mpi=pmi2 python run_ddppo.py --config configs/ddppo_pointnav.yaml  # SLURM, a task per worker
    python run_ddppo.py --config configs/wagma_pointnav.yaml ppo.lr=1e-3 averaging.name=preempt
    python run_ddppo.py --resume runs/wagma_pointnav                          # continue a run
    python run_ddppo.py --eval --checkpoint runs/wagma_pointnav/checkpoints/ckpt_000001000000.pt
    python run_ddppo.py --config configs/wagma_pointnav.yaml ppo.lr=1e-3 --print-config

The ``key=value`` arguments, before, between or after the flags, are overrides of the YAML config (see wagma_rl/rl/config.py
for every key; ``--print-config`` shows the config a command would run with and exits,
``--explain-config`` adds each key's meaning). Output goes to ``run.dir`` (default
``runs/<run.name>``). SIGTERM and Ctrl-C save a checkpoint and exit (a second Ctrl-C exits at
once); SIGUSR1 saves, asks SLURM to requeue the job, and exits. A rank that stops answering ends
the job after ``averaging.timeout`` seconds, naming it (docs/faults.md).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from wagma_rl.config import CommandLine  # (argparse's, with one-line usage errors)

    p = CommandLine(description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    epilog="Overrides: key=value with dotted keys, e.g. ppo.lr=1e-3 "
                           "env.num_envs=8 averaging.name=wagma run.name=test")
    p.add_argument("--config", type=Path, help="YAML run configuration (configs/*.yaml)")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR_OR_CKPT",
                   help="continue a run from its folder's newest checkpoint (or this checkpoint file); "
                        "its saved config.yaml is used unless --config is given, and the run "
                        "stays in its folder either way")
    p.add_argument("--eval", action="store_true", help="evaluate a checkpoint instead of training")
    p.add_argument("--checkpoint", type=Path, help="checkpoint to evaluate (with --eval)")
    p.add_argument("--all-checkpoints", action="store_true",
                   help="with --eval and --checkpoint RUN_DIR: evaluate every checkpoint of the "
                        "run folder, oldest first, one row each in its eval_<split>_<mode>.csv")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (defaults, then the file, then the overrides) "
                        "as YAML and exit: nothing runs, no run folder is made")
    p.add_argument("--explain-config", action="store_true",
                   help="as --print-config, with each key's meaning as a comment above it")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    args = p.parse_args(argv)  # overrides before, between or after the flags
    if args.eval and args.checkpoint is None:
        p.error("--eval needs --checkpoint PATH")
    if args.all_checkpoints and not (args.eval and args.checkpoint.is_dir()):
        p.error("--all-checkpoints needs --eval and --checkpoint RUN_DIR (a run folder)")
    printing = args.print_config or args.explain_config
    if not (args.eval or printing) and args.config is None and args.resume is None:
        p.error("give --config FILE (or --resume RUN_DIR)")
    return args


def _load(args, *, rank: int = 0):
    from wagma_rl.config import ConfigError, load_config
    from wagma_rl.rl.config import DDPPOConfig

    if args.eval and args.checkpoint is not None and args.checkpoint.is_dir():
        # A run folder: its newest checkpoint that verifies (as --resume takes a folder).
        from wagma_rl.job.checkpoint import CheckpointManager

        newest, _ = CheckpointManager(args.checkpoint).latest_good(on_skip=lambda path, why: print(
            f"run_ddppo.py: skipping {path}: {why}", file=sys.stderr, flush=True))
        if newest is None:
            raise FileNotFoundError(f"--checkpoint {str(args.checkpoint)!r}: a folder without a "
                                    "checkpoint that verifies (expected checkpoints/ckpt_*.pt)")
        args.run_folder, args.checkpoint = args.checkpoint, newest
    if args.resume is not None and not args.resume.exists():
        raise FileNotFoundError(f"--resume {str(args.resume)!r}: no such run folder or checkpoint "
                                "file")
    if args.config is not None and args.resume is not None and not args.eval:
        # --resume names the run to continue: it continues in its own folder, with FILE's settings
        # (as a resumed Sample Factory experiment takes new arguments but keeps its folder).
        from wagma_rl.job.checkpoint import run_folder_of  # here: it loads torch
        run_dir = run_folder_of(args.resume)
        cfg = load_config(DDPPOConfig, args.config, args.overrides)
        if Path(cfg.run.run_dir()).resolve() == run_dir.resolve():
            return cfg
        if any(o.startswith("run.dir=") for o in args.overrides):
            raise ConfigError(f"--resume {str(args.resume)!r} and {cfg.run.run_dir()!r} (run.dir) "
                              "name different run folders: drop run.dir to continue the resumed "
                              "run, or drop --resume to start a run in run.dir")
        if rank == 0:
            print(f"run_ddppo.py: --resume: the run continues in {str(run_dir)!r} with the "
                  f"settings of {str(args.config)!r} (its run folder {cfg.run.run_dir()!r} is not "
                  "used)", file=sys.stderr, flush=True)
        return load_config(DDPPOConfig, args.config, [*args.overrides, f"run.dir={run_dir}"])
    if args.config is not None:
        return load_config(DDPPOConfig, args.config, args.overrides)
    if args.resume is not None:
        from wagma_rl.job.checkpoint import run_folder_of
        run_dir = run_folder_of(args.resume)
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise FileNotFoundError(f"--resume {str(args.resume)!r}: no config.yaml in {str(run_dir)!r}; "
                                    "pass --config with the run's configuration")
        # The saved config points at this folder already; keep it even if the folder was moved.
        cfg = load_config(DDPPOConfig, saved, [f"run.dir={run_dir}", *args.overrides])
        if not args.eval and Path(cfg.run.run_dir()).resolve() != run_dir.resolve():
            raise ConfigError(f"--resume {str(args.resume)!r} and {cfg.run.run_dir()!r} (run.dir) "
                              "name different run folders: drop run.dir to continue the resumed "
                              "run, or drop --resume to start a run in run.dir")
        return cfg
    if args.checkpoint is None:  # --print-config alone: the defaults and the overrides
        return load_config(DDPPOConfig, None, args.overrides)
    # --eval without --config: the configuration stored in the checkpoint.
    from wagma_rl.job.checkpoint import load_checkpoint
    return load_config(DDPPOConfig, None, args.overrides,
                       data=load_checkpoint(args.checkpoint)["config"])


def _print_config(args) -> int:
    """--print-config / --explain-config: the resolved config on stdout (the first process of a
    job prints it), exit status 0; a bad key or file is the one line and status 2 that a run gives.
    Neither MPI nor the run folder is touched, so it works on a login node too."""
    from wagma_rl.config import ConfigError, format_config
    from wagma_rl.entry import first_process

    try:
        cfg = _load(args, rank=0 if first_process() else 1)
    except Exception as exc:
        # Imported only now: a CheckpointError comes from a checkpoint _load has read (and torch
        # with it); a plain --config never loads torch.
        from wagma_rl.job.checkpoint import CheckpointError
        if not isinstance(exc, (ConfigError, FileNotFoundError, CheckpointError)):
            raise
        if first_process():
            print(f"run_ddppo.py: error: {exc}", file=sys.stderr, flush=True)
        return 2  # wagma_rl.job.exits.EXIT_CODES["config"] (importing it would start MPI)
    if first_process():
        print(format_config(cfg, explain=args.explain_config), end="", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.print_config or args.explain_config:
        return _print_config(args)
    from wagma_rl.entry import run_entry

    def body(signals) -> None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        cfg = _load(args, rank=comm.Get_rank())
        if args.eval:
            from wagma_rl.rl.evaluate import evaluate, evaluate_folder
            if comm.Get_rank() == 0 and args.all_checkpoints:
                evaluate_folder(cfg, args.run_folder)
            elif comm.Get_rank() == 0:
                evaluate(cfg, args.checkpoint)
            return
        from wagma_rl.rl.trainer import train
        train(cfg, comm=comm, resume=args.resume, signals=signals)

    # Signals caught from here on (training only), one torch thread per rank, the launch checked;
    # one line (not a traceback) for every failure a user can cause, non-zero exit, nothing left
    # in /dev/shm: the policy lives in wagma_rl.job.exits.
    return run_entry(body, prog="run_ddppo.py", signals=not args.eval)


if __name__ == "__main__":
    sys.exit(main())
