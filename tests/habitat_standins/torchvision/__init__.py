"""STAND-IN for torchvision (PyPI's torchvision does not load beside the CPU torch wheel used here).

Used only by the Habitat contract tests: habitat-baselines imports ``torchvision.transforms``
at module level for image policies the contract tests do not build. Every attribute is a
placeholder (see standin_placeholders).
"""

from standin_placeholders import placeholder_module

from . import transforms  # noqa: F401

__getattr__ = placeholder_module("torchvision")
