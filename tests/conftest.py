# Modules under tests/mpi/ run inside mpiexec (launched by tests/mpi_launch.py), never directly.
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# tests/habitat_contract/ runs in .venv-habitat with tests/habitat_standins on PYTHONPATH
# (launched by tests/test_habitat_contract.py), never in this environment.
collect_ignore = ["mpi", "habitat_contract", "habitat_standins"]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@pytest.fixture(scope="session")
def cluster():
    """Two namespaced nodes (cluster/netns.py) for the whole session; skips, saying why, where
    they cannot be made (not root, no network namespaces)."""
    from cluster import netns

    why = netns.available()
    if why:
        pytest.skip(f"multi-node tests need namespaced nodes: {why}")
    # Clusters of earlier sessions whose pytest was killed before its teardown.
    for state in netns.STATE_ROOT.glob("wt*"):
        pid = state.name[2:]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            netns.down(name=state.name)
    c = netns.up(2, name=f"wt{os.getpid()}")
    try:
        yield c
    finally:
        netns.down(name=c.name)
