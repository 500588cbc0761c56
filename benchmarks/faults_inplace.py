"""Fault to first update again: Open MPI's survivors shrinking in place against MPICH's relaunch.

Each case trains ``configs/quick_pointnav.yaml`` on 3 ranks of this machine (WAGMA, group size 2,
sync period 2 unless ``--sync-period``, 2048 frames, default ``averaging.timeout``), SIGKILLs one
rank's training process once update 4's progress line is in log.txt (``--after``, plus
``--delay`` seconds), and times from the kill to the line that reports the
first update after it (``first update on N ranks``), as this script sees it appear (polled
every 10 ms; the log is line-buffered), and counts the completed updates the survivors threw
away (``updates_lost``: Open MPI's in-place line says how many; each survivor keeps its own
model of its last completed update, so 0 is the target):

* ``openmpi``: ``.venv-openmpi``'s ``mpirun --with-ft ulfm``; the survivors shrink and go on in
  the same processes (docs/mpi.md).
* ``mpich``: ``.venv``'s ``python -m wagma_rl.elastic --hosts localhost --ppn 3``: the supervisor
  relaunches the job (docs/faults.md). On one host Hydra ends every rank when one dies, the host
  still answers, so the relaunch is on all 3 slots from the newest checkpoint.

Every case must finish its budget with the frames counted once; the raw file holds every run's
figures and log lines (benchmarks/provenance.py's facts). Usage::

    python benchmarks/faults_inplace.py --out benchmarks/results/faults_inplace.json
    python benchmarks/faults_inplace.py --mpis openmpi --sync-period 8 --after 8 --delay 1.5 \
        --out benchmarks/results/faults_inplace_midperiod.json   # a loss mid-period
    python benchmarks/faults_inplace.py --mpis openmpi --fault stop --victims 1 --repeats 1 \
        --limit 420 --out benchmarks/results/faults_inplace_sigstop.json
    OMPI_MCA_mpi_ft_detector=true OMPI_MCA_mpi_ft_detector_thread=true \
        python benchmarks/faults_inplace.py --mpis openmpi --fault stop --victims 1 0 \
        --out benchmarks/results/faults_inplace_sigstop_detector.json
    python benchmarks/faults_inplace.py --mpis openmpi --nodes --fault node --victims 3 \
        --sync-period 8 --after 8 --delay 1 --out benchmarks/results/faults_inplace_node.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import provenance  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from openmpi_launch import openmpi_command  # noqa: E402  (the tests' launch line, one way)

from native_coll.mpiinfo import openmpi_env  # noqa: E402

VENVS = {"openmpi": ROOT / ".venv-openmpi", "mpich": ROOT / ".venv"}
RANK_VARS = {"openmpi": "OMPI_COMM_WORLD_RANK", "mpich": "PMI_RANK"}
TRAIN = ["run_ddppo.py", "--config", "configs/quick_pointnav.yaml", "run.total_frames=2048"]


def command(mpi: str, run_dir: Path, state_dir: Path, sync_period: int, cluster=None) -> list[str]:
    py = str(VENVS[mpi] / "bin" / "python")
    train = [*TRAIN, f"averaging.sync_period={sync_period}", f"run.dir={run_dir}"]
    job = [py, *train]
    if mpi == "openmpi":  # (on the namespaced nodes: 2 ranks on each)
        return openmpi_command(3 if cluster is None else 2 * len(cluster.nodes), train, ft=True,
                               cluster=cluster)
    return [py, "-m", "wagma_rl.elastic", "--launcher", str(VENVS[mpi] / "bin" / "mpiexec"),
            "--hosts", "localhost", "--ppn", "3", "--rejoin-after", "3600",
            "--state-dir", str(state_dir), "--", *job]


def rank_pid(marker: str, var: str, rank: int) -> int | None:
    """The training process (python, ``marker`` on its command line) of MPI rank ``rank``."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"python" in Path(argv[0].decode(errors="replace")).name.encode() \
                and any(marker.encode() in a for a in argv) and b"run_ddppo.py" in b" ".join(argv) \
                and f"{var}={rank}".encode() in env:
            return int(d.name)
    return None


