"""STAND-IN for ``habitat_sim.sim``: names only (PointNav does not use it); see the package docs."""

from standin_placeholders import placeholder_module

__getattr__ = placeholder_module("habitat_sim.sim")
