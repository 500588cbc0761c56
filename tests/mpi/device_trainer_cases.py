"""Multi-rank specification of training on the batch simulator (env.device=cpu stands in for a
GPU: the same DeviceCollector, storage and strategy calls), run on every rank under mpiexec
(tests/test_trainer_device.py launches it at 2 and 3 ranks). One class per mode."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from mpi4py import MPI

from wagma_rl.config import load_config
from wagma_rl.rl.config import DDPPOConfig
from wagma_rl.rl.trainer import train

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
REPO = Path(__file__).resolve().parents[2]
UPDATES = 4


@pytest.fixture(scope="module")
def workdir():
    path = COMM.bcast(tempfile.mkdtemp(prefix="device_trainer_") if RANK == 0 else None, root=0)
    yield Path(path)
    COMM.Barrier()
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="class")
def run(request, workdir):
    cls = request.cls
    over = [f"run.dir={workdir / cls.MODE}", f"averaging.name={cls.MODE}", "env.device=cpu",
            "run.precision=bf16", "averaging.sync_period=2", *cls.EXTRA]
    cfg = load_config(DDPPOConfig, REPO / "configs" / "quick_pointnav.yaml", over)
    frames = UPDATES * SIZE * cfg.env.num_envs * cfg.ppo.num_steps
    cfg = load_config(DDPPOConfig, REPO / "configs" / "quick_pointnav.yaml",
                      over + [f"run.total_frames={frames}"])
    return cfg, train(cfg, comm=COMM)


def flat_params(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]).numpy()


class DeviceSpec:
    MODE = ""
    EXTRA: tuple[str, ...] = ()

    def test_every_rank_did_exactly_the_budgeted_updates_of_full_rollouts(self, run):
        cfg, result = run
        assert result.updates == UPDATES
        assert result.rollout_frames == [cfg.env.num_envs * cfg.ppo.num_steps] * UPDATES
        assert result.frames == UPDATES * SIZE * cfg.env.num_envs * cfg.ppo.num_steps

    def test_replicas_are_identical_at_the_end(self, run):
        _, result = run
        mine = flat_params(result.policy)
        assert all(np.array_equal(mine, other) for other in COMM.allgather(mine))

    def test_episode_statistics_reach_the_reduced_stats(self, run):
        _, result = run
        stats = result.last_stats
        assert stats["episodes"] > 0 and 0.0 <= stats["success"] <= 1.0
        assert np.isfinite(stats["reward"]) and stats["distance_to_goal"] > 0


class TestWagma(DeviceSpec):
    MODE = "wagma"


class TestAllreduce(DeviceSpec):
    MODE = "allreduce"
