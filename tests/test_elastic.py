"""The elastic supervisor and the job's side of it (wagma_rl.elastic) without a cluster: records,
launch generations, heartbeats and their verdicts, the watchdog, the run lock across relaunches,
crashes, flapping hosts, the rolling budget (fake jobs under mpiexec on this host), the real trainer
told of a stopped rank, and a supervised job. The cases on namespaced nodes are in
tests/test_elastic_nodes.py.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mpi_launch import REPO, Running, mpi_env, mpiexec_path
from run_log import assert_counters_exact
from wagma_rl.config import load_config
from wagma_rl.elastic import read_losses
from wagma_rl.elastic import heartbeat
from wagma_rl.elastic.heartbeat import Liveness
from wagma_rl.elastic.supervisor import (Launcher, Supervisor, SupervisorError, _GiveUp,
                                         parse_hosts)
from wagma_rl.rl.config import DDPPOConfig

QUICK = "configs/quick_pointnav.yaml"
_quick = load_config(DDPPOConfig, REPO / QUICK)
STEP_FRAMES = _quick.ppo.num_steps * _quick.env.num_envs  # per rank and update
TIMEOUT = 10  # (start-up on 2 loaded cores takes several seconds: 5 s was seen to be too short)


# ------------------------------------------------------------------------ without a cluster
def test_hosts_parse_into_slots_and_bad_ones_are_named():
    assert parse_hosts("n0,n1", 2) == {"n0": 2, "n1": 2}
    assert parse_hosts("n0:3,n1", 1) == {"n0": 3, "n1": 1}
    with pytest.raises(SupervisorError, match="HOST:COUNT"):
        parse_hosts("n0:x", 1)
    with pytest.raises(SupervisorError, match="names no host"):
        parse_hosts(",", 1)


def test_the_launch_places_ranks_host_by_host(tmp_path):
    hydra = Launcher(["mpiexec", "-launcher", "ssh"])
    cmd = hydra.command({"n0": 2, "n1": 1, "n2": 0}, ["python", "x.py"], tmp_path / "hosts")
    assert cmd == ["mpiexec", "-launcher", "ssh", "-disable-auto-cleanup", "-hosts", "n0:2,n1:1",
                   "-n", "3", "python", "x.py"]
    srun = Launcher(["srun", "--mpi=pmi2"], kind="srun")
    cmd = srun.command({"a": 1, "b": 2}, ["python", "x.py"], tmp_path / "hosts")
    assert "--ntasks=3" in cmd and "--distribution=arbitrary" in cmd and "--nodes=2" in cmd
    assert "--no-kill" in cmd  # a failed node does not end the step: the survivors save first
    assert (tmp_path / "hosts").read_text() == "a\nb\nb\n"


def test_open_mpis_mpirun_is_told_from_its_version_and_gets_the_records_variables(tmp_path):
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 5.0.11'\n")
    fake.chmod(0o755)
    ompi = Launcher.detect([str(fake), "--with-ft", "ulfm"])
    assert ompi.kind == "openmpi" and Launcher.detect([mpiexec_path()]).kind == "mpiexec"
    assert Launcher.detect([str(tmp_path / "absent")]).kind == "mpiexec"  # (said at the launch)
    cmd = ompi.command({"n0": 2, "n1": 1, "n2": 0}, ["python", "x.py"], tmp_path / "hosts")
    # PRRTE hands the ranks on other nodes only the variables named with -x.
    assert cmd == [str(fake), "--with-ft", "ulfm", "--host", "n0:2,n1:1", "--map-by", "slot",
                   "-x", "WAGMA_ELASTIC_DIR", "-x", "WAGMA_ELASTIC_LAUNCH", "-x",
                   "WAGMA_ELASTIC_BEAT", "-n", "3", "python", "x.py"]
    assert ompi.probe("n1") == [str(fake), "--with-ft", "ulfm", "--host", "n1:1", "-n", "1", "true"]
    ompi.probe_with_srun = True  # (--slurm: the allocation's nodes are tried through SLURM)
    assert ompi.probe("n1") == ["srun", "--overlap", "--nodelist=n1", "--nodes=1", "--ntasks=1",
                                "true"]


def test_the_side_with_more_survivors_then_rank_0_goes_on(tmp_path):
    from wagma_rl.elastic import write_loss

    write_loss(writer=2, world_size=4, lost=[{"rank": 0}, {"rank": 1}], checkpoint="b",
               update=1, frames=1, why="", folder=tmp_path)
    write_loss(writer=0, world_size=4, lost=[{"rank": 2}, {"rank": 3}], checkpoint="a",
               update=1, frames=1, why="", folder=tmp_path)
    assert [r["writer"] for r in read_losses(tmp_path)] == [0, 2]
    write_loss(writer=1, world_size=4, lost=[{"rank": 3}], checkpoint="c", update=1, frames=1,
               why="", folder=tmp_path)
    assert read_losses(tmp_path)[0]["writer"] == 1


def test_a_launcher_that_is_not_there_is_one_line_and_a_setup_error(tmp_path):
    # Exit 2 (the config code): nothing was launched, so no rank was lost (3 would say one was).
    proc = subprocess.run([sys.executable, "-m", "wagma_rl.elastic", "--launcher", "no-such-mpiexec",
                           "--hosts", "localhost", "--state-dir", str(tmp_path), "--", "true"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "python -m wagma_rl.elastic: error: cannot start the launcher 'no-such-mpiexec'"), proc.stderr


def test_a_job_that_stops_for_a_configuration_error_is_not_relaunched(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    lines = []
    sup = Supervisor(Launcher([mpiexec_path()]), {"localhost": 2},
                     [sys.executable, "run_ddppo.py", "--config", QUICK, "ppo.lr=-1",
                      f"run.dir={tmp_path / 'run'}"], state_dir=tmp_path / "el", say=lines.append)
    assert sup.run() == 2
    assert [e["event"] for e in sup.events] == ["launch"]
    assert "configuration error" in lines[-1] and "not relaunched" in lines[-1]
    # (a refused start writes no log.txt: the line points to the job's own error line)
    assert "its error line above" in lines[-1] and "log.txt" not in lines[-1]
    assert not (tmp_path / "run" / "log.txt").exists()


def test_a_rank_is_dead_when_its_beat_stops_not_when_it_ended_or_belongs_to_another_launch(tmp_path):
    def beat(launch, rank, count, state="alive"):
        (tmp_path / f"beat_{launch}_rank{rank}").write_text(f"{count} {state} n{rank} {100 + rank}\n")

    live = Liveness(tmp_path, 2)
    for rank in range(3):
        beat(2, rank, 1)
    beat(1, 3, 1)  # a rank of launch 1
    live.poll(now=0.0)
    beat(2, 0, 2)
    beat(2, 2, 2, "ended")
    live.poll(now=4.0)
    assert sorted(live.seen) == [0, 1, 2]
    assert live.dead(5.0, now=4.9) == [] and live.dead(5.0, now=5.0) == [1]
    assert live.dead(5.0, now=9.0) == [0, 1]  # (2 ended: never dead)
    assert live.silent(0, now=8.0) == 4.0 and live.silent(2, now=8.0) is None
    assert live.quiet_for(now=8.0) == 4.0
    assert live.describe(1) == "rank 1 (host n1, pid 101)"


def test_a_rank_beats_from_its_import_and_its_multiprocessing_children_do_not(tmp_path):
    env = dict(mpi_env(60), WAGMA_ELASTIC_DIR=str(tmp_path), WAGMA_ELASTIC_LAUNCH="4",
               WAGMA_ELASTIC_BEAT="0.1", PMI_RANK="3")
    code = ("import multiprocessing as mp, os, time\n"
            "import wagma_rl.elastic\n"
            "if __name__ == '__main__':\n"
            "    child = mp.get_context('spawn').Process(target=time.sleep, args=(1.0,))\n"
            "    child.start(); child.join()\n"
            "    print(os.getpid())\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    count, state, host, pid = (tmp_path / "beat_4_rank3").read_text().split()
    assert int(count) >= 5 and state == "ended" and int(pid) == int(proc.stdout)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beat_4_rank3"]


def test_the_verdict_reaches_each_survivors_callbacks_once_and_not_the_dead_rank(tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setattr(heartbeat, "_on_dead", [])
    calls = []
    heartbeat.on_dead(calls.append)
    take_back = heartbeat.on_dead(lambda ranks: calls.append(("second", ranks)))
    survivor, dead = (heartbeat._Beat(tmp_path / f"beat_3_rank{r}", interval=1,
                                      verdict=tmp_path / "dead_3.json", rank=r) for r in (0, 2))
    survivor.check_verdict()
    assert calls == []  # no verdict yet
    heartbeat.write_dead(tmp_path, 3, [2])
    take_back()
    for beat in (survivor, dead, survivor):
        beat.check_verdict()
    assert calls == [[2]]
    # The job went on in place without rank 2; a later verdict in the same launch names rank 1
    # (with 2 again, or alone): only the rank not told before is passed on.
    time.sleep(0.01)  # (a new modification time)
    heartbeat.write_dead(tmp_path, 3, [1, 2])
    survivor.check_verdict()
    survivor.check_verdict()
    assert calls == [[2], [1]]



@pytest.fixture
def quick_run(tmp_path, monkeypatch):
    """The quick config's run settings with the run folder under ``tmp_path``, and no verdict
    callback registered (``heartbeat._on_dead``) but the test's own."""
    monkeypatch.setattr(heartbeat, "_on_dead", [])
    return load_config(DDPPOConfig, REPO / QUICK, [f"run.dir={tmp_path / 'run'}"]).run


