"""STAND-IN for ``habitat_sim.logging``: habitat-sim's logger is a standard Python logger."""

import logging as _logging

__all__ = ["logger"]

logger = _logging.getLogger("habitat_sim")
