"""``python -m wagma_rl.elastic``: see :mod:`wagma_rl.elastic.supervisor`."""
import sys

from .supervisor import main

sys.exit(main())