def test_a_verdict_makes_the_lowest_survivor_rescue_once_from_the_heartbeat_thread(tmp_path,
                                                                                 quick_run):
    # The Job registers for the verdict: the heartbeat thread saves (job.rescue) and writes the
    # stop line while the main thread still waits; the main thread's own timeout later rescues
    # nothing twice and carries the line; the job's end takes the callback back.
    from mpi4py import MPI

    from wagma_rl.job import Job
    from wagma_rl.bounded_comm import Peer, PeerTimeout

    rescued: list = []

    def rescue(exc):
        rescued.append((exc.ranks, exc.what, threading.current_thread().name))
        exc.recorded, exc.rescued = True, f"{exc}. saved update 6"
        return exc.rescued
    later = PeerTimeout("statistics reduction: rank 1 did not answer", [Peer(1, "h", 9)])
    with pytest.raises(PeerTimeout) as raised:
        with Job(MPI.COMM_SELF, run=quick_run, timeout=5) as job:
            job.open_log(tensorboard=False)
            job.rescue = rescue
            heartbeat.write_dead(tmp_path, 3, [1])
            beat = heartbeat._Beat(tmp_path / "beat_3_rank0", interval=1,
                                   verdict=tmp_path / "dead_3.json", rank=0)
            thread = threading.Thread(target=beat.check_verdict, name="beat")
            thread.start()
            thread.join(30)
            assert rescued == [((1,), "heartbeat", "beat")]
            raise later
    assert rescued == [((1,), "heartbeat", "beat")]  # not again for the main thread's timeout
    assert raised.value.recorded and raised.value.rescued.endswith("saved update 6")
    stops = [line for line in (tmp_path / "run" / "log.txt").read_text().splitlines()
             if "stopped:" in line]
    assert len(stops) == 1 and "rank 1 (host ?, pid 0): no heartbeat (found dead by the elastic "\
        "supervisor). saved update 6" in stops[0], stops
    assert heartbeat._on_dead == []


