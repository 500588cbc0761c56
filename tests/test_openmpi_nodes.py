"""Open MPI's survivors shrink in place across the namespaced nodes (cluster/netns.py: 2 nodes x 2
ranks, mpirun on n0; PRRTE starts its daemon on n1 through the cluster's ssh-like launcher,
tests/openmpi_launch.py): a rank on the second node dies and the job goes on, in the same
processes, on the ranks that are left, frames and updates counted exactly (the checks of
tests/test_openmpi.py's in-place test); and under the elastic supervisor, the loss of rank 0's
whole node, which ends an Open MPI job, is a relaunch on the node that is left."""
from __future__ import annotations

import os
import re
import signal
import time

import pytest

from openmpi_launch import openmpi_missing
from run_log import assert_counters_exact
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


def test_losing_rank_0s_node_under_the_supervisor_relaunches_on_the_node_left(tmp_path, cluster):
    """The supervisor and mpirun on n1; ranks 0 and 1 (the writer and its group partner) on n0,
    which dies: every process on it, PRRTE's daemon too, then its link. ULFM survives lost ranks
    but PRRTE ends the job when a daemon is lost (docs/mpi.md): the supervisor finds n0 gone and
    relaunches on n1's 2 slots from the newest checkpoint (the survivors may first shrink in
    place, then the job ends all the same); n0 rejoins once its link is back. Frames counted
    once, replicas identical."""
    from test_openmpi_elastic import STEP_FRAMES, OpenMPIElasticJob

    job = OpenMPIElasticJob(tmp_path / "run", "n0:2,n1:2", 36 * 4 * STEP_FRAMES, rejoin_after=10,
                            cluster=cluster, on="n1")
    try:
        job.wait_for(r"update=6 ", 150)
        beats = tmp_path / "elastic"
        assert (beats / "beat_1_rank0").read_text().split()[2] == "n0"  # (mapped by slot, in order)
        for pid in cluster.pids("n0"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        cluster.link("n0", up=False)
        t_fault = time.monotonic()
        job.wait_for(r"first update on 2 ranks", 150)
        to_first = time.monotonic() - t_fault
        time.sleep(2)
        cluster.link("n0", up=True)  # the node is back
        assert job.result(300) == 0, job.output
    finally:
        cluster.link("n0", up=True)
    said = "\n".join(job.lines)
    # (PRRTE ends the job as n0's daemon goes: the supervisor tries n0, or, where the survivors
    # had shrunk in place first and n0's slots were already out, finds the hosts left answer.)
    assert re.search(r"(n0 did not answer|every host answers \(a rank was lost on one of them\)); "
                     r"going on from the newest checkpoint; relaunching on 2 ranks \(n1:2\)", said), said
    log = job.log()
    assert "n0 rejoined" in log, log[-3000:]
    launches = assert_counters_exact(log, step_frames=STEP_FRAMES, total=job.total)
    assert [item["world"] for item in launches if not item.get("in_place")] == [4, 2, 4], launches
    assert "replicas identical on all 4 ranks" in log
    whole = [item for item in launches if not item.get("in_place")]
    print(f"\n| Open MPI, rank 0's node lost (2 namespaced nodes) | 4 -> 2 -> 4 | {to_first:.1f} | "
          f"{whole[0]['end'][0] - whole[1]['start'][0]} | - |")
