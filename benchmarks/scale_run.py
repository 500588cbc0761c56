"""One run of the scale simulator (``python -m wagma_rl.scale``) recorded as a raw file: the run's
facts, the simulator's arguments and every row it computes (its ``--json`` output), and a
Markdown table of the rows printed. For the results pages whose tables are simulator runs.

    python benchmarks/scale_run.py --out benchmarks/results/NAME.json -- --workers 1024 ...

Everything after ``--`` goes to ``python -m wagma_rl.scale`` (its ``--help`` lists it); ``--json``
is added. Simulated, not measured: the facts say on which machine and code it was computed.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import provenance  # noqa: E402  (date, commit, host, load, versions)
from wagma_rl.scale import cli  # noqa: E402

COLUMNS = (("workers", "workers", "{:,}"), ("rollout_mode", "collection", "{}"),
           ("mode", "mode", "{}"), ("update_s", "update s", "{:.3f}"),
           ("frames_per_s", "frames/s", "{:,.0f}"), ("wait_share", "wait", "{:.1%}"),
           ("rollout_share", "frames", "{:.1%}"))


def simulate(argv: list[str]) -> list[dict]:
    """The simulator's rows for ``argv`` (its command line, without ``--json``)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main([*argv, "--json"])
    if status:
        raise SystemExit(f"benchmarks/scale_run.py: the simulator exited {status}")
    return json.loads(out.getvalue())


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(title for _, title, _ in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(fmt.format(r[key]) for key, _, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, theirs = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the raw file (JSON)")
    args = p.parse_args(ours)
    if not theirs:
        p.error("give the simulator's arguments after --: python benchmarks/scale_run.py --out "
                "FILE.json -- --workers 1024 ...")
    record = provenance.facts(config={"simulator_argv": theirs})
    rows = simulate(theirs)
    text = table(rows)
    print(text, flush=True)
    provenance.write_raw(args.out, record, argv=theirs, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