def test_after_a_shrink_in_place_a_verdict_is_read_in_the_launchs_numbering(tmp_path,
                                                                             quick_run):
    # The supervisor numbers the launch's ranks; after a shrink the job's communicator numbers
    # the survivors anew. Launch ranks 0-3, rank 1 lost in place: 0, 2, 3 are now 0, 1, 2. A
    # verdict on launch rank 1 (gone already) is no loss; one on launch rank 3 is the survivors'
    # rank 2, found by host and pid, and the lowest survivor rescues for it.
    from mpi4py import MPI

    from wagma_rl.bounded_comm import Peer
    from wagma_rl.job import Job

    rescued: list = []

    def rescue(exc):
        rescued.append(exc.ranks)
        exc.recorded = True
        return f"{exc}. saved update 6"
    launch = tuple(Peer(r, f"h{r}", 100 + r) for r in range(4))
    with Job(MPI.COMM_SELF, run=quick_run, timeout=5) as job:
        job.open_log(tensorboard=False)
        job.rescue = rescue
        job._launch_peers = launch  # (as __enter__ and shrink leave them on 4 ranks, 1 lost)
        job.deadline.peers = tuple(Peer(i, p.host, p.pid) for i, p in
                                   enumerate(p for p in launch if p.rank != 1))
        beat = heartbeat._Beat(tmp_path / "beat_3_rank0", interval=1,
                               verdict=tmp_path / "dead_3.json", rank=0)
        heartbeat.write_dead(tmp_path, 3, [1])
        beat.check_verdict()
        assert rescued == []  # the job went on without it already
        time.sleep(0.01)
        heartbeat.write_dead(tmp_path, 3, [3])
        beat.check_verdict()
        assert rescued == [(2,)]
    stops = [line for line in (tmp_path / "run" / "log.txt").read_text().splitlines()
             if "stopped:" in line]
    assert len(stops) == 1 and "rank 2 (host h3, pid 103): no heartbeat" in stops[0], stops


