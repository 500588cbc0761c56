"""The benchmark scripts' outputs: where a run writes what the docs show (nothing is trained)."""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import modes

ROOT = Path(__file__).resolve().parents[1]


def test_a_mode_comparison_with_default_paths_writes_nothing_the_docs_show():
    args = modes.parse_args([])
    written = [args.out, *modes.figure_paths(args, ranks=4)]
    shown = [ROOT / "docs", ROOT / "benchmarks" / "results"]
    assert not [p for p in written if any(Path(p).resolve().is_relative_to(d) for d in shown)]


def test_the_figures_go_where_plots_says_with_the_rank_count_filled_in():
    args = modes.parse_args(["--ranks", "4", "--ranks", "8", "--plots", "docs/modes_{ranks}r_x"])
    assert [Path(p).as_posix() for p in modes.figure_paths(args, ranks=8)] == \
        ["docs/modes_8r_x_success_frames.png", "docs/modes_8r_x_success_wall.png"]


def test_a_mode_comparison_refuses_a_modes_old_name_naming_the_new_one(capsys):
    with pytest.raises(SystemExit):
        modes.parse_args(["--modes", "wagma", "localsgd"])
    assert "'localsgd' has been renamed: use local_sgd" in capsys.readouterr().err


def _args(**kw):
    from benchmarks import optim_convergence as oc

    return oc.parse_args(["--task", "resnet", *[f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]])


def test_convergence_runs_are_budgeted_in_wall_time_not_steps():
    # A step budget cut off the fastest optimizer (NonBlockingSGD: 250 steps in 22 s, before
    # its loss target) while the slowest had minutes: every run gets the same seconds instead.
    from benchmarks import optim_convergence as oc

    args = _args(budget_s=90)
    over = oc.run_overrides(oc.TASKS["resnet"], "nonblocking", "random", 0, args, Path("/tmp/r"))
    assert "train.time_budget_s=90.0" in over
    steps = int(next(o for o in over if o.startswith("train.steps="))[len("train.steps="):])
    assert steps >= 100_000  # a bound no run reaches in 90 s


def test_a_convergence_table_names_the_overrides_every_run_had_also_when_re_summarized(tmp_path):
    # `--set averaging.late=merge` ran every WAGMA row on the old late rule: a header that said
    # "late rule apply" without it would misstate the table, and a re-summary must keep it.
    from benchmarks import optim_convergence as oc

    rows = [{"step": 25, "train_s": 30.0, "train_loss": 1.0, "bleu": 25.0, "samples_per_s": 100.0}]
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({
        "facts": {"date": "2026-11-28T13:25:52+00:00"}, "wall_s": 60.0,
        "config": {"optimizers": ["allreduce", "wagma"], "stragglers": ["random"], "seed_list": [0],
                   "seeds": 1, "batch": 32, "micro_batches": 2, "steps": 1000, "budget_s": 240.0,
                   "eval_every": 25, "ranks": 4, "delay": 0.3, "factor": 3.0, "group_size": 2,
                   "set": ["averaging.late=merge"]},
        "curves": {"allreduce/random/0": rows, "wagma/random/0": rows}}))
    out = tmp_path / "table"
    oc.main(["--task", "transformer", "--from-json", str(saved), "--out", str(out)])
    header = out.with_suffix(".md").read_text().splitlines()[0]
    assert "; for every run averaging.late=merge. Benchmark wall time" in header
    assert "late rule merge;" in header and "late rule apply" not in header
    again = json.loads(out.with_suffix(".json").read_text())
    assert again["facts"] == {"date": "2026-11-28T13:25:52+00:00"}  # the measuring run's, kept
    assert again["config"]["set"] == ["averaging.late=merge"]


def _rows(seconds_to_loss: float, *, loss_after: float = 1.0) -> list[dict]:
    """An evaluation history reaching training loss ``loss_after`` at ``seconds_to_loss``."""
    return [{"step": 20, "train_s": seconds_to_loss / 2, "train_loss": 2.0, "accuracy": 10.0,
             "samples_per_s": 100.0},
            {"step": 40, "train_s": seconds_to_loss, "train_loss": loss_after, "accuracy": 50.0,
             "samples_per_s": 100.0}]


