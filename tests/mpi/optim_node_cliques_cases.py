"""``exchange="node"`` when the ranks span several nodes (every rank, under mpiexec with MPICH's
``MPIR_CVAR_NUM_CLIQUES=2``, which splits this machine's ranks into two "nodes" for
``MPI_COMM_TYPE_SHARED``; launched by tests/test_optim_mpi.py at 4 ranks): every rank refuses
with the same one-line error, and the job's collectives go on afterwards."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from wagma_rl.config import ConfigError
from wagma_rl.optim import AllreduceSGD, AveragingConfig

COMM = MPI.COMM_WORLD


def test_this_launch_spans_two_nodes():
    node = COMM.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        assert node.size == COMM.size // 2
    finally:
        node.Free()


def test_every_rank_refuses_and_the_job_goes_on():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"exchange='node' needs every rank on one node, but this "
                                         r"rank shares its node with 2 of the job's 4 ranks: use "
                                         r"exchange='mpi'"):
        AllreduceSGD(torch.optim.SGD(model.parameters(), lr=0.1), comm=COMM, exchange="node")
    # Nobody was left waiting: the ranks still meet.
    total = np.array([COMM.rank], dtype=np.int64)
    COMM.Allreduce(MPI.IN_PLACE, total)
    assert int(total[0]) == sum(range(COMM.size))


def test_the_config_error_names_the_key():
    model = torch.nn.Linear(3, 2)
    spec = AveragingConfig(name="allreduce", exchange="node")
    spec.check()
    with pytest.raises(ConfigError, match=r"config key 'averaging.exchange': .*use exchange='mpi'"):
        spec.build(torch.optim.SGD(model.parameters(), lr=0.1), comm=COMM)
