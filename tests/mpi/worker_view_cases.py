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
STALL_S = 0.5  # far above VER's round trips and a loaded machine's hiccups
STALLS = ("heterogeneity.stall_prob=0.3", f"heterogeneity.stall_s={STALL_S}") \
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
    SHOWN = 0.0
    """The least share of the scheduled stalls (and of their time per env) that must show."""
    EVERY_ENV = False
    """Whether a stall of the rank holds every env (else at least one)."""

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

    def test_the_stalled_rank_shows_its_scheduled_stalls(self, run):
        cfg, res, scalars = run
        want = COMM.bcast(self.scheduled_stalls(cfg, res) if RANK == STALLED else None,
                          root=STALLED)
        stalls, stall_s = interval_sums(scalars, "stalls"), interval_sums(scalars, "stall_s")
        assert want >= 2, want  # the schedule of this seed stalls the rank at all
        held = cfg.env.num_envs if self.EVERY_ENV else 1
        assert stalls[STALLED] >= self.SHOWN * want * held, (want, stalls)
        assert stall_s[STALLED] >= self.SHOWN * want * STALL_S * held / cfg.env.num_envs, \
            (want, stall_s)

    def test_the_other_ranks_have_far_fewer_stalls(self, run):
        # Not always none: a busy machine may hold any step 5x its median and 0.1 s.
        _, _, scalars = run
        stalls, stall_s = interval_sums(scalars, "stalls"), interval_sums(scalars, "stall_s")
        others = [r for r in range(SIZE) if r != STALLED]
        assert max(stalls[r] for r in others) <= stalls[STALLED] / 3, stalls
        assert max(stall_s[r] for r in others) <= stall_s[STALLED] / 3, stall_s


class TestLockstep(StallSpec):
    # A stall holds every env, but one that falls on a step in which an episode ended is not
    # judged (the untrained policy's frequent STOPs end many).
    EXTRA, SHOWN, EVERY_ENV = ("rollout.mode=lockstep",), 0.4, True

    def test_a_lock_step_ranks_envs_share_one_step_time(self, run):
        _, _, scalars = run
        for r in range(SIZE):
            assert scalars[f"worker/{r}/env_step_ms"] == scalars[f"worker/{r}/env_step_max_ms"]


class TestVer(StallSpec):
    # A stall of the rank's process shows on the envs with a step in flight, and not at all at the
    # end of a rollout (those steps are read after the update, untimed).
    EXTRA, SHOWN = ("rollout.mode=ver",), 0.5
