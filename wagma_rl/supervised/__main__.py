"""``mpiexec -n 4 python -m wagma_rl.supervised --config configs/resnet_shapes.yaml [key=value ...]``"""
import sys

from ..job.exits import run_main
from .train import main as train_main

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """The command line ``argv`` (default ``sys.argv[1:]``) under the project's one exit policy:
    one line for what a user can cause, no rank left waiting; returns the exit status."""
    return run_main(lambda: train_main(argv), prog="python -m wagma_rl.supervised")


if __name__ == "__main__":
    sys.exit(main())
