"""A Transformer translation script with WAGMA and the outer Nesterov step on its global averages.

The one-line switch from plain torch is marked ``# <- the switch``. ``outer="nesterov"`` takes a
Nesterov-momentum step on the change since the last global model at every global average
(DiLoCo's outer optimizer; docs/optimizers.md#outer-optimizer-on-the-global-average-outernesterov).
The data is the project's generated grammar (nothing downloaded); put your own pairs in ``pairs``.

    mpiexec -n 4 python examples/transformer_outer.py --steps 1500
    srun --ntasks=4 python examples/transformer_outer.py --steps 1500

Run again with the same ``--checkpoint`` to resume; ``--tb DIR`` logs to TensorBoard.
"""
import argparse
import os

import wagma_rl  # noqa: F401  (before mpi4py starts MPI: its settings for this node, docs/mpi.md)

import torch
from mpi4py import MPI

from wagma_rl.job.precision import autocast
from wagma_rl.optim import WAGMA
from wagma_rl.supervised.data import BOS, EOS, PAD, GrammarTask, Vocab, generate_pairs
from wagma_rl.supervised.models import Seq2SeqTransformer


def padded(rows, device):
    out = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r)
    return out.to(device)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sentences", type=int, default=16384, help="generated pairs, all ranks together")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32, help="sentence pairs per rank per step")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--sync-period", type=int, default=10, help="every n-th average is global")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--checkpoint", default="transformer.pt")
    ap.add_argument("--tb", default="", help="TensorBoard log folder (rank 0)")
    args = ap.parse_args(argv)

    comm = MPI.COMM_WORLD
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", comm.Split_type(MPI.COMM_TYPE_SHARED).rank % torch.cuda.device_count())
    pairs = generate_pairs(args.sentences, rank=comm.rank, world_size=comm.size)  # this rank's shard
    src_tokens, tgt_tokens = GrammarTask().vocabularies()
    src_vocab, tgt_vocab = Vocab(src_tokens), Vocab(tgt_tokens)
    torch.manual_seed(0)
    model = Seq2SeqTransformer(src_vocab=len(src_vocab), tgt_vocab=len(tgt_vocab), d_model=args.d_model,
                               nhead=4, dim_feedforward=2 * args.d_model, dropout=0.0).to(device)
    base = torch.optim.Adam(model.parameters(), lr=args.lr)
    opt = WAGMA(base, group_size=min(2, comm.size), sync_period=args.sync_period,
                outer="nesterov", outer_lr=0.7, outer_momentum=0.9)  # <- the switch (plain: opt = base)

    step = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])  # the outer momentum and the averaging schedule too
        step = state["step"]
    writer = None
    if args.tb and comm.rank == 0:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(args.tb)

    g = torch.Generator().manual_seed(1000 + comm.rank)
    while step < args.steps:
        batch = [pairs[i] for i in torch.randint(len(pairs), (args.batch,), generator=g).tolist()]
        src = padded([src_vocab.encode(s) for s, _ in batch], device)
        tgt = padded([[BOS] + tgt_vocab.encode(t) + [EOS] for _, t in batch], device)
        with autocast(device, args.precision):
            logits = model(src, tgt[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                     tgt[:, 1:].reshape(-1), ignore_index=PAD)
        loss.backward()
        opt.step()  # local Adam step, then the group average (global + outer step on schedule)
        opt.zero_grad()
        step += 1
        if step % args.log_every == 0 or step == args.steps:
            opt.synchronize()  # replicas bitwise identical: log and checkpoint from here
            mean = comm.allreduce(loss.item()) / comm.size
            if comm.rank == 0:
                print(f"step {step}: loss {mean:.4f}", flush=True)
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                           args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
                if writer:
                    writer.add_scalar("train/loss", mean, step)
    opt.close()


if __name__ == "__main__":
    main()
