"""Open MPI's survivors shrink in place across the namespaced nodes (cluster/netns.py: 2 nodes x 2
ranks, mpirun on n0; PRRTE starts its daemon on n1 through the cluster's ssh-like launcher,
tests/openmpi_launch.py): a rank on the second node dies and the job goes on, in the same
processes, on the ranks that are left, frames and updates counted exactly (the checks of
tests/test_openmpi.py's in-place test)."""
from __future__ import annotations

import pytest

from openmpi_launch import openmpi_missing
from test_openmpi import QUICK_2048, _run_losing, assert_went_on_in_place

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(openmpi_missing() is not None, reason=str(openmpi_missing()))]


def test_a_rank_on_the_second_node_dies_and_the_others_go_on_in_place(tmp_path, cluster):
    # Rank 3 (on n1) is killed 0.5 s after update 8's global average is logged (sync period 8):
    # mid-period (an update takes 0.1 s or more), across TCP between the namespaces.
    run_dir, log = _run_losing(tmp_path, 4, (3,), "update=8 ",
                               [*QUICK_2048, "averaging.sync_period=8"], delay=0.5, cluster=cluster)
    assert "(host n1" in log.split("continuing in place")[0].rsplit("lost", 1)[1], log[-4000:]
    assert_went_on_in_place(run_dir, log, 4, (3,), 8, mid_period=True)
