"""A user's training script in which one rank fails; run by tests/test_faults_mpi.py.

    mpiexec -n N python tests/mpi/fault_optim_script.py OPTIMIZER[:MODE][,OPTIMIZER[:MODE]...] FAULT

OPTIMIZER is a name of ``build_optimizer`` or one of ``VARIANTS`` (``allreduce_node``: AllreduceSGD
with ``exchange="node"``). FAULT ``raise``: rank 1 raises after its first step (as a bug in the user's code would); one
optimizer only, as rank 1 is gone after it. ``nan``: rank 1's gradients (or model) turn NaN at
step 3; the optimizers given run one after another in the same ranks (each with a fresh model,
its own optimizer closed after it), MODE (``raise`` or ``drop``, default ``raise``) its
``nonfinite=``. Every other rank must end its case within the optimizer's timeout (6 s here) with
an exception naming rank 1; ranks print one ``RESULT rank=R case=OPTIMIZER[:MODE]`` line per
case, and exit 3 if any case raised.
"""
import sys

import torch
from mpi4py import MPI

from wagma_rl.optim import build_optimizer

OPTIONS = {"wagma": dict(group_size=2, sync_period=2), "allreduce": {}, "local_sgd": dict(local_steps=1),
           "dpsgd": {}, "nonblocking": dict(micro_batches=2),
           "nonblocking_dpsgd": dict(micro_batches=2)}
#: Cases that are an optimizer with other options: case name -> (optimizer, options).
VARIANTS = {"allreduce_node": ("allreduce", dict(exchange="node"))}

cases = sys.argv[1].split(",")
fault = sys.argv[2]
if fault == "raise" and len(cases) > 1:
    sys.exit("fault_optim_script.py: FAULT raise takes one optimizer (rank 1 is gone after it)")
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
# Every bounded wait's limit, the optimizers' start-up exchange included: 2 s was once too short
# for it on the loaded 2-core CI machine (both ranks present, each reported the other silent).
TIMEOUT = 6.0


def run_case(case: str) -> bool:
    """One optimizer's run with the fault; prints its RESULT line, returns whether it raised."""
    name, _, nonfinite = case.partition(":")
    name, options = VARIANTS.get(name, (name, OPTIONS.get(name)))
    torch.manual_seed(rank)
    model = torch.nn.Linear(8, 2)
    opt = build_optimizer(name, torch.optim.SGD(model.parameters(), lr=0.1), timeout=TIMEOUT,
                          nonfinite=nonfinite or "raise", **options)
    x, y = torch.randn(16, 8), torch.randn(16, 2)
    head = f"RESULT rank={rank} case={case}"
    try:
        # ``raise``: the survivor runs on until it meets the loss. A wait-avoiding round can still
        # complete through the failed rank's progress thread until its process is gone, so a short
        # loop could finish first (seen under load with NonBlockingSGD); this one outlasts any exit.
        for step in range(8 if fault != "raise" else 100_000):
            if fault == "raise" and rank == 1 and step == 1:
                raise RuntimeError("a bug in the user's script")
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            # One NaN gradient suffices for the non-blocking rounds too: a micro-batch (and its NaN
            # mark) that missed its round is carried into the next one, never dropped.
            if fault == "nan" and rank == 1 and step == 3:
                if name in ("allreduce", "nonblocking", "nonblocking_dpsgd"):
                    model.weight.grad[0, 0] = float("nan")
                else:
                    model.weight.data[0, 0] = float("nan")  # the model a step would produce
            if name.startswith("nonblocking"):
                opt.micro_step()
                if fault == "nan":
                    # Both publish before the round fires, so the NaN is in round 3 itself (carried
                    # into a later round it would be too, unless rank 1 lagged to the last step).
                    comm.Barrier()
            opt.step()
        finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        print(f"{head} finished finite={finite} "
              f"dropped={opt.stats.extra.get('nonfinite_dropped', 0)}", flush=True)
        return False
    except Exception as exc:  # the user's script would let it propagate; we report it for the test
        ranks = getattr(exc, "ranks", ())
        print(f"{head} {type(exc).__name__} ranks={list(ranks)} msg={exc}", flush=True)
        if fault == "raise" and rank == 1:
            raise
        return True
    finally:
        if fault == "nan":  # (after a lost rank, closing would wait for it)
            opt.close()


# Every rank past its imports first: the optimizers' bounded start-up (6 s here) is not a measure
# of how far apart a loaded machine starts the ranks' interpreters.
comm.Barrier()
raised = [run_case(case) for case in cases]
if any(raised):
    sys.exit(3)
