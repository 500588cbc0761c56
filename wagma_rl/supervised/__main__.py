"""``mpiexec -n 4 python -m wagma_rl.supervised --config configs/resnet_shapes.yaml [key=value ...]``"""
import sys

from ..job.exits import run_main
from .train import main

if __name__ == "__main__":
    # The project's one exit policy: one line for what a user can cause, no rank left waiting.
    sys.exit(run_main(main, prog="python -m wagma_rl.supervised"))
