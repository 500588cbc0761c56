"""``mpiexec -n 4 python -m wagma_rl.supervised --config configs/resnet_shapes.yaml [key=value ...]``"""
import sys

from ..entry import run_entry
from .train import main as train_main

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """The command line ``argv`` (default ``sys.argv[1:]``) after the start every entry point
    shares (:func:`wagma_rl.entry.run_entry`: stop signals caught, the launch checked, one line
    for what a user can cause, no rank left waiting); returns the exit status."""
    return run_entry(lambda signals: train_main(argv, signals=signals),
                     prog="python -m wagma_rl.supervised")


if __name__ == "__main__":
    sys.exit(main())