@pytest.mark.mpi
@pytest.mark.slow
def test_a_training_run_told_of_a_stopped_rank_goes_on_from_the_survivors_last_synchronised_state(
        tmp_path, monkeypatch):
    # The real trainer under the supervisor on this host (2 ranks, about 0.5 s per update, no
    # periodic checkpoint): rank 1 stops (SIGSTOP). averaging.timeout is far off, so only the
    # verdict (2 s without a beat) reaches rank 0, waiting in a collective: its heartbeat thread
    # saves the last synchronised update, which the relaunch goes on from, nothing redone.
    monkeypatch.chdir(REPO)
    run_dir, lines = tmp_path / "run", []
    updates = 12
    sup = Supervisor(Launcher([mpiexec_path()]), {"localhost": 2},
                     [sys.executable, "run_ddppo.py", "--config", QUICK, f"run.dir={run_dir}",
                      f"run.total_frames={updates * STEP_FRAMES * 2}", "averaging.timeout=300",
                      "run.log_interval=1", "run.checkpoint_interval=0",
                      "heterogeneity.stall_s=0.03", "heterogeneity.stall_prob=1.0"],
                     state_dir=tmp_path / "el", dead_after=2, grace=10, say=lines.append)
    sup.lines = lines
    running = _running(sup)
    log = run_dir / "log.txt"
    running.wait_for_line(r"update=[2-9] ", lambda: log.read_text() if log.exists() else "", 60)
    pid = int((tmp_path / "el" / "beat_1_rank1").read_text().split()[3])
    os.kill(pid, signal.SIGSTOP)
    assert running.result(60) == 0, lines
    text = log.read_text()
    assert _kinds(sup) == [("launch", 2), ("loss", [1]), ("launch", 1)], (sup.events, text[-3000:])
    first = text[:text.index("resumed from")]
    last_synced = int(re.findall(r"update=(\d+) ", first)[-1])
    saved = re.search(r"resumed from (\S+): update (\d+)", text)
    assert Path(saved.group(1)).name == Path(sup.events[1]["checkpoint"]).name
    assert int(saved.group(2)) == last_synced, text[-3000:]
    assert re.search(r"rank 1 \(host \S+, pid \d+\): no heartbeat \(found dead by the elastic "
                     r"supervisor\)\. The survivors saved the state of the last synchronised update "
                     rf"\(update {last_synced},", first), first[-2000:]
    assert_counters_exact(text, step_frames=STEP_FRAMES, total=updates * STEP_FRAMES * 2)


