"""Soak across namespaced nodes (not run by CI): the collective's stress case and the wagma quick run,
many times in a row on 2 nodes x 2 ranks; counts passes, failures and hangs (timeouts).

    python -m cluster.soak --stress 50 --train 20 --out benchmarks/results/soak.json

``--out``: a raw file with the run's facts (benchmarks/provenance.py), the counts and every run's
status and seconds (the output of each run that did not pass). Needs root (it makes its own two
nodes with cluster/netns.py and removes them at the end).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from cluster import netns  # noqa: E402
from mpi_launch import mpi_run  # noqa: E402
import provenance  # noqa: E402


def _one(c, argv, timeout):
    t0 = time.monotonic()
    try:
        proc = mpi_run(4, argv, timeout=timeout, cluster=c)
    except AssertionError as exc:  # mpi_run's own deadline: a hang
        return "hang", time.monotonic() - t0, str(exc)[-3000:]
    # Hydra's MPIEXEC_TIMEOUT kills the job first and exits 255 with this banner.
    if "APPLICATION TIMED OUT" in proc.stdout + proc.stderr:
        return "hang", time.monotonic() - t0, (proc.stdout + proc.stderr)[-3000:]
    status = "pass" if proc.returncode == 0 else "fail"
    return status, time.monotonic() - t0, (proc.stdout[-2000:] + proc.stderr[-2000:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stress", type=int, default=50, help="runs of the collective's stress case")
    p.add_argument("--train", type=int, default=20, help="runs of the wagma quick training")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds before a run is a hang")
    p.add_argument("--out", default="", help="also write the raw file here (JSON)")
    args = p.parse_args(argv)
    record = provenance.facts(config=vars(args))
    why = netns.available()
    if why:
        print(f"soak: cannot make namespaced nodes: {why}", file=sys.stderr)
        return 2
    c = netns.up(2, name=f"soak{os.getpid() % 10000}")
    jobs = [("stress", ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        "tests/mpi/native_coll_cases.py", "-k", "TestStress"])] * args.stress
    rows, runs = {}, []
    try:
        with tempfile.TemporaryDirectory(prefix="soak_") as tmp:
            for i in range(args.train):
                jobs.append(("wagma quick run", [
                    "run_ddppo.py", "--config", "configs/quick_pointnav.yaml",
                    f"run.dir={tmp}/run{i}", "averaging.name=wagma"]))
            for i, (name, argv_) in enumerate(jobs):
                status, secs, out = _one(c, argv_, args.timeout)
                row = rows.setdefault(name, {"pass": 0, "fail": 0, "hang": 0, "secs": []})
                row[status] += 1
                row["secs"].append(secs)
                runs.append(dict(case=name, status=status, seconds=round(secs, 2),
                                 **({"output": out} if status != "pass" else {})))
                print(f"{i:3d} {name:16s} {status:4s} {secs:6.1f} s", flush=True)
                if status != "pass":
                    print(out, flush=True)
    finally:
        netns.down(name=c.name)
    print("\n| case | runs | pass | fail | hang | median s |\n|---|---|---|---|---|---|")
    table = []
    for name, r in rows.items():
        s = sorted(r["secs"])
        median = s[len(s) // 2]
        table.append(dict(case=name, runs=len(s), median_s=round(median, 2),
                          **{k: r[k] for k in ("pass", "fail", "hang")}))
        print(f"| {name} | {len(s)} | {r['pass']} | {r['fail']} | {r['hang']} | {median:.1f} |")
    if args.out:
        provenance.write_raw(args.out, record, rows=table, runs=runs)
    return 0 if all(r["fail"] == r["hang"] == 0 for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
