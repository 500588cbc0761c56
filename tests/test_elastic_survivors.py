"""The elastic supervisor and the survivors' loss record (wagma_rl.elastic; the other cases are in
tests/test_elastic.py): the supervisor acts on a record as soon as it decides (no other side's
record could go on instead), with ``grace`` as the bound for one that another side could still
overrule (``records_settled``); a supervised job rescues its last evaluation on the heartbeat
verdict, as the RL trainer does (Job.rescue from the heartbeat thread; docs/faults.md)."""
from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Callable

import pytest

from mpi_launch import REPO, Running, mpiexec_path
from wagma_rl.elastic.supervisor import Launcher, Supervisor, records_settled


def _supervise(tmp_path: Path, argv: list[str], **options) -> Supervisor:
    """A supervisor of ``argv`` on 2 ranks of this host (its lines in ``sup.lines``)."""
    lines: list[str] = []
    sup = Supervisor(Launcher([mpiexec_path()]), {"localhost": 2}, argv,
                     state_dir=tmp_path / "el", say=lines.append, **options)
    sup.lines = lines
    return sup


def _running(sup: Supervisor, shown: Callable[[], str] = lambda: "") -> Running:
    """``sup.run()`` on a thread of its own; a failed wait kills the launch it is in and fails
    with what the supervisor said and ``shown()``."""
    return Running(call=sup.run, group=lambda: sup._proc.pid if sup._proc is not None else None,
                   context=lambda: f"the supervisor said {sup.lines}, events {sup.events}\n"
                                   f"{shown()}")


def _record(survivors: list[int], lost: list[int]) -> dict:
    return {"survivors": survivors, "lost": [{"rank": r, "host": "h", "pid": 1} for r in lost]}


@pytest.mark.parametrize("survivors,lost,dead,settled", [
    ([0, 2], [1], [], True),          # the larger side: a record of rank 1 alone cannot win
    ([0], [1], [], True),             # as many, and the lower rank: rank 0's side goes on
    ([1], [0], [], False),            # rank 0 could write one for its side, which goes on
    ([1], [0], [0], True),            # ... unless its heartbeat says it is dead
    ([2, 3], [0, 1], [], False),      # a split 2 | 2: ranks 0 and 1 could write theirs
    ([2, 3], [0, 1], [1], True),      # one of them dead: their side holds fewer ranks
    ([3], [0, 1, 2], [0, 1], False),  # rank 2 alone could still go on (as many, lower)
    ([], [0], [], False),             # (a record naming no survivor decides nothing)
])
def test_a_loss_record_decides_when_no_other_side_could_go_on_instead(survivors, lost, dead,
                                                                       settled):
    assert records_settled(_record(survivors, lost), dead) is settled


def test_a_decisive_loss_record_ends_the_launch_at_once_not_after_the_grace(tmp_path,
                                                                            monkeypatch):
    # The fake job's rank 0 records rank 1 (hung, beating) lost and exits 3; rank 1 would hang
    # for 600 s. With a grace of 60 s the supervisor ends the launch on reading the record.
    monkeypatch.chdir(REPO)
    sup = _supervise(tmp_path, [sys.executable, "tests/programs/elastic_fake_job.py", "lose",
                                str(tmp_path / "run")], grace=60)
    assert _running(sup).result(50) == 0, sup.lines
    loss = [e for e in sup.events if e["event"] == "loss"]
    assert [(e["ranks"], e["acted"]) for e in loss] == [([1], "at once")], sup.events
    assert [e["ranks"] for e in sup.events if e["event"] == "launch"] == [2, 1]


@pytest.mark.mpi
def test_a_supervised_job_told_of_a_stopped_rank_goes_on_from_its_last_evaluation(tmp_path,
                                                                                   monkeypatch):
    # 2 ranks on this host, at least 0.1 s a step; rank 1 stops (SIGSTOP) once a checkpoint is
    # written. optim.timeout is far off, so only the verdict (2 s without a beat) reaches rank 0,
    # waiting in the optimizer's average: its heartbeat thread saves the last evaluation, records
    # the loss, and the relaunch on 1 rank goes on from that evaluation, nothing redone.
    monkeypatch.chdir(REPO)
    run_dir, steps = tmp_path / "run", 60
    sup = _supervise(tmp_path, [
        sys.executable, "-m", "wagma_rl.supervised", "--config", "configs/resnet_shapes.yaml",
        "data.image_size=8", "model.width=4", "data.train_size=256", "data.val_size=128",
        "train.batch_size=8", f"train.steps={steps}", "train.eval_every=5",
        "run.checkpoint_interval=10", "run.log_interval=5", f"run.dir={run_dir}",
        "optim.timeout=300", "heterogeneity.stall_s=0.1", "heterogeneity.stall_prob=1.0"],
        dead_after=2, grace=10)
    log = run_dir / "log.txt"
    text = lambda: log.read_text() if log.exists() else ""  # noqa: E731
    running = _running(sup, shown=lambda: text()[-3000:])
    running.wait_for_line(r"checkpoint \S+", text, 90)
    os.kill(int((tmp_path / "el" / "beat_1_rank1").read_text().split()[3]), signal.SIGSTOP)
    assert running.result(90) == 0, sup.lines
    text = log.read_text()
    kinds = [(e["event"], e.get("ranks")) for e in sup.events]
    assert kinds == [("launch", 2), ("loss", [1]), ("launch", 1)], (sup.events, text[-3000:])
    saved = re.search(r"rank 1 \(host \S+, pid \d+\): no heartbeat \(found dead by the elastic "
                      r"supervisor\)\. The survivors saved the state of the last synchronised "
                      r"evaluation \(step (\d+), (\d+) samples\) to (\S+):", text)
    assert saved, text[-3000:]
    step = int(saved.group(1))
    assert Path(sup.events[1]["checkpoint"]).name == Path(saved.group(3)).name
    assert re.search(rf"resumed from \S+{Path(saved.group(3)).name} at step {step}\b", text), \
        text[-3000:]
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(5, steps + 1, 5))  # each evaluation once
