"""Bad inputs a new user gives, through both entry points: each command line is refused with
exactly one line on stderr and exit status 2, and leaves the run folder as it was (a new one holds
at most the released lock).

The rows run in this process (each entry point's ``main(argv)``: spawning Python costs seconds of
CPU a row); three run as launched jobs, one of them at two ranks. To add a refusal, add a row to
``RL`` or ``SUPERVISED``: ``(id, argv, a fragment of the line)``. In ``argv``, ``{new}`` is a run folder that does not exist
yet, ``{rl_run}`` / ``{sup_run}`` a copy of a finished RL / supervised run (compared file by file
after the refusal), ``{rl_ckpt}`` / ``{sup_ckpt}`` its newest checkpoint, ``{repo}`` the checkout.
"""
from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

import run_ddppo
from mpi_launch import REPO, mpi_run
from wagma_rl.job.runlock import RunLock
from wagma_rl.supervised.__main__ import main as supervised_main

QUICK = "{repo}/configs/quick_pointnav.yaml"
SHAPES = "{repo}/configs/resnet_shapes.yaml"
NEW = "run.dir={new}"

#: run_ddppo.py's refusals: (id, argv, a fragment the one line holds).
RL = [
    ("no-config", [], "give --config FILE"),
    ("unknown-flag", ["--config", QUICK, "--bogus", NEW], "unrecognized arguments: --bogus"),
    ("eval-without-checkpoint", ["--eval"], "--eval needs --checkpoint"),
    ("all-checkpoints-without-eval", ["--all-checkpoints", "--config", QUICK, NEW],
     "--all-checkpoints needs --eval"),
    ("config-missing", ["--config", "{repo}/configs/nope.yaml", NEW], "nope.yaml"),
    ("override-without-value", ["--config", QUICK, "ppo.lr", NEW], "ppo.lr"),
    ("unknown-key", ["--config", QUICK, "ppo.nmu_steps=3", NEW], "ppo.nmu_steps"),
    ("wrong-type", ["--config", QUICK, "ppo.lr=fast", NEW], "ppo.lr"),
    ("supervised-config", ["--config", SHAPES, NEW], "python -m wagma_rl.supervised"),
    ("gamma-out-of-range", ["--config", QUICK, "ppo.gamma=1.5", NEW], "ppo.gamma"),
    ("outer-lr-zero", ["--config", QUICK, "averaging.outer_lr=0", NEW], "averaging.outer_lr"),
    ("mini-batches-over-envs", ["--config", QUICK, "ppo.num_mini_batch=3", NEW],
     "ppo.num_mini_batch"),
    ("group-size-zero", ["--config", QUICK, "averaging.group_size=0", NEW], "averaging.group_size"),
    ("global-mode", ["--config", QUICK, "averaging.global_mode=lazy", NEW], "averaging.global_mode"),
    ("device", ["--config", QUICK, "run.device=tpu", NEW], "run.device"),
    ("precision", ["--config", QUICK, "run.precision=fp8", NEW], "run.precision"),
    ("slow-env-outside", ["--config", QUICK, "heterogeneity.slow_envs=[5]", NEW],
     "heterogeneity.slow_envs"),
    ("unknown-scenes", ["--config", QUICK, "env.scenes=nowhere", NEW], "nowhere"),
    ("cuda-graph-on-cpu", ["--config", QUICK, "rollout.cuda_graph=true", NEW],
     "config key 'rollout.cuda_graph': graphs replay the policy's step of a GPU run"),
    ("print-config-bad-key", ["--config", QUICK, "ppo.nmu_steps=3", "--print-config"],
     "ppo.nmu_steps"),
    ("resume-missing", ["--resume", "{new}"], "no such run folder"),
    ("resume-into-other-dir", ["--resume", "{rl_run}", NEW], "name different run folders"),
    ("resume-config-into-other-dir", ["--resume", "{rl_run}", "--config", QUICK, NEW],
     "name different run folders"),
    ("resume-other-policy", ["--resume", "{rl_run}", "--config", QUICK, "run.dir={rl_run}",
                             "policy.hidden_size=64"], "trained with policy.hidden_size=32"),
    ("resume-other-mode", ["--config", QUICK, "run.dir={rl_run}", "averaging.name=allreduce"],
     "averaging.name=wagma"),
    ("fresh-start-over-checkpoints", ["--config", QUICK, "run.dir={rl_run}",
                                      "run.auto_resume=false"], "run.auto_resume=false"),
    ("resume-supervised-folder", ["--resume", "{sup_run}"], "python -m wagma_rl.supervised"),
    ("resume-supervised-checkpoint", ["--resume", "{sup_ckpt}", "--config", QUICK,
                                      "run.dir={sup_run}"], "python -m wagma_rl.supervised"),
    ("eval-missing", ["--eval", "--checkpoint", "{new}/ckpt.pt"], "not found"),
    ("eval-other-policy", ["--eval", "--checkpoint", "{rl_run}", "--config", QUICK,
                           "policy.hidden_size=64"], "trained with policy.hidden_size=32"),
    ("eval-supervised-checkpoint", ["--eval", "--checkpoint", "{sup_ckpt}", "--config", QUICK],
     "python -m wagma_rl.supervised"),
    ("eval-supervised-folder", ["--eval", "--checkpoint", "{sup_run}"],
     "python -m wagma_rl.supervised"),
]

