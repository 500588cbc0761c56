"""STAND-IN for ``torchvision.transforms``: names only; see the package docs."""

from standin_placeholders import placeholder_module

from . import functional  # noqa: F401

__getattr__ = placeholder_module("torchvision.transforms")
