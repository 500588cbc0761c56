"""The recurrent core's forward + backward over one PPO mini-batch: episodes packed into one call
against one call per stretch between episode starts (the two ways RecurrentCore runs), in one run.

    python benchmarks/recurrent_core.py --out benchmarks/results/recurrent_core_cpu.json

Prints the median seconds of each way and their ratio at each episode-start probability.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402  (date, commit, host, load, versions)
from wagma_rl.rl.policy import RecurrentCore  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--rnn", default="lstm", choices=["lstm", "gru"])
    p.add_argument("--start-probs", type=float, nargs="+", default=[0.25, 0.05, 0.02])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None, help="raw JSON file (facts and every row)")
    args = p.parse_args(argv)
    facts = provenance.facts(args.device, config=vars(args))
    rows = []
    torch.manual_seed(0)
    dev = torch.device(args.device)
    core = RecurrentCore(input_size=args.hidden + 64, hidden_size=args.hidden,
                         num_layers=args.layers, rnn_type=args.rnn).to(dev)
    t_len, n = args.steps, args.envs
    print(f"| P(an env starts an episode at a step) | stretches | one call per stretch, s | packed, s | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for prob in args.start_probs:
        x = torch.randn(t_len * n, args.hidden + 64, device=dev, requires_grad=True)
        h = torch.zeros(core.num_recurrent_layers, n, args.hidden, device=dev)
        masks = (torch.rand(t_len, n) > prob).float().to(dev)
        opens = (masks == 0).cpu().numpy()
        starts = (np.flatnonzero(opens[1:].any(axis=1)) + 1).tolist()
        ways = {"stretch": lambda: core._by_stretch(x.view(t_len, n, -1), h, masks, starts),
                "packed": lambda: core._by_episode(x.view(t_len, n, -1), h, masks, opens)}
        med = {}
        for name, run in ways.items():
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                out, h_t = run()
                (out.sum() + h_t.sum()).backward()
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                times.append(time.perf_counter() - t0)
            med[name] = statistics.median(times)
        print(f"| {prob} | {len(starts) + 1} | {med['stretch']:.3f} | {med['packed']:.3f} | "
              f"{med['stretch'] / med['packed']:.2f}x |", flush=True)
        rows.append(dict(start_prob=prob, stretches=len(starts) + 1, stretch_s=med["stretch"],
                         packed_s=med["packed"]))
    if args.out:
        provenance.write_raw(args.out, facts, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
