"""Fault to first update again under ``python -m wagma_rl.elastic`` (MPICH), at the default settings.

On two namespaced nodes (cluster.netns, 2 x 2 ranks) the supervisor runs the quick PointNav job
(slowed to about 0.5 s per update, as tests/test_elastic.py does) with the job's and the
supervisor's defaults (``averaging.timeout`` 300 s, ``--dead-after`` 10 s, ``--probe-timeout`` 30 s;
only ``--rejoin-after`` is raised so that the run ends before a lost host is taken back). After
update 6 one fault is made; the row is the seconds from the fault to the first update of the
relaunched job (log.txt's timestamps: +-1 s), what found the loss, and the updates done again.

    python benchmarks/elastic_recovery.py [--faults node_killed rank_stopped ...]
        [--timeout S] [--rejoin-after S] [--out benchmarks/results/elastic_recovery.json]

Faults: ``rank_killed`` (SIGKILL of rank 3), ``rank_stopped`` (SIGSTOP of rank 3),
``node_killed`` (every process of n1 killed, its link down), ``rank0_node_killed`` (the same for
n0, which holds rank 0; the supervisor runs on n1), ``link_cut`` (n1's link down, its processes
left running). Needs root (network namespaces).

``--timeout``: the job's ``averaging.timeout`` (default: the job's own, 300 s). ``--rejoin-after``
(default 100000: no rejoin): the supervisor's; with a rejoin the lost node's link comes back once
the relaunch has trained its first update, and the row gains the seconds from the job's stop for
the rejoin to its first update on every rank.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import provenance  # noqa: E402  (date, commit, host, load, versions)
from cluster import netns  # noqa: E402
from native_coll.mpienv import mpiexec_path, with_netmod  # noqa: E402
from run_log import launches, stamp  # noqa: E402
from wagma_rl.config import load_config  # noqa: E402
from wagma_rl.rl.config import DDPPOConfig  # noqa: E402

QUICK = "configs/quick_pointnav.yaml"
FAULTS = ("rank_killed", "rank_stopped", "node_killed", "rank0_node_killed", "link_cut")
JOB_ARGS = ["run.log_interval=1", "run.checkpoint_interval=4", "heterogeneity.stall_s=0.03",
            "heterogeneity.stall_prob=1.0"]


def _first_updates(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "] first update on " in line] \
        if log.exists() else []


def one(c: netns.Cluster, fault: str, folder: Path, updates: int, dead_after: float, *,
        timeout: float | None = None, rejoin_after: float = 100000) -> dict:
    """Run the job under the supervisor, make ``fault`` after update 6, return its row."""
    run_dir = folder / fault
    on, victim = ("n1", "n0") if fault == "rank0_node_killed" else ("n0", "n1")
    mpiexec = mpiexec_path()
    quick = load_config(DDPPOConfig, REPO / QUICK)
    frames = updates * 4 * quick.ppo.num_steps * quick.env.num_envs
    argv = [sys.executable, "-m", "wagma_rl.elastic", "--launcher",
            f"{mpiexec} -launcher ssh -launcher-exec {c.launcher}", "--hosts", ",".join(c.nodes),
            "--ppn", "2", "--rejoin-after", f"{rejoin_after:g}", "--dead-after", f"{dead_after:g}",
            "--state-dir", str(folder / f"{fault}.el"),
            "--", sys.executable, "run_ddppo.py", "--config", QUICK, f"run.dir={run_dir}",
            f"run.total_frames={frames}", *JOB_ARGS,
            *([f"averaging.timeout={timeout:g}"] if timeout is not None else [])]
    env = with_netmod(dict(os.environ, OMP_NUM_THREADS="1"))
    proc = subprocess.Popen(c.node_command(on, argv), cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(line.rstrip() for line in proc.stdout),
                              daemon=True)
    reader.start()
    log = run_dir / "log.txt"
    end = time.monotonic() + 300
    while not (log.exists() and re.search(r"update=6 ", log.read_text())):
        if time.monotonic() > end or proc.poll() is not None:
            os.killpg(proc.pid, signal.SIGKILL)
            raise SystemExit(f"{fault}: the job did not reach update 6:\n" + "\n".join(out[-40:]))
        time.sleep(0.2)
    # Rank 3's pid, from its heartbeat file (launch 1): "<count> <state> <host> <pid>".
    rank3 = int((folder / f"{fault}.el" / "beat_1_rank3").read_text().split()[3])
    t_fault = time.time()
    if fault == "rank_killed":
        os.kill(rank3, signal.SIGKILL)
    elif fault == "rank_stopped":
        os.kill(rank3, signal.SIGSTOP)
    else:
        for pid in c.pids(victim) if fault != "link_cut" else ():
            os.kill(pid, signal.SIGKILL)
        c.link(victim, up=False)
    if fault != "rank_stopped" and rejoin_after < 100000:
        # The node comes back once the job trains without it, so that it can rejoin.
        end = time.monotonic() + 600
        while not _first_updates(log) and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.2)
        c.link(victim, up=True)
    try:
        rc = proc.wait(timeout=900)
    finally:
        for pid in c.pids(victim) if fault in ("rank_stopped", "link_cut") else ():
            os.kill(pid, signal.SIGKILL)
        c.link(victim, up=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(timeout=5)
    text = log.read_text()
    firsts = _first_updates(log)
    rejoins = [float(m.group(1)) for line in firsts
               if (m := re.search(r"([\d.]+) s after the job stopped for them", line))]
    runs = launches(text)
    said = [line for line in out if line.startswith("elastic [")]
    # (The first relaunch's line says what decided: the supervisor's heartbeat verdict, the
    # survivors' loss record, or a launch that ended without one.)
    first = next((line for line in said if "relaunching on" in line), "")
    found = ("heartbeat" if "(--dead-after): dead" in first else
             "survivors' record" if "lost rank" in first else
             "launcher ended, hosts probed" if "without a record" in first else "?")
    row = {"fault": fault, "rc": rc, "found_by": found,
           "fault_to_first_update_s": round(stamp(firsts[0]) - t_fault) if firsts else None,
           "first_update_line": firsts[0] if firsts else None,
           "redone_updates": runs[0]["end"][0] - runs[1]["start"][0] if len(runs) > 1 else None,
           "worlds": [r["world"] for r in runs],
           "rejoin_s": round(rejoins[0]) if rejoins else None, "supervisor": said}
    print(f"| {fault} | {found} | {row['fault_to_first_update_s']} | {row['redone_updates']} | "
          f"{row['worlds']} | {row['rejoin_s'] if rejoins else '-'} | rc {rc} |", flush=True)
    return row


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--faults", nargs="+", default=list(FAULTS), choices=FAULTS)
    ap.add_argument("--updates", type=int, default=24, help="the run's length in 4-rank updates")
    ap.add_argument("--dead-after", type=float, default=10.0,
                    help="the supervisor's --dead-after (10, its default; 100000: no heartbeat "
                         "verdicts, the survivors' timeout decides as before them)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="the job's averaging.timeout in seconds (default: the job's own)")
    ap.add_argument("--rejoin-after", type=float, default=100000,
                    help="the supervisor's --rejoin-after (default 100000: no rejoin)")
    ap.add_argument("--out", default="benchmarks/results/elastic_recovery.json")
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    record = provenance.facts(config={"faults": args.faults, "updates": args.updates,
                                      "dead_after": args.dead_after,
                                      "timeout": args.timeout,
                                      "rejoin_after": args.rejoin_after,
                                      "job": [QUICK, *JOB_ARGS], "nodes": "2 x 2 ranks"})
    c = netns.up(2, name="wgelastic")
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="elastic-recovery-") as tmp:
            print("| fault | found by | fault to first update (s) | updates redone | worlds | "
                  "rejoin (s) | |")
            for fault in args.faults:
                rows.append(one(c, fault, Path(tmp), args.updates, args.dead_after,
                                timeout=args.timeout, rejoin_after=args.rejoin_after))
    finally:
        netns.down(name=c.name)
    print(provenance.write_raw(args.out, record, rows=rows))


if __name__ == "__main__":
    main()