def _fake(tmp_path, mode: str, *, launcher=None, slots=None, **options) -> Supervisor:
    lines: list[str] = []
    options = {"grace": 0.5, "say": lines.append, **options}
    sup = Supervisor(launcher or Launcher([mpiexec_path()]), slots or {"localhost": 2},
                     [sys.executable, "tests/programs/elastic_fake_job.py", mode,
                      str(tmp_path / "run")], state_dir=tmp_path / "el", **options)
    sup.lines = lines
    return sup


def _run(sup: Supervisor, limit_s: float = 90):
    """``sup.run()`` bounded: past ``limit_s`` the launch is killed and the test fails with what
    the supervisor said (the ranks' output is on the test's stdout)."""
    return _running(sup).result(limit_s)


def _running(sup: Supervisor) -> Running:
    """``sup.run()`` on a thread of its own; a failed wait kills the launch it is in."""
    return Running(call=sup.run, group=lambda: sup._proc.pid if sup._proc is not None else None,
                   context=lambda: f"the supervisor said {sup.lines}, events {sup.events}")


def _kinds(sup: Supervisor) -> list:
    return [(e["event"], e.get("ranks")) for e in sup.events]


def test_a_recorded_loss_is_relaunched_without_the_lost_slot_and_the_hung_rank_ended(tmp_path,
                                                                                     monkeypatch):
    monkeypatch.chdir(REPO)
    sup = _fake(tmp_path, "lose")
    t0 = time.monotonic()
    assert _run(sup) == 0, sup.lines
    assert time.monotonic() - t0 < 60  # the hung rank did not keep the first launch alive
    assert _kinds(sup) == [("launch", 2), ("loss", [1]), ("launch", 1)], sup.events
    assert "lost rank 1 (localhost" in sup.lines[0] and "newest checkpoint" in sup.lines[0]
    # The hung rank was beating: the survivors' timeout decided, and the line says so.
    assert "alive but slow" in sup.lines[0], sup.lines
    assert not (tmp_path / "el").exists()  # its records are gone with it


class _DeadHost(Launcher):
    """Hydra starting every "host" on this machine (-launcher fork), where host "b" is dead."""

    def probe(self, host: str) -> list[str]:
        return ["false"] if host == "b" else super().probe(host)


def test_a_job_that_went_on_in_place_keeps_its_launch_and_gives_the_slot_back_later(tmp_path,
                                                                                    monkeypatch):
    # Rank 2 dies and the job records that it went on without it (as an Open MPI job that shrank
    # names it: by host and pid, with a rank of its own communicator). The supervisor takes the
    # slot out, expects no more beats of rank 2 (no dead verdict past --dead-after 2 s), and
    # lets the launch finish.
    monkeypatch.chdir(REPO)
    sup = _fake(tmp_path, "in_place", slots={"localhost": 3}, dead_after=2, rejoin_after=1000)
    assert _run(sup) == 0, sup.lines
    assert _kinds(sup) == [("launch", 3), ("in_place", [2])], sup.events
    assert sup.slots == {"localhost": 2} and "localhost" in sup.out_since
    assert re.match(r"the job went on in place without rank 2 \(localhost\) .*: no relaunch",
                    sup.lines[0]), sup.lines
    assert len(sup.lines) == 1, sup.lines  # no verdict on the rank it went on without


def test_a_launch_that_ended_with_no_record_goes_on_on_the_hosts_that_answer(tmp_path,
                                                                             monkeypatch):
    monkeypatch.chdir(REPO)
    sup = _fake(tmp_path, "die", launcher=_DeadHost([mpiexec_path(), "-launcher", "fork"]),
                slots={"a": 1, "b": 1}, probe_timeout=20, rejoin_after=1000)
    assert _run(sup) == 0, sup.lines
    assert [e["event"] for e in sup.events] == ["launch", "restart", "launch"], sup.events
    assert sup.events[1]["hosts_out"] == ["b"] and sup.events[2]["ranks"] == 1
    assert "b did not answer" in sup.lines[0] and "newest checkpoint" in sup.lines[0], sup.lines


