"""What keeping the model in one flat buffer costs: parameters as views vs packing (not a test).

For each model, times one gather (model -> flat buffer) plus one scatter (flat -> model) in the
two modes of :class:`wagma_rl.optim.flat.FlatBuffer`, and one local optimizer step for scale.
Views cost nothing per average; packing costs two copies of the model.

    python benchmarks/optim_flat.py
"""
from __future__ import annotations

import argparse
import time

import torch

import provenance
from wagma_rl.optim.flat import FlatBuffer
from wagma_rl.supervised.models import Seq2SeqTransformer, resnet18, resnet50


def timed(fn, repeat: int = 20) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="raw JSON file (the run's facts and every row)")
    args = ap.parse_args()
    facts = provenance.facts(config=vars(args))
    rows = []
    torch.set_num_threads(1)
    models = {"resnet18 (11.7M)": lambda: resnet18(num_classes=1000, small_input=False),
              "resnet50 (25.6M)": lambda: resnet50(num_classes=1000, small_input=False),
              "transformer (d=256, 3+3 layers)": lambda: Seq2SeqTransformer(
                  src_vocab=8000, tgt_vocab=8000, d_model=256, nhead=8, num_encoder_layers=3,
                  num_decoder_layers=3, dim_feedforward=1024)}
    print("| model | view: gather+scatter ms | pack: gather+scatter ms | SGD step ms |")
    print("|---|---:|---:|---:|")
    for name, build in models.items():
        m = build()
        params = list(m.parameters())
        for p in params:
            p.grad = torch.zeros_like(p)
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        packed = FlatBuffer(params, views=False)
        pack_ms = timed(lambda: (packed.gather(), packed.scatter()))
        viewed = FlatBuffer(params, views=True)
        view_ms = timed(lambda: (viewed.gather(), viewed.scatter()))
        step_ms = timed(opt.step, repeat=5)
        print(f"| {name} | {view_ms:.3f} | {pack_ms:.1f} | {step_ms:.1f} |")
        rows.append(dict(model=name, view_ms=view_ms, pack_ms=pack_ms, sgd_step_ms=step_ms))
    if args.out:
        provenance.write_raw(args.out, facts, rows=rows)


if __name__ == "__main__":
    main()
