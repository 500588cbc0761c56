"""Entry points run in the test's own process, for cases that end before training: a config
error, a refusal, ``--print-config``. They cost no interpreter, torch and MPI start-up (about
2.5 CPU-seconds a subprocess on this machine) and give what a subprocess would: the exit code and
what was printed. Runs that train stay subprocesses (``python run_ddppo.py``), as a user runs them,
and so do argparse's own errors (a bad combination of flags): in-process they raise SystemExit
under another program name.
"""
from __future__ import annotations

import subprocess

__all__ = ["run_here"]


def run_here(capsys, *args: str) -> subprocess.CompletedProcess:
    """``run_ddppo.main(ARGS)`` in this process, its result shaped like ``subprocess.run``'s
    (``returncode``, ``stdout``, ``stderr``); ``capsys`` is pytest's fixture."""
    import run_ddppo
    capsys.readouterr()
    code = run_ddppo.main([str(a) for a in args])
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)
