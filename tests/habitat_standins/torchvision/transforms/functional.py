"""STAND-IN for ``torchvision.transforms.functional``: names only; see the package docs."""

from standin_placeholders import placeholder_module

__getattr__ = placeholder_module("torchvision.transforms.functional")
