"""Entry points run in the test's own process, for cases that end before training: a config
error, a refusal, ``--print-config``. They cost no interpreter, torch and MPI start-up (about
2.5 CPU-seconds a subprocess on this machine) and give what a subprocess would: the exit code and
what was printed. Runs that train stay subprocesses (``python run_ddppo.py``), as a user runs them,
and so do argparse's own errors (a bad combination of flags): in-process they raise SystemExit
under another program name.
"""
from __future__ import annotations

import subprocess
from typing import Callable

__all__ = ["run_here", "supervised_here"]


def run_here(capsys, *args) -> subprocess.CompletedProcess:
    """``python run_ddppo.py ARGS`` as ``run_ddppo.main(ARGS)`` in this process, its result shaped
    like ``subprocess.run``'s (``returncode``, ``stdout``, ``stderr``); ``capsys`` is pytest's
    fixture."""
    import run_ddppo
    return _captured(capsys, run_ddppo.main, args)


def supervised_here(capsys, *args) -> subprocess.CompletedProcess:
    """``python -m wagma_rl.supervised ARGS`` as its ``__main__.main(ARGS)`` in this process,
    shaped like :func:`run_here`'s result."""
    from wagma_rl.supervised.__main__ import main
    return _captured(capsys, main, args)


def _captured(capsys, main: Callable[[list[str]], int], args) -> subprocess.CompletedProcess:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)