#: python -m wagma_rl.supervised's refusals, as :data:`RL`.
SUPERVISED = [
    ("no-config", [NEW], "required: --config"),
    ("unknown-flag", ["--config", SHAPES, "--bogus", NEW], "unrecognized arguments: --bogus"),
    ("unknown-key", ["--config", SHAPES, "train.stpes=3", NEW], "train.stpes"),
    ("rl-config", ["--config", QUICK, NEW], "python run_ddppo.py"),
    ("steps-zero", ["--config", SHAPES, "train.steps=0", NEW], "train.steps"),
    ("batch-size-zero", ["--config", SHAPES, "train.batch_size=0", NEW], "train.batch_size"),
    ("time-budget", ["--config", SHAPES, "train.time_budget_s=-1", NEW], "train.time_budget_s"),
    ("outer-without-global-average", ["--config", SHAPES, "averaging.name=allreduce",
                                      "averaging.outer=nesterov", NEW], "averaging.outer"),
    ("background-gradients", ["--config", SHAPES, "averaging.name=allreduce",
                              "averaging.background=true", NEW], "averaging.background"),
    ("node-exchange-not-allreduce", ["--config", SHAPES, "averaging.name=wagma",
                                     "averaging.exchange=node", NEW], "averaging.exchange"),
    ("node-exchange-with-buckets", ["--config", SHAPES, "averaging.name=allreduce",
                                    "averaging.exchange=node", "averaging.bucket_mb=4", NEW],
     "averaging.bucket_mb"),
    ("env-stall-names-its-key", ["--config", SHAPES, "heterogeneity.env_stall_s=1", NEW],
     "heterogeneity.env_stall_s"),
    ("data-path-missing", ["--config", SHAPES, "data.source=path", "data.path={new}/images", NEW],
     "images"),
    ("print-config-bad-key", ["--config", SHAPES, "train.stpes=3", "--print-config"],
     "train.stpes"),
    ("rl-run-folder", ["--config", SHAPES, "run.dir={rl_run}"], "python run_ddppo.py"),
    ("fresh-start-over-checkpoints", ["--config", SHAPES, "run.dir={sup_run}",
                                      "run.auto_resume=false"], "run.auto_resume=false"),
    ("resume-other-model", ["--config", "{sup_run}/config.yaml", "run.dir={sup_run}",
                            "model.width=8"], "does not fit this run"),
]


