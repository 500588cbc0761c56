"""``python -m wagma_rl.scale``: see :mod:`wagma_rl.scale.cli`."""
import sys

from .cli import main

sys.exit(main())