def wait_for(log: Path, pattern: str, proc: subprocess.Popen, limit: float) -> float | None:
    """time.time() when ``pattern`` (a regex) first shows in ``log``; None if the job ended or
    ``limit`` seconds passed first."""
    until = time.monotonic() + limit
    while time.monotonic() < until:
        if log.exists() and re.search(pattern, log.read_text(errors="replace")):
            return time.time()
        if proc.poll() is not None:
            return None
        time.sleep(0.01)
    return None


def one_case(mpi: str, victim: int, limit: float, *, sync_period: int = 2, delay: float = 0.0,
             after: int = 4, fault: str = "kill", cluster=None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"faults_inplace_{mpi}_") as tmp:
        run_dir, state_dir = Path(tmp) / "run", Path(tmp) / "elastic"
        env = openmpi_env(dict(os.environ)) if mpi == "openmpi" else dict(os.environ)
        env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MPIR_CVAR_CH4_NETMOD="ofi")
        cmd = command(mpi, run_dir, state_dir, sync_period, cluster)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        row = {"mpi": mpi, "victim": "node n1" if fault == "node" else victim, "fault": fault,
               "sync_period": sync_period, "delay_s": delay, "command": " ".join(cmd)}
        log = run_dir / "log.txt"
        try:
            if wait_for(log, rf"update={after} ", proc, limit) is None:
                return _failed_start(row, proc, log, f"update {after} never logged")
            time.sleep(delay)
            pid = rank_pid(str(run_dir), RANK_VARS[mpi], victim)
            if pid is None:
                return _failed_start(row, proc, log, f"rank {victim}'s process not found")
            t_kill = time.time()
            if fault == "node":  # every process of n1: its ranks and Open MPI's daemon there
                for p in cluster.pids("n1"):
                    os.kill(p, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGSTOP if fault == "stop" else signal.SIGKILL)
            before = re.findall(r"update=(\d+) ", log.read_text(errors="replace"))
            # (A stopped rank: the survivors go on in place when ULFM's heartbeat detector calls
            # it failed, OMPI_MCA_mpi_ft_detector=true; else they stop after averaging.timeout.)
            t_first = wait_for(log, r"first update on \d+ rank|stopped: " if fault == "stop"
                               else r"first update on \d+ rank", proc, limit)
            if fault == "stop":  # (the stopped rank would keep mpirun waiting)
                row["stopped_line"] = next((ln for ln in log.read_text().splitlines()
                                            if "stopped: " in ln), None)
                row["detector"] = os.environ.get("OMPI_MCA_mpi_ft_detector", "false")
                time.sleep(5)  # the survivors end or go on
                row["fenced"] = ("with SIGKILL: the MPI declared it failed"
                                 in log.read_text(errors="replace"))
                try:  # (a stopped rank 0 on the new rank 0's host is ended by the job itself)
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out, _ = proc.communicate(timeout=limit)
            text = log.read_text(errors="replace")
        except BaseException:
            _end(proc)
            raise
        done = re.search(r"done: update (\d+), frames (\d+)", text)
        first = re.search(r"first update on (\d+) ranks", text)
        went_back = re.search(r"resumed from .*: update (\d+), frames", text)
        dropped = re.search(r"\((\d+) completed updates? dropped\)", text)
        row.update(
            returncode=proc.returncode,
            # (SIGSTOP: to the survivors' stop, as nothing goes on in place)
            fault_to_first_update_s=None if t_first is None else round(t_first - t_kill, 3),
            killed_after_update=int(before[-1]) if before else None,
            went_back_to_update=int(went_back.group(1)) if went_back else None,
            # Completed updates the survivors threw away (Open MPI's in-place line says; MPICH's
            # survivors end with the job, their progress past the checkpoint is not logged).
            updates_lost=int(dropped.group(1)) if dropped else None,
            ranks_after=int(first.group(1)) if first else None,
            finished=bool(done) and int(done.group(2)) >= 2048,
            final=done.group(0) if done else None,
            replicas_identical=bool(re.search(r"replicas identical on all \d+ ranks", text)),
            lines=[ln for ln in text.splitlines()
                   if re.search(r"lost|elastic|first update|resumed|continuing|relaunch", ln)],
            output_tail=out[-3000:])
        return row


