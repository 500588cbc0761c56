"""The overlapped global average's specification (overlap_cases.py) again on pretended nodes (2
ranks each, no size threshold: pretended_nodes.py), in the 4-rank launch the plain run shares
(tests/test_overlap.py)."""
import numpy as np
from mpi4py import MPI

from native_coll import WaitAvoidingAllreduce
from overlap_cases import *  # noqa: F401,F403 - the same test classes, collected here again
from pretended_nodes import pretended_nodes  # noqa: F401 - autouse: every test of this module


def test_the_engines_of_this_module_run_on_pretended_nodes():
    """(Else every test above would repeat the plain run.)"""
    buf = np.zeros(8, np.float32)
    with WaitAvoidingAllreduce(MPI.COMM_WORLD, buf, group_size=1, sync_period=1) as wa:
        info = wa.allreduce(late="merge")
    assert info.kind == "global" and info.nodes == (MPI.COMM_WORLD.Get_size() + 1) // 2
