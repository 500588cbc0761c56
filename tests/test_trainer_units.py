"""Trainer building blocks on one rank: episode windows, statistics reduction, the preemption
counter, where the envs of training and evaluation run."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from mpi4py import MPI

import wagma_rl.rl.evaluate as evaluate_module
from wagma_rl.job.checkpoint import CheckpointManager
from wagma_rl.config import load_config
from wagma_rl.distrib import FinishedCounter, TrainerAveragingConfig, build_strategy
from wagma_rl.bounded_comm import BoundedComm
from wagma_rl.rl.config import DDPPOConfig
from wagma_rl.rl.evaluate import evaluate
from wagma_rl.rl.metrics import (STALL_FLOOR_S, EnvStepTimes, EpisodeWindow, UpdateMeter,
                                  env_summary, reduce_stats)
from wagma_rl.rl.resume import resume_problem
from wagma_rl.rl.setup import build_policy, env_workers

QUICK = Path(__file__).resolve().parents[1] / "configs/quick_pointnav.yaml"


def test_episode_window_records_final_metrics_and_returns_of_ended_episodes():
    w = EpisodeWindow(2, window=10)
    infos = {"success": np.array([0.0, 1.0]), "spl": np.array([0.0, 0.5]),
             "distance_to_goal": np.array([3.0, 0.1])}
    w.step(np.array([1.0, 2.0]), np.array([False, False]), infos)
    w.step(np.array([1.0, 0.5]), np.array([False, True]), infos)
    assert w.finished == 1
    np.testing.assert_allclose(w.sums(), [1, 2.5, 1.0, 0.5, 0.1])
    assert w.returns[1] == 0.0 and w.returns[0] == 2.0


def test_episode_window_keeps_only_the_last_episodes():
    w = EpisodeWindow(1, window=2)
    infos = {"success": np.ones(1), "spl": np.ones(1), "distance_to_goal": np.zeros(1)}
    for r in (1.0, 2.0, 3.0):
        w.step(np.array([r]), np.array([True]), infos)
    assert w.sums()[0] == 2 and w.sums()[1] == 5.0


def test_reduce_stats_on_one_rank_gives_means_sums_and_extremes():
    meter = UpdateMeter()
    meter.add(collect_s=1.0, rollout_steps=64, frames=256, preempted=0)
    meter.add(collect_s=3.0, rollout_steps=32, frames=128, preempted=1)
    w = EpisodeWindow(1, window=5)
    out = reduce_stats(BoundedComm(MPI.COMM_SELF, timeout=10), meter, w, stop=True)
    assert out["collect_s"] == 2.0 and out["frames"] == 384 and out["preempted"] == 1
    assert (out["rollout_steps_min"], out["rollout_steps_max"]) == (32, 64)
    assert out["collect_spread_s"] == 0.0 and out["stop"] is True
    assert np.isnan(out["success"])  # no finished episode yet


def test_every_workers_figures_come_back_by_rank():
    from wagma_rl.rl.metrics import _row, combine_stats

    rows = []
    for collect, frames in ((1.0, 256), (5.0, 64), (2.0, 128)):  # three workers, two updates each
        meter = UpdateMeter()
        meter.add(collect_s=collect, wait_s=0.5, frames=frames / 2)
        meter.add(collect_s=collect, wait_s=1.5, frames=frames / 2)
        rows.append(_row(meter, EpisodeWindow(1, window=5), False))
    out = combine_stats(np.stack(rows))
    assert out["workers"]["collect_s"].tolist() == [1.0, 5.0, 2.0]
    assert out["workers"]["wait_s"].tolist() == [1.0, 1.0, 1.0]
    assert out["workers"]["frames"].tolist() == [256.0, 64.0, 128.0]  # summed, not a mean
    assert out["collect_spread_s"] == 4.0 and out["frames"] == 448.0


def test_env_step_times_per_worker_reduce_to_the_same_figures_whatever_the_number_of_envs():
    from wagma_rl.rl.metrics import _row, combine_stats

    lockstep = UpdateMeter(2)  # two envs stepping together: three 250 ms steps, one 2 s stall
    for seconds in (0.25, 0.25, 0.25, 2.0):
        lockstep.env_times.observe(seconds)
    lockstep.add(collect_s=2.75)
    ver = UpdateMeter(3)  # three envs timed one by one, none stalled
    ver.env_times.observe([0.5, 0.25, 1.0], [0, 1, 2])
    ver.env_times.observe([0.5], [0])
    ver.add(collect_s=1.0)
    rows = [_row(m, EpisodeWindow(1, window=5), False) for m in (lockstep, ver)]
    assert rows[0].shape == rows[1].shape
    workers = combine_stats(np.stack(rows))["workers"]
    assert workers["env_step_ms"].tolist() == [687.5, 500.0]  # (3 * 250 + 2000) / 4; median
    assert workers["env_step_max_ms"].tolist() == [687.5, 1000.0]
    assert workers["env_step_max_env"].tolist() == [-1.0, 2.0]  # lock-step envs: none slower
    assert workers["stalls"].tolist() == [2.0, 0.0]  # the stalled vector step held both envs
    assert workers["stall_s"].tolist() == [2.0, 0.0]  # 2 s per env
    assert env_summary(workers) == ("slowest env: rank 1 env 2, 1000 ms/step, 1.7x the median; "
                                    "most stalls: rank 0, 2 env steps (2 s per env)")


def test_a_stall_is_five_times_the_envs_running_median_and_above_the_floor():
    times = EnvStepTimes(2)
    for _ in range(3):
        times.observe([0.2, 0.001], [0, 1])
    times.observe([0.99, STALL_FLOOR_S - 0.001], [0, 1])  # under 5 x 0.2 s; under the floor
    assert times.stalls == 0 and times.median_s.tolist() == [0.2, 0.001]
    times.observe([1.01, STALL_FLOOR_S + 0.001], [0, 1])  # over 5 x 0.2 s; over the floor
    assert times.stalls == 2 and times.stalled_s == pytest.approx(1.01 + STALL_FLOOR_S + 0.001)


def test_the_running_median_is_exact_over_eight_steps_then_moves_ten_percent():
    times = EnvStepTimes(1)
    for seconds in (1.0, 0.01, 0.01):  # a slow first step is outvoted at once
        times.observe(seconds)
    assert times.median_s.tolist() == [0.01]
    for _ in range(5):
        times.observe(0.01)
    times.observe(1.0)  # the 9th step: a stall, which moves the median by 10% only
    assert times.stalls == 1 and times.median_s == pytest.approx([0.011])


def test_a_step_that_ended_an_episode_is_timed_but_never_a_stall():
    times = EnvStepTimes(2)
    times.observe(0.01)
    times.observe([1.0, 1.0], [0, 1], ended=[True, False])  # env 0 reset inside its step
    assert times.stalls == 1 and times.stalled_s == 1.0  # env 1's step only
    assert times.median_s.tolist() == [0.01, 0.505]  # env 0's unmoved; env 1's over 2 steps
    assert times.figures()[:2].tolist() == [505.0, 505.0]


def test_an_env_slow_at_every_step_is_the_slowest_env_not_a_stalling_one():
    times = EnvStepTimes(2)
    for _ in range(20):
        times.observe([0.01, 0.5], [0, 1])
    figures = times.figures()
    assert times.stalls == 0 and figures[1:3].tolist() == [500.0, 1.0]
    times.reset()  # a new interval: nothing timed yet, the running medians kept
    assert np.isnan(times.figures()[:2]).all() and times.median_s.tolist() == [0.01, 0.5]


def test_update_meter_rejects_unknown_figures():
    with pytest.raises(KeyError, match="bogus"):
        UpdateMeter().add(bogus=1.0)


def test_finished_counter_counts_per_rollout_and_clears_the_next_slot():
    c = FinishedCounter(MPI.COMM_SELF)
    try:
        c.add(0)
        assert (c.read(0), c.read(1)) == (1, 0)
        c.add(1)
        c.reset_next(1)  # rollout 1 starts: rank 0 clears rollout 2's slot (= rollout 0's)
        assert (c.read(2), c.read(1)) == (0, 1)
    finally:
        c.free()


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="wagma"):
        build_strategy(TrainerAveragingConfig(name="ring"), comm=MPI.COMM_SELF)


def test_a_checkpoint_written_under_a_modes_old_name_continues_that_mode(tmp_path):
    cfg = load_config(DDPPOConfig, QUICK, ["averaging.name=local_sgd"])
    policy = build_policy(cfg)
    ckpt = {"mode": "localsgd", "model": policy.state_dict()}
    assert resume_problem(ckpt, tmp_path / "ckpt.pt", cfg, policy) is None
    cfg.averaging.name = "wagma"
    assert "averaging.name=local_sgd" in resume_problem(ckpt, tmp_path / "ckpt.pt", cfg, policy)


def test_a_checkpoint_with_outer_momentum_is_refused_by_a_run_without_the_outer_step(tmp_path):
    cfg = load_config(DDPPOConfig, QUICK, ["averaging.name=wagma"])
    policy = build_policy(cfg)
    ckpt = {"mode": "wagma", "model": policy.state_dict(),
            "config": {"distrib": {"mode": "wagma", "outer": "nesterov"}}}
    problem = resume_problem(ckpt, tmp_path / "ckpt.pt", cfg, policy)
    assert "averaging.outer=nesterov" in problem and "\n" not in problem
    cfg.averaging.outer = "nesterov"
    assert resume_problem(ckpt, tmp_path / "ckpt.pt", cfg, policy) is None
    # The other way is allowed: the outer step starts from the loaded model (test_optim_outer).
    ckpt["config"]["distrib"]["outer"] = None
    assert resume_problem(ckpt, tmp_path / "ckpt.pt", cfg, policy) is None


def test_preempt_needs_a_fraction():
    with pytest.raises(ValueError, match="sync_frac"):
        load_config(DDPPOConfig, QUICK, ["averaging.name=preempt", "averaging.sync_frac=1.5"])


def test_sigusr1_asks_to_stop_and_requeue_sigterm_only_to_stop():
    import os
    import signal

    from wagma_rl.job.signals import StopSignals

    sig = StopSignals().install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert (sig.stop, sig.requeue) == (True, False)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert (sig.stop, sig.requeue) == (True, True)
    finally:
        sig.uninstall()


def test_requeue_outside_slurm_says_so(monkeypatch):
    from wagma_rl.job.signals import requeue_slurm_job

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert "not under SLURM" in requeue_slurm_job()


@pytest.mark.parametrize("overrides, training, evaluation", [
    ([], "inprocess", "inprocess"),
    (["env.backend=habitat"], "process", "process"),  # habitat-sim: one simulator per process
    (["rollout.mode=ver"], "process", "inprocess"),   # evaluation steps its envs in lock-step
    (["env.backend=habitat", "env.workers=inprocess"], "inprocess", "inprocess"),
    (["env.workers=process"], "process", "process"),
])
def test_env_workers_resolves_auto_by_backend_and_rollout_mode(overrides, training, evaluation):
    cfg = load_config(DDPPOConfig, QUICK, overrides)
    assert (env_workers(cfg), env_workers(cfg, evaluation=True)) == (training, evaluation)


@pytest.fixture
def built_eval_envs(monkeypatch):
    """The kinds of vector env evaluate() builds, in order (make_eval_env watched)."""
    kinds, original = [], evaluate_module.make_eval_env

    def watched(*args, **kwargs):
        eval_set = original(*args, **kwargs)
        kinds.append(type(eval_set.env).__name__)
        return eval_set
    monkeypatch.setattr(evaluate_module, "make_eval_env", watched)
    return kinds


def test_evaluation_in_worker_processes_gives_the_in_process_metrics(tmp_path, built_eval_envs):
    settings = ["eval.num_envs=2", "eval.num_episodes=6", "eval.deterministic=true",
                "env.max_episode_steps=60"]
    torch.manual_seed(3)
    ckpt = CheckpointManager(tmp_path).save(
        {"model": build_policy(load_config(DDPPOConfig, QUICK, settings)).state_dict(),
         "frames": 0}, step=0)
    metrics = ("success", "spl", "distance_to_goal", "reward", "episodes")
    results = [evaluate(load_config(DDPPOConfig, QUICK, [*settings, f"env.workers={where}"]),
                        ckpt, log=False) for where in ("inprocess", "process")]
    assert built_eval_envs == ["PointNavVectorEnv", "ProcessVectorEnv"]
    # Deterministic actions: each episode runs alike whichever env, process or batch slot has it.
    assert [r[k] for r in results[1:] for k in metrics] == [results[0][k] for k in metrics]


def test_a_habitat_evaluation_asks_for_one_env_per_worker_process(tmp_path, monkeypatch):
    class Asked(Exception):
        pass

    def asked(backend, num_envs, **options):
        raise Asked(backend, num_envs, options.get("workers"))
    monkeypatch.setattr(evaluate_module, "make_eval_env", asked)
    cfg = load_config(DDPPOConfig, QUICK, ["env.backend=habitat", "eval.num_envs=2"])
    ckpt = CheckpointManager(tmp_path).save({"model": build_policy(cfg).state_dict()}, step=0)
    with pytest.raises(Asked) as exc:
        evaluate(cfg, ckpt, log=False)
    assert exc.value.args == ("habitat", 2, "process")


def test_wagma_strategy_reports_a_refused_average_as_no_sync_point():
    # nonfinite="drop": WAGMA.average() returns None when the native collective refused the
    # average (a non-finite contribution); the strategy must not treat it as a sync point.
    from types import SimpleNamespace

    from mpi4py import MPI

    from wagma_rl.distrib import AveragingStrategy
    st = AveragingStrategy(TrainerAveragingConfig(group_size=1, sync_period=2), comm=MPI.COMM_SELF)
    st.optimizer = SimpleNamespace(average=lambda: None, last_arrival_wait_s=0.25)
    info = st.after_update()
    assert not info.synced and not info.stats_point and info.wait_s == 0.25
    assert info.stale == 0 and info.group == () and not info.late


def test_a_group_larger_than_the_job_is_said_in_the_log_as_the_supervised_job_says_it(tmp_path):
    from mpi_launch import REPO
    from wagma_rl.rl.config import DDPPOConfig
    from wagma_rl.rl.trainer import train

    cfg = load_config(DDPPOConfig, REPO / "configs" / "quick_pointnav.yaml",
                      [f"run.dir={tmp_path / 'run'}", "run.total_frames=32",
                       "averaging.group_size=4"])
    train(cfg)
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "averaging.group_size=4 is larger than the job (1 rank): WAGMA averages in groups of 1" in log


def test_rerunning_a_finished_run_says_to_raise_the_budget(tmp_path):
    from mpi_launch import REPO
    from wagma_rl.rl.config import DDPPOConfig
    from wagma_rl.rl.trainer import train

    cfg = load_config(DDPPOConfig, REPO / "configs" / "quick_pointnav.yaml",
                      [f"run.dir={tmp_path / 'run'}", "run.total_frames=32"])
    train(cfg)
    again = train(cfg)
    assert again.frames == 32
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "nothing to train: the run has 32 frames, run.total_frames is 32; raise " \
           "run.total_frames to go on" in log
