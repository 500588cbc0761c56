"""``mpiexec -n 4 python -m wagma_rl.supervised --config configs/resnet_shapes.yaml [key=value ...]``"""
import sys

from .train import main

if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # a user error on every rank: say it once per rank and exit non-zero
        from ..config import ConfigError
        if isinstance(exc, (ConfigError, FileNotFoundError, ValueError)):
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        raise