def test_every_host_is_probed_and_each_verdict_is_its_own(tmp_path):
    sup = _fake(tmp_path, "die", launcher=_DeadHost([mpiexec_path(), "-launcher", "fork"]),
                probe_timeout=20)
    assert sup._probe(["a", "b", "c"]) == {"a": True, "b": False, "c": True}


def test_survivors_that_could_not_save_their_state_go_on_from_the_newest_checkpoint(tmp_path,
                                                                                   monkeypatch):
    monkeypatch.chdir(REPO)
    sup = _fake(tmp_path, "state_error")
    assert _run(sup) == 0, sup.lines
    assert _kinds(sup) == [("launch", 2), ("loss", [1]), ("launch", 1)], sup.events
    assert re.search(r"could not save their state \(.*No space left.*\): going on from the "
                     "newest checkpoint", sup.lines[0]), sup.lines


def test_a_late_loss_record_of_an_earlier_launch_does_not_stop_the_next_one(tmp_path,
                                                                            monkeypatch):
    monkeypatch.chdir(REPO)
    sup = _fake(tmp_path, "late")
    assert _run(sup) == 0, sup.lines  # (the job exits 5 if the late record never came)
    assert _kinds(sup) == [("launch", 2), ("loss", [1]), ("launch", 1), ("stale", None)], sup.events
    assert "ignored loss_rank0.json from launch 1 (this is launch 2)" in sup.lines[1], sup.lines


def test_a_silent_rank_is_dead_within_seconds_without_the_survivors_timeout(tmp_path,
                                                                           monkeypatch):
    # Ranks 1 and 2 stop (SIGSTOP), 0.5 s apart; rank 0 waits for them, beating, and would wait
    # out averaging.timeout. The first verdict names rank 1 (and rank 2 too where the machine's
    # load delayed the supervisor's look past rank 2's 2 s), the end of the grace both.
    monkeypatch.chdir(REPO)
    sup = _fake(tmp_path, "silent", slots={"localhost": 3}, dead_after=2, grace=2)
    assert _run(sup) == 0, sup.lines
    assert _kinds(sup) == [("launch", 3), ("dead", [1, 2]), ("launch", 1)], sup.events
    assert re.match(r"rank 1 \(host \S+, pid \d+\)(, rank 2 \(host \S+, pid \d+\))?: no heartbeat "
                    r"for 2 s \(--dead-after\): dead", sup.lines[0]), sup.lines
    assert re.match(r"rank 1 \(.*\), rank 2 \(.*\): no heartbeat .* going on from the newest "
                    r"checkpoint; relaunching on 1 rank \(", sup.lines[1]), sup.lines
    dead = sup.events[1]
    assert dead["at"] - sup.events[0]["at"] < 30  # seconds, not the 300 s default timeout


def test_a_job_told_of_a_dead_rank_saves_and_records_it_before_the_grace_ends(tmp_path,
                                                                             monkeypatch):
    # As above, but rank 0 registered for the verdict (heartbeat.on_dead): its heartbeat thread
    # records the loss with the survivors' state while its main thread still waits.
    monkeypatch.chdir(REPO)
    sup = _fake(tmp_path, "told", dead_after=2, grace=5)
    assert _run(sup) == 0, sup.lines
    assert _kinds(sup) == [("launch", 2), ("loss", [1]), ("launch", 1)], sup.events
    assert sup.events[1]["checkpoint"] == "ckpt_6.pt"
    assert re.search(r"lost rank 1 \(localhost; dead: no heartbeat for \d+ s\) \(found by rank 0\); "
                     r"the survivors saved update 6", sup.lines[1]), sup.lines


