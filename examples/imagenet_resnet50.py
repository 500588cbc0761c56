"""ImageNet-style ResNet-50 training with WAGMA: your own script, a DataLoader, AMP, channels-last.

The one-line switch from plain torch is marked ``# <- the switch``: wrap the torch optimizer; every
rank then averages its model with its group (a global average every ``--sync-period``).

    mpiexec -n 4 python examples/imagenet_resnet50.py --data /data/imagenet --device cuda
    srun --ntasks-per-node=4 --gpus-per-node=4 python examples/imagenet_resnet50.py --data /data/imagenet

``--data`` holds ``train/<class>/*.jpg`` (the ImageFolder layout). Run again with the same
``--checkpoint`` to resume at the next epoch; ``--tb DIR`` logs to TensorBoard.
The ResNet is the project's (``wagma_rl.supervised.models``): torchvision does not load beside
this torch. The ranks share the GPUs of a node round-robin.
"""
import argparse
import os
import time

import wagma_rl  # noqa: F401  (before mpi4py starts MPI: its settings for this node, docs/mpi.md)

import torch
from mpi4py import MPI
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from wagma_rl.job.precision import apply_precision, autocast
from wagma_rl.optim import WAGMA
from wagma_rl.supervised.data.image_folder import list_image_folder, load_images
from wagma_rl.supervised.models import resnet18, resnet50


class ImageFolder(Dataset):
    """``root/train/<class>/<image>``: decoded, resized and flipped in the DataLoader's workers."""

    def __init__(self, root, size):
        self.files, self.labels, self.classes = list_image_folder(root, "train")
        self.size = size

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        x = torch.from_numpy(load_images([self.files[i]], size=self.size)[0])
        if torch.rand(()) < 0.5:
            x = x.flip(-1)  # the usual random horizontal flip
        return x, self.labels[i]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="folder holding train/<class>/<images>")
    ap.add_argument("--arch", default="resnet50", choices=["resnet18", "resnet50"])
    ap.add_argument("--width", type=int, default=64, help="first-stage channels (64: the paper's)")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    ap.add_argument("--epochs", type=int, default=90)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--workers", type=int, default=4, help="DataLoader worker processes per rank")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--channels-last", action="store_true", help="NHWC (faster convolutions on GPUs)")
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--sync-period", type=int, default=10, help="every n-th average is global")
    ap.add_argument("--checkpoint", default="checkpoint.pt", help="saved every epoch, resumed from")
    ap.add_argument("--tb", default="", help="TensorBoard log folder (rank 0)")
    args = ap.parse_args(argv)

    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    device = torch.device(args.device)
    if device.type == "cuda":
        local = comm.Split_type(MPI.COMM_TYPE_SHARED).rank
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    apply_precision(args.precision)  # TF32 on or off for the process
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format

    data = ImageFolder(args.data, args.image_size)
    sampler = DistributedSampler(data, num_replicas=size, rank=rank, shuffle=True, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=args.workers,
                        pin_memory=device.type == "cuda", drop_last=True,
                        persistent_workers=args.workers > 0)
    build = resnet50 if args.arch == "resnet50" else resnet18
    model = build(num_classes=len(data.classes), width=args.width,
                  small_input=args.image_size < 96).to(device, memory_format=fmt)
    base = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9, weight_decay=1e-4)
    opt = WAGMA(base, group_size=min(args.group_size, size), sync_period=args.sync_period,
                buffers=model.buffers())  # <- the switch (plain torch: opt = base)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)

    start = 0
    if os.path.exists(args.checkpoint):  # every rank reads rank 0's synchronised model
        state = torch.load(args.checkpoint, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        start = state["epoch"] + 1
    writer = None
    if args.tb and rank == 0:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(args.tb)

    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle, the same on every rank
        model.train()
        t0, seen, total = time.perf_counter(), 0, 0.0
        for x, y in loader:
            x = x.to(device, non_blocking=True, memory_format=fmt)
            y = y.to(device, non_blocking=True)
            with autocast(device, args.precision):  # bf16 forward and loss, fp32 weights
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()  # local step, then the wait-avoiding group average
            opt.zero_grad()
            seen, total = seen + len(y), total + loss.item() * len(y)
        sched.step()
        opt.synchronize()  # replicas bitwise identical: checkpoint and evaluate from here
        rate = comm.allreduce(seen) / (time.perf_counter() - t0)
        if rank == 0:
            print(f"epoch {epoch}: loss {total / max(seen, 1):.4f}, {rate:.0f} samples/s", flush=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "sched": sched.state_dict(), "epoch": epoch}, args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)  # never a half-written file
            if writer:
                writer.add_scalar("train/loss", total / max(seen, 1), epoch)
                writer.add_scalar("train/samples_per_s", rate, epoch)
    opt.close()


if __name__ == "__main__":
    main()
