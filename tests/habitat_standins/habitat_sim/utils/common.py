"""STAND-IN for ``habitat_sim.utils.common``: names only (PointNav does not use it)."""

from standin_placeholders import placeholder_module

__getattr__ = placeholder_module("habitat_sim.utils.common")
