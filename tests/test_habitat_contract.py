"""The Habitat contract tests (tests/habitat_contract/) against the real habitat-lab and
habitat-baselines 0.3.320250127, run in their own environment ``.venv-habitat`` (habitat-lab
pins numpy 1.26 and gym 0.23, which must not enter this one) with the stand-ins for the compiled
modules (tests/habitat_standins/) first on PYTHONPATH. ``make test`` creates that environment
(``make install-habitat``) before running the suite.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from mpi_launch import REPO

HABITAT_PYTHON = REPO / ".venv-habitat" / "bin" / "python"
STANDINS = REPO / "tests" / "habitat_standins"


def contract_command() -> list[str]:
    """The pytest command line of the contract suite (run in ``.venv-habitat`` from REPO)."""
    return [str(HABITAT_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "--confcutdir", "tests/habitat_contract", "tests/habitat_contract"]


@pytest.mark.skipif(not HABITAT_PYTHON.exists(),
                    reason="no .venv-habitat: run `make install-habitat` (make test does)")
def test_the_adapter_and_ppo_honour_habitats_contract():
    env = {**os.environ, "PYTHONPATH": f"{STANDINS}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(contract_command(), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