def test_the_convergence_table_gives_each_seeds_time_and_ratio_to_allreduce():
    from benchmarks import optim_convergence as oc

    args = _args(seeds=2)
    args.optimizers, args.stragglers = ["allreduce", "nonblocking"], ["random"]
    results = {("allreduce", "random", 0): _rows(60.0), ("allreduce", "random", 1): _rows(50.0),
               ("nonblocking", "random", 0): _rows(40.0),
               ("nonblocking", "random", 1): _rows(20.0, loss_after=9.0)}  # seed 1 never gets there
    table, summary = oc.summarize(results, oc.TASKS["resnet"], args)
    row = summary["nonblocking/random"]
    assert row["s_to_loss_per_seed"] == [40.0, None]
    assert row["speedup_vs_allreduce_per_seed"] == [1.5, None]
    # to the accuracy target (both seeds reach 50% at their last evaluation): 60/40, 50/20
    assert row["metric_speedup_vs_allreduce_per_seed"] == [1.5, 2.5]
    assert row["metric_speedup_vs_allreduce"] == 2.0
    line = next(x for x in table.splitlines() if x.startswith("| nonblocking |"))
    assert "40.0 / not reached" in line and "1.50 / n/a" in line and "1.50 / 2.50" in line


def test_the_scale_validation_runs_on_the_recorded_results_and_writes_its_table(tmp_path):
    # (It stopped with a TypeError once the simulator's Setup lost an argument, unnoticed.)
    out = tmp_path / "validation.md"
    proc = subprocess.run(
        [sys.executable, "benchmarks/scale_validate.py", "--updates", "200", "--out", str(out),
         "--recorded", "benchmarks/results/modes_4_trivial.md",
         "--traced", "benchmarks/results/traces/modes_4_trivial_5modes",
         "--measured", "benchmarks/results/modes_4_trivial_5modes.md"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in out.read_text().splitlines() if line.startswith("| modes_4")]
    assert len(rows) == 3 + 10, rows  # 3 recorded modes, 5 traced modes x (trace, fit)
    ratios = [float(r.split("|")[6]) for r in rows]
    assert all(0.5 < x < 2.0 for x in ratios), rows


def test_the_scale_validation_reads_todays_keys_and_every_simulated_mode(tmp_path):
    from benchmarks.scale_validate import recorded_rows

    # averaging.sync_period (distrib.* before the rename) and the overlapped WAGMA row
    rows = recorded_rows(ROOT / "benchmarks/results/modes_4_trivial_sync20_1128.md")
    assert [(r["mode"], r["sync_period"], r["fps"]) for r in rows] == \
        [("allreduce", 20, 498.0), ("wagma", 20, 838.0)]
    assert recorded_rows(ROOT / "benchmarks/results/modes_4_trivial_sync20.md")[1]["sync_period"] == 20
    modes = [r["mode"] for r in recorded_rows(ROOT / "benchmarks/results/modes_4_trivial_5modes_1127.md")]
    assert modes == ["allreduce", "preempt", "wagma", "wagma_overlap", "dpsgd", "local_sgd"]
    # traced runs whose table lacks their mode: one line that says which
    proc = subprocess.run(
        [sys.executable, "benchmarks/scale_validate.py", "--updates", "50",
         "--traced", "benchmarks/results/traces/modes_4_trivial_5modes_1127",
         "--measured", "benchmarks/results/modes_4_trivial_sync20_1128.md"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "allreduce_s1" not in proc.stderr.splitlines()[-1]
    assert "dpsgd_s1 is a dpsgd run" in proc.stderr.splitlines()[-1]


def test_the_update_benchmark_gives_each_rollout_against_the_even_one(capsys):
    from benchmarks import ppo_update

    ppo_update.main(["--lengths", "4,4", "6,2", "--depth", "16", "--base-planes", "4",
                     "--repeats", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 4,4")
            or line.startswith("| 6,2")]
    assert [r.split("|")[1:4] for r in rows] == [[" 4,4 ", " 8 ", " 16 "], [" 6,2 ", " 8 ", " 16 "]]
    assert rows[0].endswith("| 1.00x |")


def test_a_mode_comparison_runs_both_learning_rate_protocols_and_reports_every_seed(
        tmp_path, monkeypatch, capsys):
    """The orchestration with the training stood in: --same-lr runs every mode again at that
    rate (and only then passes ppo.lr), each seed's ratio is taken against allreduce's run of the
    same seed, and the raw file keeps every seed's figures with the run's facts."""
    import json

    launched = []
    fps = {("allreduce", 1): 100.0, ("allreduce", 2): 200.0, ("wagma", 1): 150.0, ("wagma", 2): 220.0}

    def fake_run(mode, ranks, run_dir, *, frames, overrides, timeout, cluster=None):
        launched.append((mode, run_dir.name, [o for o in overrides if o.startswith("ppo.lr")]))
        return 1.0

    def fake_summary(run_dir, levels):
        mode, seed = run_dir.name.split("_lr")[0].rsplit("_s", 1)[0], int(run_dir.name[-1])
        rate = fps[(mode, seed)] * (0.5 if "_lr" in run_dir.name else 1.0)
        curve = [(0.0, 0.0), (1000.0, 0.1 * seed)]
        return {"frames": 1000.0, "wall_s": 1000.0 / rate, "fps": rate, "collect_s": 1.0,
                "update_s": 0.1, "comm_s": 0.01, "wait_s": 0.2, "success": 0.1 * seed,
                "spl": 0.05, "success_mean": 0.05 * seed, "rollout_min": 64,
                "series": {"success": curve, "success_wall": curve}}

    monkeypatch.setattr(modes, "run_mode", fake_run)
    monkeypatch.setattr(modes, "summarize", fake_summary)
    out = tmp_path / "t.md"
    assert modes.main(["--modes", "allreduce", "wagma", "--seeds", "2", "--same-lr", "0.002",
                       "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert [(m, d) for m, d, _ in launched] == [
        ("allreduce", "allreduce_s1"), ("wagma", "wagma_s1"),
        ("allreduce", "allreduce_lr0.002_s1"), ("wagma", "wagma_lr0.002_s1"),
        ("allreduce", "allreduce_s2"), ("wagma", "wagma_s2"),
        ("allreduce", "allreduce_lr0.002_s2"), ("wagma", "wagma_lr0.002_s2")]
    assert all((lr == ["ppo.lr=0.002"]) == ("_lr" in d) for _, d, lr in launched)
    text = out.read_text()
    assert "| 1 | 100 (success 0.10) | 150 (success 0.10) | 1.50x |" in text
    assert "| 2 | 200 (success 0.20) | 220 (success 0.20) | 1.10x |" in text
    assert "Per-seed range of frames/s against allreduce: wagma: 1.10-1.50x." in text
    assert "every mode at learning rate 0.002" in text
    raw = json.loads(out.with_suffix(".json").read_text())
    assert raw["facts"]["load_end"] is not None and raw["facts"]["config"]["same_lr"] == 0.002
    assert [r["fps"] for r in raw["per_seed"]["4"]["own"]["wagma"]] == [150.0, 220.0]
    assert [r["fps"] for r in raw["per_seed"]["4"]["lr 0.002"]["allreduce"]] == [50.0, 100.0]
    args = modes.parse_args(["--out", str(out)])
    for suffix in ("", "_lr0.002"):
        assert all(p.is_file() for p in modes.figure_paths(args, ranks=4, suffix=suffix))
        assert all(modes.seeds_figure(args, ranks=4, mode=m, suffix=suffix).is_file()
                   for m in ("allreduce", "wagma"))


def test_the_readme_table_is_made_from_the_raw_files(tmp_path):
    """benchmarks/headline.py reads each row's raw file (here the committed scale sweep and a
    mode comparison in the current format) and names the command where one is missing."""
    import json
    import shutil

    from benchmarks import headline

    shutil.copy(ROOT / "benchmarks" / "results" / "scale_sweep.json", tmp_path)
    run = lambda fps, success: {"fps": fps, "success": success}
    (tmp_path / "headline_modes.json").write_text(json.dumps({
        "facts": {"cores": 2, "load": 1.5, "load_end": 2.5, "date": "2026-11-26T22:00:00",
                  "commit": "abc1234", "dirty": False,
                  "config": {"frames": 30000, "stall_s": 1.0, "stall_prob": 0.01,
                             "overrides": ["env.scenes=trivial"]}},
        "per_seed": {"4": {
            "own": {"allreduce": [run(100, 0.4), run(200, 0.5)],
                    "preempt": [run(125, 0.3), run(200, 0.3)],
                    "wagma": [run(150, 0.6), run(220, 0.7)]},
            "lr 0.001": {"allreduce": [run(100, 0.4), run(200, 0.5)],
                         "wagma": [run(130, 0.2), run(260, 0.3)]}}}}))
    text = headline.table(results=tmp_path)
    rows = text.splitlines()[2:]
    assert len(rows) == len(headline.ROWS)
    rl = next(r for r in rows if "PointNav" in r)
    assert "4 ranks, trivial scenes, 30000 frames" in rl and "2 cores, load 1.5-2.5, 2026-11-26, abc1234" in rl
    # per seed 1.50x and 1.10x: median 1.30x; against preemption 1.20x and 1.10x
    assert "WAGMA vs allreduce frames/s 1.30x (per seed 1.10-1.50x)" in rl
    assert "vs preemption 1.15x (per seed 1.10-1.20x)" in rl
    assert "all at lr 0.001: WAGMA vs allreduce frames/s 1.30x (per seed 1.30-1.30x)" in rl
    scale = next(r for r in rows if "scale simulator" in r)
    assert "WAGMA 1.74x allreduce, 0.90x DD-PPO preemption" in scale and "ahead in 12" in scale
    missing = next(r for r in rows if r.startswith("| ver: no raw file yet"))
    assert "run `python benchmarks/ver.py --collections lockstep ver" in missing


def test_the_readme_table_goes_between_the_markers_and_nowhere_else(tmp_path):
    from benchmarks import headline

    page = tmp_path / "README.md"
    page.write_text(f"# x\n\nbefore\n{headline.BEGIN}\nold table\n{headline.END}\nafter\n")
    headline.write_readme("| new |\n", page)
    assert page.read_text() == f"# x\n\nbefore\n{headline.BEGIN}\n| new |\n{headline.END}\nafter\n"
    page.write_text("no markers\n")
    with pytest.raises(SystemExit, match="lacks the markers"):
        headline.write_readme("| new |\n", page)


def test_every_headline_command_is_one_its_benchmark_accepts(monkeypatch):
    """Each row's command line parses with its benchmark's own parser (nothing is trained: the
    first training call stops the benchmark)."""
    from benchmarks import headline, optim_convergence, ver

    class Started(Exception):
        pass

    def started(*a, **k):
        raise Started

    monkeypatch.setattr(modes, "run_mode", started)
    monkeypatch.setattr(ver, "run_mode", started)
    for row in headline.ROWS:
        if row.command is None:
            continue
        script, argv = Path(row.command[1]).stem, row.command[2:]
        if script == "modes":
            with pytest.raises(Started):
                modes.main(argv)
        elif script == "ver":
            with pytest.raises(Started):
                ver.main(argv)
        elif script == "optim_convergence":
            args = optim_convergence.parse_args(argv)
            assert args.seeds == 3 and args.stragglers == ["random"]
        elif script in ("elastic_recovery", "faults_inplace", "train_eval"):
            module = importlib.import_module(f"benchmarks.{script}")
            assert module.parse_args(argv).out.startswith("benchmarks/results/")
        else:
            assert script == "scale_sweep" and argv == []


def test_the_fault_rows_name_averaging_timeouts_default():
    """The README's fault rows say they ran at the default timeout; that figure is the engine's.
    They (and `make train`'s, 11 min) are re-run only when named, which keeps `make results`
    within its hour."""
    from benchmarks import headline
    from native_coll.handshake import DEFAULT_TIMEOUT
    assert headline.DEFAULT_TIMEOUT_S == DEFAULT_TIMEOUT
    assert {r.key for r in headline.ROWS if not r.default} == {"faults", "faults_inplace", "train"}


def test_train_eval_reads_when_the_training_window_first_reached_each_level(tmp_path):
    """benchmarks/train_eval.py's summary of a run's TensorBoard events: the first frames at
    which success reached 0.5, 0.75 and 0.9 (None where it never did) and the last values."""
    from benchmarks import train_eval
    from wagma_rl.job.tblog import RunLogger

    with RunLogger(tmp_path, echo=False) as log:
        for frames, success in ((1000, 0.1), (2000, 0.5), (3000, 0.4), (4000, 0.8)):
            log.scalars({"metrics/success": success, "metrics/spl": success / 2,
                         "metrics/distance_to_goal": 1.0 - success}, frames)
    summary = train_eval.curve_summary(tmp_path)
    assert summary["frames_to_success"] == {"0.5": 2000, "0.75": 4000, "0.9": None}
    assert summary["points"] == 4
    assert summary["last"] == pytest.approx({"success": 0.8, "spl": 0.4, "distance_to_goal": 0.2})


def test_scale_run_records_the_simulators_rows_with_the_runs_facts(tmp_path, capsys):
    """benchmarks/scale_run.py passes everything after -- to the simulator and writes its rows
    (one per rollout mode and mode) into a raw file with the facts; the table has a line each."""
    import json

    from benchmarks import scale_run

    out = tmp_path / "run.json"
    assert scale_run.main(["--out", str(out), "--", "--workers", "4", "--updates", "5", "--modes",
                           "allreduce", "wagma", "--rollout-mode", "lockstep", "ver"]) == 0
    data = json.loads(out.read_text())
    assert data["facts"]["load_end"] is not None and data["argv"][:2] == ["--workers", "4"]
    assert [(r["rollout_mode"], r["mode"]) for r in data["rows"]] == [
        ("lockstep", "allreduce"), ("lockstep", "wagma"), ("ver", "allreduce"), ("ver", "wagma")]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("| workers | collection | mode") and len(printed) == 2 + 4
    assert printed[2].startswith("| 4 | lockstep | allreduce |")


HABITAT_LOG = """\
[2026-11-27 21:53:55] training wagma on 2 ranks x 4 envs (lockstep rollouts, process envs, simulator habitat-sim)
[2026-11-27 21:53:56] update=2 frames=256 fps=243.4 success=0.000 spl=0.000 reward=-0.097 dist=3.895 collect_s=0.417 update_s=0.037 comm_s=0.001 wait_s=0.070
[2026-11-27 21:53:58] update=4 frames=512 fps=250.9 success=0.000 spl=0.000 reward=-0.099 dist=4.408 collect_s=0.414 update_s=0.066 comm_s=0.004 wait_s=0.016
[2026-11-27 21:53:58] stopped: env 0 (pid 27357, in episode '37') died during step (killed by SIGKILL)
[2026-11-27 21:54:32] resumed from /r/checkpoints/ckpt_000000000256.pt: update 2, frames 256
[2026-11-27 21:54:33] update=4 frames=512 fps=274.5 success=0.000 spl=0.000 reward=-0.064 dist=3.841 collect_s=0.403 update_s=5.4e-02 comm_s=0.001 wait_s=0.006
"""


def test_the_habitat_run_reads_the_updates_on_each_side_of_the_relaunch():
    """benchmarks/habitat_run.py: log.txt's update lines before the fault and after the relaunch's
    'resumed from' (update, frames, frames/s and the collect/update split, timestamps)."""
    from benchmarks import habitat_run

    log = habitat_run.read_log(HABITAT_LOG)
    assert [(r["update"], r["frames"], r["fps"]) for r in log["before"]] == [
        (2, 256, 243.4), (4, 512, 250.9)]
    assert [(r["update"], r["collect_s"], r["update_s"]) for r in log["after"]] == [
        (4, 0.403, 0.054)]
    assert log["resumed"]["update"] == 2 and log["resumed"]["frames"] == 256
    assert log["after"][0]["t"] - log["before"][-1]["t"] == 35.0
    assert habitat_run.read_log("") == {"before": [], "after": [], "resumed": None}


def test_the_habitat_run_finds_the_env_worker_of_the_rank_it_kills(tmp_path):
    """The worker the benchmark kills: a child running _exec_worker of the trainer process whose
    command line names run_ddppo.py and the run folder and whose launcher gave it the rank."""
    from benchmarks import habitat_run

    trainer_code = ("import subprocess, sys, time; "
                    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
                    "'_exec_worker']); time.sleep(60)")
    run_dir = tmp_path / "run"
    procs = [subprocess.Popen([sys.executable, "-c", trainer_code, "run_ddppo.py",
                               f"run.dir={run_dir}"], env={"PMI_RANK": str(rank)})
             for rank in (0, 1)]
    try:
        found = None
        for _ in range(100):
            found = habitat_run.env_worker_of(run_dir, 1)
            if found:
                break
            time.sleep(0.1)
        assert found is not None and found[0] == procs[1].pid
        assert habitat_run._parent(found[1]) == procs[1].pid
        assert "_exec_worker" in habitat_run._cmdline(found[1])
        assert habitat_run.rank_of(procs[0].pid) == 0
        assert habitat_run.env_worker_of(tmp_path / "other", 1) is None
    finally:
        for p in procs:  # the sleeping child first, then the process that started it
            for pid in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split():
                os.kill(int(pid), signal.SIGKILL)
            p.kill()
            p.wait()


def test_the_habitat_run_prints_training_fault_and_evaluation_tables():
    from benchmarks import habitat_run

    log = habitat_run.read_log(HABITAT_LOG)
    result = {"setup": {"ranks": 2, "envs": 4},
              "train": {**log, "frames": 512, "wall_s": 61.8, "median_fps": 250.9,
                        "exit_status": 0, "fault": {"worker": 4242, "rank": 1},
                        "failure_lines": ["run_ddppo.py: error (rank 1): env 0 (pid 4242) died"],
                        "updates_redone": 2, "fault_to_first_update_s": 35.0},
              "eval": {"rows": [{"checkpoint": "ckpt_000000000512.pt", "frames": "512",
                                 "episodes": "4", "success": "0.25", "spl": "0.2",
                                 "distance_to_goal": "2.5"}]}}
    lines = habitat_run.tables(result).splitlines()
    # 256 frames in the 2 s between the first launch's two updates; the relaunch logged one
    assert habitat_run.throughput(result["train"]) == 128.0
    assert lines[2] == "| 2 x 4 | 512 | 61.8 | 128.0 | 250.9 | 0 of 3 | 0.41 / 0.05 | 0 |"
    assert lines[6] == ("| SIGKILL of env worker pid 4242 (rank 1) | `run_ddppo.py: error (rank 1): "
                        "env 0 (pid 4242) died` | 2 | 35.0 |")
    assert lines[-1] == "| ckpt_000000000512.pt | 512 | 4 | 0.250 | 0.200 | 2.500 |"


def test_the_readme_habitat_row_gives_the_run_the_fault_and_the_comparison(tmp_path, monkeypatch):
    """The habitat row: the real run's frames/s, its fault and evaluation rows, and the backends'
    comparison when its raw file is beside the run's; the conditions name habitat-sim's version."""
    import json

    from benchmarks import headline

    facts = {"cores": 2, "load": 1.0, "load_end": 2.0, "date": "2026-11-27T22:00:00",
             "commit": "abc1234", "dirty": False,
             "config": {"kill_at": 16, "habitat_sim": {"version": "0.3.3", "path": "/x"}}}
    update = lambda t, frames: {"t": t, "frames": frames}
    run = {"facts": facts, "setup": {"ranks": 2, "envs": 4},
           "train": {"frames": 6144, "median_fps": 260.5, "fault": {"worker": 1},
                     "before": [update(0, 128), update(10, 528)],
                     "after": [update(100, 2048), update(110, 2448)],
                     "updates_redone": 0, "fault_to_first_update_s": 80.5},
           "eval": {"rows": [{}, {}, {}]}}
    monkeypatch.setattr(headline, "RESULTS", tmp_path)
    cond, result = headline.render_habitat(run)
    assert cond.startswith("habitat-sim 0.3.3 built from source (llvmpipe), 2 ranks x 4 env")
    assert result == ("6,144 frames, 40.0 frames/s over the training time (260 in the median "
                      "update, between scene switches); an env worker "
                      "SIGKILLed at update 16: one line, exit status 5, relaunched by the "
                      "supervisor, 0 updates redone, 80.5 s to the next update; "
                      "`--all-checkpoints`: 3 rows")
    (tmp_path / "habitat_compare.json").write_text(json.dumps({
        "geodesic": {"episodes": 50, "ratio_median": 0.99}, "depth": {"median_m": 3e-6}}))
    assert headline.render_habitat(run)[1].endswith(
        "; against the embedded simulator on 50 val episodes: geodesic ratio median 0.990, depth "
        "median abs diff 0.003 mm")


def test_the_update_benchmark_times_another_checkouts_code_when_asked(tmp_path):
    """ppo_update.py --code DIR: wagma_rl comes from DIR (an older commit's worktree), not from
    the editable install, whose import hook would otherwise answer first."""
    (tmp_path / "wagma_rl").mkdir()
    (tmp_path / "wagma_rl" / "__init__.py").write_text("OLD = True\n")
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import ppo_update, wagma_rl; "
            "assert not hasattr(wagma_rl, 'OLD'); ppo_update.use_checkout(sys.argv[1]); "
            "import wagma_rl; print(wagma_rl.OLD, wagma_rl.__file__)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", str(tmp_path / "wagma_rl" / "__init__.py")]


def test_train_speed_compares_each_round_and_the_medians_of_the_last_lines():
    from benchmarks import train_speed

    log = ("2026-11-28 01:00:00 update=5 frames=2560 fps=300.5 collect_s=0.2\n"
           "2026-11-28 01:00:05 update=10 frames=5120 fps=410.0\nstopped: nothing\n")
    assert train_speed.fps_lines(log) == [300.5, 410.0]
    runs = [{"round": 0, "code": "old", "fps": [100.0, 200.0, 300.0, 400.0]},
            {"round": 0, "code": "new", "fps": [500.0, 600.0, 700.0, 800.0]},
            {"round": 1, "code": "old", "fps": [300.0, 300.0, 300.0]},
            {"round": 1, "code": "new", "fps": [150.0, 150.0, 150.0]}]
    summary = train_speed.summarize(runs, ["old", "new"], last=3)
    # Round 1: medians 300 and 700 of the last three lines; round 2: 300 and 150.
    assert summary["ratio_per_round"] == [2.33, 0.5]
    # Over every counted line: 300 of (200, 300, 400, 300, 300, 300); (150 + 600) / 2.
    assert summary["median_fps"] == {"old": 300.0, "new": 375.0}
    assert summary["ratio_of_medians"] == 1.25
    text = train_speed.table(runs, ["old", "new"], summary, last=3)
    assert text.splitlines()[2] == "| 1 | 200, 300, 400 | 600, 700, 800 | 2.33 |"
    assert text.splitlines()[-1] == "| median of the lines | 300 | 375 | 1.25 |"


def test_train_speed_refuses_a_folder_that_is_not_a_checkout(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/train_speed.py", "--code", str(tmp_path),
                          "--code", str(ROOT)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert f"{tmp_path} has no run_ddppo.py: --code takes a checkout" in out.stderr


def test_the_mode_comparison_takes_success_at_every_update_from_the_trace(tmp_path):
    """modes.learning_curves: the trace's point at every update where an episode had ended, in
    every mode; TensorBoard's points only for a run traced without the episode columns."""
    from types import SimpleNamespace

    from wagma_rl.rl.trace import TraceWriter

    w = TraceWriter(tmp_path, rank=0, num_steps=8)
    sync = SimpleNamespace(comm_s=0.0, wait_s=0.0, staleness=0.0, stale=0, late=False,
                           preempted=False, synced=False, group=())
    for u, (count, success, spl) in enumerate([(0, 0.0, 0.0), (2, 1.0, 0.5), (4, 3.0, 2.0)]):
        window = SimpleNamespace(sums=lambda c=count, s=success, p=spl: [c, 0.0, s, p, 0.0])
        w.add(u, collect_s=1.0, update_s=0.5, steps=8, sync=sync, frames=32, episodes=window)
    w.close()
    logged = {"metrics/success": [(96, 0.75)], "metrics/spl": [(96, 0.5)],
              "perf/wall_s": [(96, 4.5)]}
    succ, spl, wall, source = modes.learning_curves(tmp_path, logged)
    assert (source, succ, spl) == ("trace", [(64, 0.5), (96, 0.75)], [(64, 0.25), (96, 0.5)])
    assert [v for _, v in wall] == [0.5, 0.75]
    (tmp_path / "trace" / "rank_00000.csv").write_text(
        "update,time,collect_s,steps,num_steps,update_s,comm_s,wait_s,staleness,stale,late,"
        "preempted,synced,group\n0,100.0,1.0,8,8,0.5,0.0,0.0,0,0,0,0,1,\n")
    assert modes.learning_curves(tmp_path, logged) == (
        [(96, 0.75)], [(96, 0.5)], [(4.5, 0.75)], "tensorboard")


def test_the_mode_comparison_gives_each_seeds_seconds_to_each_success_level():
    runs = {"allreduce": [{"to_success": {"0.25": [100, 40.0], "0.5": [200, 60.0],
                                          "0.75": [None, None]}}],
            "wagma": [{"to_success": {"0.25": [100, 20.0], "0.5": [220, 30.0],
                                      "0.75": [300, 45.5]}}]}
    lines = modes.time_to_table(runs).splitlines()
    assert lines[0] == ("| seed | allreduce: s to success 0.25 / 0.5 / 0.75 | wagma: s to success "
                        "0.25 / 0.5 / 0.75 | allreduce / wagma to 0.5 |")
    assert lines[2] == "| 1 | 40 / 60 / - | 20 / 30 / 46 | 2.00x |"
    # --levels 0.25 0.5 0.75 0.8 (issue 30's 0.8): a column more, the ratio still at 0.5
    runs["allreduce"][0]["to_success"]["0.8"] = [None, None]
    runs["wagma"][0]["to_success"]["0.8"] = [320, 50.0]
    lines = modes.time_to_table(runs, levels=(0.25, 0.5, 0.75, 0.8)).splitlines()
    assert lines[0].endswith(
        "wagma: s to success 0.25 / 0.5 / 0.75 / 0.8 | allreduce / wagma to 0.5 |")
    assert lines[2] == "| 1 | 40 / 60 / - / - | 20 / 30 / 46 / 50 | 2.00x |"
    assert modes.parse_args(["--levels", "0.5", "0.8"]).levels == (0.5, 0.8)
    assert modes.first_at([(10, 0.1), (20, 0.5), (30, 0.4)], 0.5) == 20
    assert modes.first_at([(10, 0.1)], 0.5) is None


def test_a_resummary_reads_the_runs_again_and_keeps_the_measuring_runs_facts(
        tmp_path, monkeypatch):
    """--resummarize RAW trains nothing; the raw file it rewrites keeps RAW's facts (dates and
    loads of the measuring run) and notes the re-reading beside them."""
    import json

    def no_training(*args, **kwargs):
        raise AssertionError("a resummary trained")

    curve = [(0.0, 0.0), (1000.0, 0.6)]
    summary = {"frames": 1000.0, "wall_s": 10.0, "fps": 100.0, "collect_s": 1.0, "update_s": 0.1,
               "comm_s": 0.01, "wait_s": 0.2, "success": 0.6, "spl": 0.5, "success_mean": 0.3,
               "rollout_min": 64, "to_success": {"0.25": [1000.0, 9.0], "0.5": [1000.0, 9.0],
                                                 "0.75": [None, None]},
               "series": {"success": curve, "success_wall": curve}}
    monkeypatch.setattr(modes, "run_mode", no_training)
    monkeypatch.setattr(modes, "summarize", lambda run_dir, levels: dict(summary))
    out = tmp_path / "t.md"
    measured = {"date": "2026-11-28T01:00:00+00:00", "date_end": "2026-11-28T01:10:00+00:00",
                "load_end": 1.5, "commit": "abc1234"}
    out.with_suffix(".json").write_text(json.dumps({"facts": measured, "per_seed": {}}))
    for mode in ("allreduce", "wagma"):  # the folders the measuring run left
        (tmp_path / "runs" / "4r" / f"{mode}_s1" / "trace").mkdir(parents=True)
    assert modes.main(["--modes", "allreduce", "wagma", "--runs", str(tmp_path / "runs"),
                       "--out", str(out), "--resummarize", str(out.with_suffix(".json"))]) == 0
    raw = json.loads(out.with_suffix(".json").read_text())
    assert {k: raw["facts"][k] for k in measured} == measured
    assert set(raw["facts"]["resummarized"]) == {"date", "commit", "dirty", "command"}
    assert raw["per_seed"]["4"]["own"]["wagma"][0]["to_success"]["0.5"] == [1000.0, 9.0]
    assert "| 1 | 9 / 9 / - | 9 / 9 / - | 1.00x |" in out.read_text()


def test_a_resummary_without_its_raw_file_or_runs_says_so_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/modes.py", "--resummarize",
                          str(tmp_path / "none.json")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "no such raw file" in out.stderr.strip().splitlines()[-1]
    (tmp_path / "raw.json").write_text('{"facts": {}}')
    out = subprocess.run([sys.executable, "benchmarks/modes.py", "--resummarize",
                          str(tmp_path / "raw.json"), "--runs", str(tmp_path / "runs"),
                          "--modes", "wagma"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        f"benchmarks/modes.py: error: --resummarize: {tmp_path / 'runs' / '4r' / 'wagma_s1'} "
        f"holds no run; give the --runs and the options of the run that made "
        f"{tmp_path / 'raw.json'}"]
