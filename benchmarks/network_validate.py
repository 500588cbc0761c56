"""Check the simulator's network model (wagma_rl/scale/network.py) against the measured collectives.

Reads what ``benchmarks/collective_nodes.py`` wrote (``<results>.json``: every repetition of the
node-aware schedule, the direct schedule and MPI_Allreduce, on 2 and 4 namespaced nodes of 2 ranks,
unshaped and capped links) and puts the model's time next to each measured median::

    python benchmarks/network_validate.py benchmarks/results/collective_nodes_1127.json \
        --out benchmarks/results/network_validate_1127.md

The model is the ``twonode`` set (alpha 24.1 us, beta 0.76 ns/B between nodes, calibrated with one
rank per node) with ``ppn`` = 2, its link capped at the run's rate as ``--link-gbit`` does, and the
``node`` set's shared-memory figures within a node. Nothing is fitted to these runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import provenance
from wagma_rl.scale.network import network_of

RATES_GBIT = {"unshaped": None, "10gbit": 10.0, "1gbit": 1.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="collective_nodes.py's .json")
    ap.add_argument("--out", default=None, help="also write the table (markdown) here, and the "
                    "figures with the run's facts beside it (.json)")
    args = ap.parse_args()
    facts = provenance.facts(config=vars(args))
    raw = []
    data = json.loads(Path(args.results).read_text())
    runs = data["runs"] if isinstance(data, dict) else data  # files before provenance: a bare list
    lines = ["| nodes x ranks | link | buffer | method | measured | model | model / measured |",
             "|---|---|---|---|---:|---:|---:|"]
    errors = {"node-aware": [], "direct": [], "MPI_Allreduce": []}
    order_right, order_total = 0, 0
    for run in runs:
        net = network_of("twonode", ppn=run["ppn"], link_gbit=RATES_GBIT[run["rate"]])
        p = run["nodes"] * run["ppn"]
        for row in run["rows"]:
            n = row["bytes"]
            model = {"node-aware": net.members(range(p), n),
                     "direct": net.members(range(p), n, node_aware=False),
                     "MPI_Allreduce": net.allreduce(p, n)}
            measured = {k: statistics.median(v) for k, v in row["times"].items()}
            for k in model:
                errors[k].append(model[k] / measured[k])
                raw.append(dict(nodes=run["nodes"], ppn=run["ppn"], rate=run["rate"], bytes=n,
                                method=k, measured_s=measured[k], model_s=model[k]))
                lines.append(f"| {run['nodes']} x {run['ppn']} | {run['rate']} | {n >> 20} MiB | {k} | "
                             f"{measured[k] * 1e3:.1f} ms | {model[k] * 1e3:.1f} ms | "
                             f"{model[k] / measured[k]:.2f} |")
            # Does the model rank the node-aware and the direct schedule as the measurement does?
            order_total += 1
            order_right += ((model["node-aware"] < model["direct"])
                            == (measured["node-aware"] < measured["direct"]))
    lines += ["", "| method | model / measured: median | min | max |", "|---|---:|---:|---:|"]
    for k, v in errors.items():
        lines.append(f"| {k} | {statistics.median(v):.2f} | {min(v):.2f} | {max(v):.2f} |")
    lines += ["", f"The model orders node-aware against direct as measured in {order_right} of "
              f"{order_total} rows."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        provenance.write_raw(provenance.beside(args.out), facts, measured_in=args.results,
                             rows=raw)


if __name__ == "__main__":
    main()