def _call(main, argv: list[str]) -> int:
    """``main(argv)`` in this process, its exit status (SystemExit included); the stop-signal
    handlers an entry point installs are put back as they were."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` but its lock, by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished RL run and a finished supervised run (a few updates / steps each)."""
    root = tmp_path_factory.mktemp("finished")
    rl, sup = root / "rl", root / "sup"
    code = _call(run_ddppo.main, ["--config", str(REPO / "configs/quick_pointnav.yaml"),
                                           f"run.dir={rl}", "run.total_frames=64"])
    assert code == 0
    code = _call(supervised_main, ["--config", str(REPO / "configs/resnet_shapes.yaml"),
                                   f"run.dir={sup}", "data.train_size=64", "data.val_size=16",
                                   "model.width=4", "train.batch_size=8", "train.steps=2",
                                   "train.eval_every=2", "train.eval_batches=1",
                                   "optim.warmup_steps=0"])
    assert code == 0
    return {"rl_run": rl, "sup_run": sup}


def _refused(main, argv, fragment, finished, tmp_path, capfd):
    new = tmp_path / "new"
    places = {"new": new, "repo": REPO}
    for name in ("rl_run", "sup_run"):
        places[name] = tmp_path / name
        shutil.copytree(finished[name], places[name])
        places[name.replace("run", "ckpt")] = max((places[name] / "checkpoints").glob("ckpt_*.pt"))
    before = {name: _files(places[name]) for name in ("rl_run", "sup_run")}
    capfd.readouterr()
    code = _call(main, [arg.format(**places) for arg in argv])
    err = capfd.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], err
    assert ": error: " in lines[0] and "Traceback" not in err
    assert not new.exists() or [p.name for p in new.rglob("*")] == [".lock"]
    assert not new.exists() or (new / ".lock").read_bytes() == b""  # released
    for name in ("rl_run", "sup_run"):
        assert _files(places[name]) == before[name], f"{name} changed"


@pytest.mark.parametrize("argv,fragment", [row[1:] for row in RL], ids=[row[0] for row in RL])
def test_run_ddppo_refuses_in_one_line_and_writes_nothing(argv, fragment, finished, tmp_path,
                                                          capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (a stray runs/<name> would land here)
    _refused(run_ddppo.main, argv, fragment, finished, tmp_path, capfd)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv,fragment", [row[1:] for row in SUPERVISED],
                         ids=[row[0] for row in SUPERVISED])
def test_the_supervised_job_refuses_in_one_line_and_writes_nothing(argv, fragment, finished,
                                                                   tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _refused(supervised_main, argv, fragment, finished, tmp_path, capfd)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("entry", ["rl", "supervised"])
def test_a_folder_in_use_is_refused_and_keeps_its_holders_lock(entry, tmp_path, capfd):
    config, main = (QUICK, run_ddppo.main) if entry == "rl" else (SHAPES, supervised_main)
    run = tmp_path / "held"
    with RunLock(run) as held:
        record = held.path.read_text()
        capfd.readouterr()
        code = _call(main, ["--config", config.format(repo=REPO), f"run.dir={run}"])
        err = capfd.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1 and "in use by another run" in err
        assert [p.name for p in run.iterdir()] == [".lock"]
        assert record.strip() and held.path.read_text() == record  # still the holder's


@pytest.mark.mpi
@pytest.mark.parametrize("ranks,argv,fragment", [
    (1, ["run_ddppo.py", "--config", QUICK, "ppo.nmu_steps=3", NEW], "ppo.nmu_steps"),
    (1, ["-m", "wagma_rl.supervised", "--config", QUICK, NEW], "python run_ddppo.py"),
    (2, ["run_ddppo.py", "--config", QUICK, "run.dir={rl_run}", "policy.hidden_size=64"],
     "trained with policy.hidden_size=32"),
], ids=["rl", "supervised", "rl-2-ranks-resume-other-policy"])
def test_a_launched_job_prints_one_line_and_exits_2(ranks, argv, fragment, finished, tmp_path):
    # What only fresh interpreters show (import warnings, MPI's start and end, every rank agreeing);
    # mpi_run fails the test with the ranks' output should they hang.
    rl_run = shutil.copytree(finished["rl_run"], tmp_path / "rl_run")
    before = _files(rl_run)
    places = {"new": tmp_path / "new", "rl_run": rl_run, "repo": REPO}
    proc = mpi_run(ranks, [arg.format(**places) for arg in argv], timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr, proc.stderr
    assert not (tmp_path / "new").exists() and _files(rl_run) == before