def test_a_launch_whose_record_meets_a_full_disk_is_ended_by_the_watchdog(tmp_path,
                                                                          monkeypatch):
    # Rank 1 stops; rank 0 cannot write its loss record (disk full), says so and exits 3. The
    # stopped rank would keep the launcher waiting for ever: the watchdog ends the launch.
    monkeypatch.chdir(REPO)
    sup = _fake(tmp_path, "disk_full", dead_after=1000, watchdog=3)
    assert _run(sup) == 0, sup.lines
    assert [e["event"] for e in sup.events] == ["launch", "restart", "launch"], sup.events
    assert re.match(r"no progress: no rank of launch 1 has beaten for \d+ s and none recorded why",
                    sup.lines[0]), sup.lines
    assert "every host answers" in sup.lines[1] and "newest checkpoint" in sup.lines[1], sup.lines


def test_a_run_lock_still_held_by_an_earlier_launch_is_waited_for_not_a_config_error(tmp_path,
                                                                                     monkeypatch):
    monkeypatch.chdir(REPO)
    sup = _fake(tmp_path, "lock", lock_wait=60)
    assert _run(sup) == 0, sup.lines
    assert [e["event"] for e in sup.events] == ["launch", "loss", "launch", "lock_wait", "launch"], \
        sup.events
    assert re.search(r"the run lock .*\.lock is still held \(host \S+, pid \d+: a rank of an "
                     r"earlier launch", " ".join(sup.lines)), sup.lines
    assert 0 < sup.events[3]["waited"] < 60


