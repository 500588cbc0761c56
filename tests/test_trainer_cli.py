"""run_ddppo.py as a user runs it: config errors before any work, SIGTERM saves and exits,
killing one rank ends the whole job with a loadable checkpoint, evaluation of a checkpoint."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from in_process import run_here
from mpi_launch import REPO, mpi_env, mpi_run, mpiexec_path, python_pids
from wagma_rl.job.checkpoint import CheckpointManager, load_checkpoint
from wagma_rl.config import ConfigError, config_to_dict, field_docs, load_config
from wagma_rl.rl.config import DDPPOConfig, PPOConfig
from wagma_rl.rl.setup import check_config
from wagma_rl.job.tblog import read_scalars

QUICK = "configs/quick_pointnav.yaml"




def _wait_for(predicate, proc: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"process exited ({proc.returncode}) before {what}:\n{out[-4000:]}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*pointnav*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load_and_pass_the_checks(path):
    cfg = load_config(DDPPOConfig, path)
    check_config(cfg, world_size=4)


def test_more_mini_batches_than_envs_is_rejected_by_name():
    cfg = load_config(DDPPOConfig, REPO / QUICK, ["ppo.num_mini_batch=3", "env.num_envs=2"])
    with pytest.raises(ConfigError, match="ppo.num_mini_batch"):
        check_config(cfg, world_size=1)


def test_any_group_size_of_at_least_one_is_accepted():
    # The collective forms groups of S..2S-1 when S does not divide the ranks (native_coll.group_of).
    check_config(load_config(DDPPOConfig, REPO / QUICK, ["averaging.group_size=4"]), world_size=6)
    with pytest.raises(ConfigError, match="averaging.group_size"):
        check_config(load_config(DDPPOConfig, REPO / QUICK, ["averaging.group_size=0"]), world_size=6)


@pytest.mark.parametrize("override, named", [("averaging.global_mode=lazy", "averaging.global_mode"),
                                             ("averaging.overlap_sync_every=0",
                                              "averaging.overlap_sync_every")])
def test_a_bad_global_mode_setting_is_rejected_by_name(override, named):
    with pytest.raises(ConfigError, match=named):
        check_config(load_config(DDPPOConfig, REPO / QUICK, [override]), world_size=4)


@pytest.mark.mpi
@pytest.mark.parametrize("override, named", [("ppo.nmu_steps=3", "ppo.nmu_steps"),
                                             ("ppo.lr=fast", "ppo.lr")])
def test_a_bad_config_key_stops_every_rank_before_any_work(tmp_path, override, named):
    run_dir = tmp_path / "run"
    proc = mpi_run(2, ["run_ddppo.py", "--config", QUICK, override, f"run.dir={run_dir}"],
                   timeout=60)
    assert proc.returncode != 0
    assert named in proc.stderr and "error" in proc.stderr
    assert not run_dir.exists()  # nothing was started


def test_an_unknown_key_lists_the_valid_ones(capsys):
    proc = run_here(capsys, "--config", REPO / QUICK, "run.nmae=x")
    assert proc.returncode == 2
    assert "run.nmae" in proc.stderr and "total_frames" in proc.stderr


def test_an_unknown_scene_set_is_a_config_error(tmp_path, capsys):
    proc = run_here(capsys, "--config", REPO / QUICK, "env.scenes=nowhere",
                    f"run.dir={tmp_path / 'r'}")
    assert proc.returncode == 2 and "nowhere" in proc.stderr and "Traceback" not in proc.stderr


def test_print_config_prints_the_resolved_config_and_starts_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    proc = run_here(capsys, "--config", REPO / QUICK, "ppo.lr=1e-3", "--print-config")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout) == config_to_dict(
        load_config(DDPPOConfig, REPO / QUICK, ["ppo.lr=1e-3"]))
    assert yaml.safe_load(proc.stdout)["ppo"]["lr"] == 1e-3
    assert list(tmp_path.iterdir()) == []  # no run folder, no config.yaml


def test_explain_config_puts_each_keys_meaning_above_it_in_the_same_yaml(tmp_path, capsys,
                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    proc = run_here(capsys, "--config", REPO / QUICK, "ppo.lr=1e-3", "--explain-config")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout) == config_to_dict(
        load_config(DDPPOConfig, REPO / QUICK, ["ppo.lr=1e-3"]))
    meaning = field_docs(PPOConfig)["lr"]
    assert f"  # {meaning}\n  lr: 0.001\n" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_print_config_refuses_a_bad_key_in_the_one_line_a_run_gives(tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)
    proc = run_here(capsys, "--config", REPO / QUICK, "run.nmae=x", "--print-config")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("run_ddppo.py: error: unknown config key 'run.nmae'")


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A one-process run stopped with SIGTERM after its first checkpoint: (run_dir, returncode)."""
    run_dir = tmp_path_factory.mktemp("sigterm") / "run"
    proc = subprocess.Popen([sys.executable, "run_ddppo.py", "--config", QUICK,
                             f"run.dir={run_dir}", "run.total_frames=1000000"],
                            cwd=REPO, env=mpi_env(150), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    mgr = CheckpointManager(run_dir)
    _wait_for(lambda: mgr.latest() is not None, proc, 120, "the first checkpoint")
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("SIGTERM did not stop the run within 60 s")
    return run_dir, proc.returncode, out


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(stopped_run):
    run_dir, rc, out = stopped_run
    assert rc == 0, out[-3000:]
    assert "stopped by signal" in (run_dir / "log.txt").read_text()
    ckpt = load_checkpoint(CheckpointManager(run_dir).latest())
    assert ckpt["update"] >= 1 and ckpt["frames"] > 0


def test_eval_reports_success_spl_and_distance(stopped_run):
    run_dir, _, _ = stopped_run
    ckpt = CheckpointManager(run_dir).latest()
    proc = subprocess.run([sys.executable, "run_ddppo.py", "--eval", "--checkpoint", str(ckpt),
                           "eval.num_episodes=6"], cwd=REPO, env=mpi_env(150), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "episodes=6" in proc.stdout and "success=" in proc.stdout and "spl=" in proc.stdout
    assert {"eval/success", "eval/spl", "eval/distance_to_goal"} <= set(read_scalars(run_dir / "eval"))



def _run_ddppo(*argv: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run_ddppo.py"), *argv], cwd=cwd,
                          env=mpi_env(150), capture_output=True, text=True, timeout=150)


def _copy_run(stopped_run, dest):
    """A copy of the stopped run's folder at ``dest`` (as after ``mv``: its config and its
    checkpoints still name the old run.dir)."""
    shutil.copytree(stopped_run[0], dest)
    return dest


@pytest.fixture(scope="module")
def evaluations(stopped_run, tmp_path_factory):
    """The stopped run moved to another folder, its checkpoint evaluated with sampled actions
    twice, then deterministically: ``(moved run folder, checkpoint, [the folder's eval_*.json
    contents after each call], files of the old folder before, after)``."""
    old = stopped_run[0]
    moved = _copy_run(stopped_run, tmp_path_factory.mktemp("moved") / "run")
    for earlier in moved.glob("eval_*.json"):  # another test's evaluation of the stopped run
        earlier.unlink()
    ckpt = CheckpointManager(moved).latest()
    before = sorted(str(p.relative_to(old)) for p in old.rglob("*"))
    seen = []
    for extra in ([], [], ["eval.deterministic=true"]):
        proc = _run_ddppo("--eval", "--checkpoint", str(ckpt), "eval.num_episodes=4",
                          "eval.num_envs=2", *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen.append({p.name: json.loads(p.read_text()) for p in moved.glob("eval_*.json")})
    after = sorted(str(p.relative_to(old)) for p in old.rglob("*"))
    return moved, ckpt, seen, before, after


def test_sampled_evaluation_gives_the_same_result_on_every_call(evaluations):
    _, _, seen, _, _ = evaluations
    assert seen[0] and seen[0] == seen[1]


def test_sampled_and_deterministic_evaluations_are_kept_apart_with_mode_seed_and_checkpoint(
        evaluations):
    _, ckpt, seen, _, _ = evaluations
    records = sorted(seen[2].values(), key=lambda r: r.get("mode", ""))
    assert [r.get("mode") for r in records] == ["deterministic", "sampled"]
    seed = load_config(DDPPOConfig, REPO / QUICK).run.seed
    assert all(r["seed"] == seed and r["checkpoint"] == str(ckpt) for r in records)


def test_evaluating_a_moved_run_writes_beside_its_checkpoint_not_to_the_old_folder(evaluations):
    moved, _, seen, before, after = evaluations
    assert seen[2] and (moved / "eval").is_dir()
    assert after == before


def test_resume_with_a_config_file_continues_in_the_resumed_folder_and_says_so(stopped_run,
                                                                             tmp_path):
    run_dir = _copy_run(stopped_run, tmp_path / "run")
    first = CheckpointManager(run_dir).latest()
    # From another folder: QUICK's own run.dir (runs/quick_pointnav) would land in tmp_path.
    proc = _run_ddppo("--resume", str(run_dir), "--config", str(REPO / QUICK), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "runs").exists()
    assert CheckpointManager(run_dir).latest() != first
    assert f"continues in {str(run_dir)!r}" in proc.stderr


def test_print_config_of_a_resumed_run_is_its_saved_config_and_leaves_the_folder_alone(
        stopped_run, tmp_path, capsys, monkeypatch):
    run_dir = _copy_run(stopped_run, tmp_path / "run")
    before = sorted((p, p.stat().st_mtime_ns) for p in run_dir.rglob("*"))
    monkeypatch.chdir(tmp_path)
    proc = run_here(capsys, "--resume", run_dir, "ppo.lr=1e-3", "--print-config")
    assert proc.returncode == 0, proc.stderr
    saved = load_config(DDPPOConfig, run_dir / "config.yaml", [f"run.dir={run_dir}", "ppo.lr=1e-3"])
    assert yaml.safe_load(proc.stdout) == config_to_dict(saved)
    assert sorted((p, p.stat().st_mtime_ns) for p in run_dir.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_resume_and_another_run_dir_are_refused_in_one_line(stopped_run, tmp_path, capsys):
    run_dir = _copy_run(stopped_run, tmp_path / "run")
    proc = run_here(capsys, "--resume", run_dir, "--config", REPO / QUICK,
                    f"run.dir={tmp_path / 'other'}")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "run.dir" in proc.stderr
    assert not (tmp_path / "other").exists()


def test_a_fresh_run_in_a_folder_holding_checkpoints_is_refused_in_one_line(stopped_run,
                                                                           tmp_path, capsys):
    run_dir = _copy_run(stopped_run, tmp_path / "run")
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    proc = run_here(capsys, "--config", REPO / QUICK, f"run.dir={run_dir}",
                    "run.auto_resume=false")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "run.auto_resume=false" in lines[0] and "run.name" in lines[0]
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "log.txt"} \
        == {p: b for p, b in files.items() if p.name != "log.txt"}


@pytest.mark.mpi
def test_killing_one_rank_ends_the_whole_job_and_the_checkpoint_stays_loadable(tmp_path):
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen([mpiexec_path(), "-n", "2", sys.executable, "run_ddppo.py", "--config",
                             QUICK, f"run.dir={run_dir}", "run.total_frames=1000000"],
                            cwd=REPO, env=mpi_env(150), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    mgr = CheckpointManager(run_dir)
    _wait_for(lambda: mgr.latest() is not None, proc, 120, "the first checkpoint")
    ranks = python_pids(str(run_dir))
    assert len(ranks) == 2, ranks
    os.kill(max(ranks), signal.SIGKILL)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the job kept running (hung) after one rank was killed")
    assert proc.returncode != 0
    assert not [p for p in python_pids(str(run_dir))]  # no orphaned rank
    assert load_checkpoint(mgr.latest())["frames"] > 0


def test_resume_without_a_config_into_another_run_dir_is_refused_and_writes_nothing(tmp_path):
    # Without --config the run's saved config.yaml is loaded; a run.dir override naming another
    # folder would have continued the run's checkpoint there.
    run = tmp_path / "run"
    first = subprocess.run([sys.executable, "run_ddppo.py", "--config",
                            "configs/quick_pointnav.yaml", f"run.dir={run}",
                            "run.total_frames=64"], cwd=REPO, capture_output=True, text=True,
                           timeout=240)
    assert first.returncode == 0, first.stderr[-2000:]
    other = tmp_path / "other"
    proc = subprocess.run([sys.executable, "run_ddppo.py", "--resume", str(run),
                           f"run.dir={other}", "run.total_frames=128"], cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2 and "name different run folders" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not other.exists()


def test_eval_takes_a_run_folder_keeps_each_episode_count_apart_and_refuses_a_misfit(tmp_path):
    run = tmp_path / "run"
    subprocess.run([sys.executable, "run_ddppo.py", "--config", "configs/quick_pointnav.yaml",
                    f"run.dir={run}", "run.total_frames=64"], cwd=REPO, check=True,
                   capture_output=True, timeout=240)

    def evaluate(*extra):
        return subprocess.run([sys.executable, "run_ddppo.py", "--eval", "--checkpoint", str(run),
                               *extra], cwd=REPO, capture_output=True, text=True, timeout=240)
    for n in (2, 3):
        assert evaluate(f"eval.num_episodes={n}").returncode == 0
    names = sorted(p.name for p in run.glob("eval_*.json"))
    assert names == ["eval_ckpt_000000000064_val_sampled_2ep.json",
                     "eval_ckpt_000000000064_val_sampled_3ep.json"]
    misfit = evaluate("--config", "configs/quick_pointnav.yaml", "policy.hidden_size=48",
                      "eval.num_episodes=2")
    assert misfit.returncode == 2 and len(misfit.stderr.strip().splitlines()) == 1
    assert "holds another model than the configured policy" in misfit.stderr
    assert "trained with policy.hidden_size=32" in misfit.stderr