def _end(proc: subprocess.Popen) -> str:
    """End the job's process group (if it is still there); its output."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.communicate()[0] or ""


def _failed_start(row: dict, proc: subprocess.Popen, log: Path, why: str) -> dict:
    """The row of a case whose job failed before the fault (kept in the raw file, not raised:
    the other cases still run)."""
    out = _end(proc)
    row.update(error=why, returncode=proc.returncode, fault_to_first_update_s=None,
               killed_after_update=None, went_back_to_update=None, updates_lost=None,
               ranks_after=None, finished=False,
               log_tail=log.read_text(errors="replace")[-3000:] if log.exists() else "",
               output_tail=out[-3000:])
    return row


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the raw JSON file to write")
    ap.add_argument("--mpis", nargs="+", default=["openmpi", "mpich"], choices=sorted(VENVS))
    ap.add_argument("--victims", nargs="+", type=int, default=[1, 0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--limit", type=float, default=300.0, help="seconds any phase may take")
    ap.add_argument("--sync-period", type=int, default=2, help="averaging.sync_period")
    ap.add_argument("--fault", choices=("kill", "stop", "node"), default="kill",
                    help="SIGKILL the victim, SIGSTOP it (timed to the survivors' first update "
                         "in place or their stop, whichever comes; ULFM notices a stopped rank "
                         "only with OMPI_MCA_mpi_ft_detector=true), or kill every process of "
                         "node n1 (with --nodes)")
    ap.add_argument("--nodes", action="store_true",
                    help="Open MPI on 2 namespaced nodes x 2 ranks (cluster/netns.py, as root)")
    ap.add_argument("--after", type=int, default=4,
                    help="the update whose progress line starts the kill's clock")
    ap.add_argument("--delay", type=float, default=0.0,
                    help="seconds after that line before the kill (mid-period with a longer "
                         "sync period: the survivors keep the updates past the global average)")
    args = ap.parse_args(argv)
    if (args.fault != "kill" or args.nodes) and args.mpis != ["openmpi"]:
        ap.error("--fault stop|node and --nodes are Open MPI's rows: add --mpis openmpi")
    if args.nodes:
        from cluster import netns

        why = netns.available()
        if why:
            ap.error(f"--nodes needs namespaced nodes: {why}")
    return args


def main() -> int:
    args = parse_args()
    record = provenance.facts(config=vars(args))
    record["mpi_versions"] = {
        mpi: subprocess.run([str(VENVS[mpi] / "bin" / "python"), "-m", "native_coll.mpiinfo"],
                            cwd=ROOT, capture_output=True, text=True).stdout.splitlines()[:1]
        for mpi in args.mpis}
    cluster = None
    if args.nodes:
        from cluster import netns

        cluster = netns.up(2, name=f"fb{os.getpid()}")
    rows = []
    try:
        rows = run_rows(args, cluster)
    finally:
        if cluster is not None:
            netns.down(name=cluster.name)
    provenance.write_raw(args.out, record, rows=rows)
    print(f"wrote {args.out}")
    return 0


def run_rows(args, cluster) -> list[dict]:
    rows = []
    for _ in range(args.repeats):
        for mpi in args.mpis:
            for victim in args.victims:
                row = one_case(mpi, victim, args.limit, sync_period=args.sync_period,
                               delay=args.delay, after=args.after, fault=args.fault,
                               cluster=cluster)
                print(json.dumps({k: row[k] for k in ("mpi", "victim", "fault_to_first_update_s",
                                                        "killed_after_update", "went_back_to_update",
                                                        "updates_lost",
                                                        "ranks_after", "finished", "returncode")}),
                      flush=True)
                rows.append(row)
    return rows


if __name__ == "__main__":
    sys.exit(main())