def test_a_crash_is_relaunched_a_bounded_number_of_times(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    sup = _fake(tmp_path, "crash", slots={"localhost": 1})
    assert _run(sup) == 0, sup.lines
    assert [e["event"] for e in sup.events] == ["launch", "crash", "launch"], sup.events
    assert "the job crashed (exit status 1) (1 of --max-crashes 2): going on from the newest " \
        "checkpoint on the same hosts" in sup.lines[0], sup.lines
    sup = _fake(tmp_path, "crash", slots={"localhost": 1}, max_crashes=0)
    assert _run(sup) == 1
    assert "not relaunched" in sup.lines[-1] and "--max-crashes 0" in sup.lines[-1], sup.lines


def test_a_failed_environment_worker_is_relaunched_on_the_same_hosts_not_taken_out(tmp_path,
                                                                                   monkeypatch):
    # Rank 1's simulator fails (exit 5, its record says so); rank 0 reports rank 1 lost. The host
    # is fine: the relaunch keeps both slots and quarantines nothing, counted as a crash.
    monkeypatch.chdir(REPO)
    sup = _fake(tmp_path, "env")
    assert _run(sup) == 0, sup.lines
    assert _kinds(sup) == [("launch", 2), ("crash", None), ("launch", 2)], sup.events
    assert sup.losses == {} and not sup.excluded
    assert "the environment worker of rank(s) 1 failed (1 of --max-crashes 2): going on from " \
        "the newest checkpoint on the same hosts" in sup.lines[-1], sup.lines


def test_a_rank_whose_environment_worker_failed_is_dead_at_once_not_after_its_silence(
        tmp_path, monkeypatch):
    # Rank 1 records its simulator's failure and exits 5; rank 0 waits for the supervisor's
    # verdict (as a survivor in a collective does). With --dead-after 60 the heartbeats would
    # take a minute; the record makes the verdict at once, naming why.
    monkeypatch.chdir(REPO)
    sup = _fake(tmp_path, "env_told", dead_after=60)
    start = time.monotonic()
    assert _run(sup) == 0, sup.lines
    assert time.monotonic() - start < 45, sup.lines
    assert _kinds(sup) == [("launch", 2), ("crash", None), ("launch", 2)], sup.events
    said = " ".join(sup.lines)
    assert re.search(r"rank 1( \(host \S+, pid \d+\))?: its environment worker failed \(the rank "
                     r"recorded it and exits with status 5\): dead", said), sup.lines
    assert "no heartbeat" not in said, sup.lines


def test_a_flapping_host_waits_twice_as_long_each_time_then_is_excluded(tmp_path, monkeypatch):
    # Five losses of host b's rank; each time b answers again after its quarantine (0.2 s, doubled
    # at every loss) and rejoins, until the fifth loss excludes it and the job finishes on a.
    monkeypatch.chdir(REPO)
    sup = _fake(tmp_path, "flap", launcher=Launcher([mpiexec_path(), "-launcher", "fork"]),
                slots={"a": 1, "b": 1}, rejoin_after=0.2, max_flaps=5)
    assert _run(sup, 150) == 0, sup.lines
    events = [e["event"] for e in sup.events]
    assert events == ["launch", "loss", "launch", "rejoin"] * 4 + \
        ["launch", "loss", "excluded", "launch"], sup.events
    assert sup.losses == {"b": 5} and sup.excluded == {"b"}
    assert sup.quarantine["b"] == 0.2 * 2 ** 3  # the fourth loss's quarantine
    assert "b was lost 5 times (--max-flaps 5): excluded" in " ".join(sup.lines), sup.lines


def test_the_relaunch_budget_rolls_over_its_window(tmp_path):
    sup = _fake(tmp_path, "lose", max_relaunches=2, relaunch_window=100)
    sup.charged = [(time.time() - 101, "a loss")] * 5  # out of the window: not counted
    sup._charge("a loss")
    sup._charge("a loss")
    with pytest.raises(_GiveUp):
        sup._charge("a loss")
    assert "gave up: 3 relaunches within 100 s" in sup.lines[-1], sup.lines


def test_a_supervised_job_goes_on_without_a_stopped_rank_and_takes_it_back(tmp_path):
    """The same supervisor and exit policy for `python -m wagma_rl.supervised` (2 ranks on this
    host): the survivor records the loss, the job goes on alone from its newest checkpoint, and
    runs on both ranks again once the host answers."""
    run_dir = tmp_path / "run"
    steps = 120
    argv = [sys.executable, "-m", "wagma_rl.elastic", "--launcher", mpiexec_path(),
            "--hosts", "localhost", "--ppn", "2", "--rejoin-after", "8", "--state-dir", str(tmp_path / "elastic"), "--",
            sys.executable, "-m", "wagma_rl.supervised", "--config", "configs/resnet_shapes.yaml",
            "data.image_size=8", "model.width=4", "data.train_size=256", "data.val_size=128",
            "train.batch_size=8", f"train.steps={steps}", "train.eval_every=5",
            "run.checkpoint_interval=5", "run.log_interval=5", f"run.dir={run_dir}",
            "averaging.timeout=5", "heterogeneity.stall_s=0.1", "heterogeneity.stall_prob=1.0"]
    proc = subprocess.Popen(argv, cwd=REPO, env=mpi_env(600), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        end = time.monotonic() + 120
        while not list((run_dir / "checkpoints").glob("ckpt_*.pt")):
            assert time.monotonic() < end and proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.2)
        ranks = [int(p) for p in subprocess.run(["pgrep", "-f", f"wagma_rl.supervised .*{run_dir}"],
                                                capture_output=True, text=True).stdout.split()
                 if not re.search(rb"mpiexec|wagma_rl.elastic",
                                  Path(f"/proc/{p}/cmdline").read_bytes())]
        assert len(ranks) == 2, ranks
        os.kill(max(ranks), signal.SIGSTOP)
        out, _ = proc.communicate(timeout=400)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        raise
    log = (run_dir / "log.txt").read_text()
    assert proc.returncode == 0, out[-3000:] + log[-3000:]
    # The survivor saved its last evaluation when the verdict came (Job.rescue), and the
    # relaunch resumed from that checkpoint.
    saved = re.search(r"elastic: lost rank 1 .*the survivors saved step (\d+)", log)
    assert saved and f"at step {saved.group(1)}" in log, log[-3000:]
    assert "rejoined" in log, log[-3000:]
    worlds = [int(m) for m in re.findall(r"image on (\d+) ranks?\b", log)]
    assert worlds == [2, 1, 2], log[-3000:]
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == steps
    assert "Traceback" not in out
