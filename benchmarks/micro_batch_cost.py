"""Compute cost per sample against micro-batch size (forward + backward, one thread; not a test).

Why the non-blocking optimizers use micro-batches of 16 or more on a CPU: small ones compute
several times slower per sample. Reproduce the numbers quoted in docs/optimizers.md (and docs/results/optimizers.md) with::

    python benchmarks/micro_batch_cost.py
"""
from __future__ import annotations

import argparse
import time

import torch

import provenance
from wagma_rl.supervised.models import resnet18


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--width", type=int, default=8, help="ResNet-18 width (the benchmark's 8)")
    ap.add_argument("--image-size", type=int, default=16)
    ap.add_argument("--samples", type=int, default=256, help="samples timed per size")
    ap.add_argument("--out", default=None, help="raw JSON file (the run's facts and every row)")
    args = ap.parse_args()
    facts = provenance.facts(config=vars(args))
    rows = []
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = resnet18(num_classes=6, width=args.width, small_input=True)
    print("| micro-batch | ms per micro-batch | ms per sample |\n|---:|---:|---:|")
    for bs in args.sizes:
        x, y = torch.randn(bs, 3, args.image_size, args.image_size), torch.randint(0, 6, (bs,))
        for _ in range(2):  # warm-up
            torch.nn.functional.cross_entropy(model(x), y).backward()
        n = max(3, args.samples // bs)
        t0 = time.perf_counter()
        for _ in range(n):
            torch.nn.functional.cross_entropy(model(x), y).backward()
        dt = (time.perf_counter() - t0) / n
        print(f"| {bs} | {dt * 1e3:.1f} | {dt / bs * 1e3:.2f} |", flush=True)
        rows.append(dict(micro_batch=bs, s_per_micro_batch=dt, timed=n))
    if args.out:
        provenance.write_raw(args.out, facts, rows=rows)


if __name__ == "__main__":
    main()
