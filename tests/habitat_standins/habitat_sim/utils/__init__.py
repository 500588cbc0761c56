"""STAND-IN for ``habitat_sim.utils``: names only; see the package docs."""

from standin_placeholders import placeholder_module

from . import common, profiling_utils, viz_utils  # noqa: F401

__getattr__ = placeholder_module("habitat_sim.utils")
