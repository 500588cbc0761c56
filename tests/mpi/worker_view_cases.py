"""Multi-rank specification of the per-worker view's env step times and stalls, run on every rank
under mpiexec (tests/test_trainer_modes.py launches it). The last rank alone stalls: the
``heterogeneity.stall_*`` keys are in its config only (its stall schedule is then its own, as
``stall_prob`` draws per rank anyway); rank 0's TensorBoard events must show the stalls on it.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from mpi4py import MPI

from wagma_rl.config import load_config
from wagma_rl.heterogeneity import Heterogeneity
from wagma_rl.job.tblog import read_scalars
from wagma_rl.rl.config import DDPPOConfig
from wagma_rl.rl.trainer import train

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
QUICK = Path(__file__).resolve().parents[2] / "configs" / "quick_pointnav.yaml"
UPDATES = 4
STALLED = SIZE - 1
STALL_S = 0.5  # 5x the running median step time even of VER's round trips on a loaded machine
STALLS = ("heterogeneity.stall_prob=0.15", f"heterogeneity.stall_s={STALL_S}") \
    if RANK == STALLED else ()
NEW_TAGS = ("env_step_ms", "env_step_max_ms", "stalls", "stall_s")


def on_rank0(check):
    """``check()`` on rank 0, its result on every rank (a failed assertion fails them all)."""
    return COMM.bcast(check() if RANK == 0 else None, root=0)


@pytest.fixture(scope="class")
def run(request):
    """One short run per class: (config, this rank's TrainResult, rank 0's scalars on every rank)."""
    path = Path(COMM.bcast(tempfile.mkdtemp(prefix="worker_view_") if RANK == 0 else None))
    extra = [f"run.dir={path}", *request.cls.EXTRA, *STALLS]
    cfg = load_config(DDPPOConfig, QUICK, extra)
    frames = UPDATES * SIZE * cfg.env.num_envs * cfg.ppo.num_steps
    cfg = load_config(DDPPOConfig, QUICK, [*extra, f"run.total_frames={frames}"])
    res = train(cfg, comm=COMM)
    scalars = on_rank0(lambda: read_scalars(res.run_dir))
    yield cfg, res, scalars
    COMM.Barrier()
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)


def interval_sums(scalars: dict, metric: str) -> list[float]:
    """Every rank's ``metric`` summed over the logged intervals."""
    return [sum(v for _, v in scalars[f"worker/{r}/{metric}"]) for r in range(SIZE)]


class StallSpec:
    EXTRA: tuple[str, ...] = ()

    def scheduled_stalls(self, cfg: DDPPOConfig, res) -> int:
        """The stalled rank's scheduled stalls after its first step (which sets the running
        median, so it is never a stall)."""
        het = Heterogeneity(cfg.heterogeneity, rank=RANK, world_size=SIZE,
                            num_envs=cfg.env.num_envs)
        return sum(het.stalled(step) for step in range(1, sum(res.rollout_steps)))

    def test_every_worker_has_env_step_times_and_stalls(self, run):
        _, _, scalars = run
        missing = [f"worker/{r}/{m}" for r in range(SIZE) for m in NEW_TAGS
                   if f"worker/{r}/{m}" not in scalars]
        assert not missing, missing
        times = [v for r in range(SIZE) for _, v in scalars[f"worker/{r}/env_step_ms"]]
        assert all(t > 0 for t in times), times

    def test_the_stalled_rank_has_most_of_its_scheduled_stalls(self, run):
        cfg, res, scalars = run
        want = COMM.bcast(self.scheduled_stalls(cfg, res) if RANK == STALLED else None,
                          root=STALLED)
        stalls, stall_s = interval_sums(scalars, "stalls"), interval_sums(scalars, "stall_s")
        assert want >= 2, want  # the schedule of this seed stalls the rank at all
        # A stall holds at least one env (lock-step: all of them); most of the stall time shows.
        assert stalls[STALLED] >= 0.75 * want, (want, stalls)
        assert stall_s[STALLED] >= 0.75 * want * STALL_S / cfg.env.num_envs, (want, stall_s)

    def test_the_other_ranks_have_fewer_stalls_and_far_less_stalled_time(self, run):
        # Not always none: a busy machine may hold any step 5x its median and 20 ms.
        _, _, scalars = run
        stalls, stall_s = interval_sums(scalars, "stalls"), interval_sums(scalars, "stall_s")
        others = [r for r in range(SIZE) if r != STALLED]
        assert max(stalls[r] for r in others) < stalls[STALLED], stalls
        assert max(stall_s[r] for r in others) <= stall_s[STALLED] / 4, stall_s


class TestLockstep(StallSpec):
    EXTRA = ("rollout.mode=lockstep",)

    def test_a_lock_step_ranks_envs_share_one_step_time(self, run):
        _, _, scalars = run
        for r in range(SIZE):
            assert scalars[f"worker/{r}/env_step_ms"] == scalars[f"worker/{r}/env_step_max_ms"]


class TestVer(StallSpec):
    EXTRA = ("rollout.mode=ver",)
