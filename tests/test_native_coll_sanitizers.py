"""The engine's C code under AddressSanitizer and ThreadSanitizer (native_coll/tests/run_sanitizers.sh).

Builds an instrumented copy of the engine with a C stress driver (random delays, stale and late
members, publishes, discards, resets, global checks, close) and runs it at 4 ranks.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_launch import REPO


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc with libasan/libtsan")
def test_engine_is_clean_under_address_and_thread_sanitizers():
    venv = Path(sys.executable).parent.parent
    env = dict(os.environ, VENV=str(venv), ITERS="300")
    proc = subprocess.run(["bash", "native_coll/tests/run_sanitizers.sh"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "sanitizers: clean" in proc.stdout, (
        proc.stdout[-20000:] + proc.stderr[-6000:])
