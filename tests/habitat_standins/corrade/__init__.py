"""STAND-IN for corrade (Corrade's compiled Python bindings, shipped with habitat-sim; not on PyPI).

Used only by the Habitat contract tests; habitat-lab's rearrangement modules import it at module
level. Every attribute is a placeholder (see standin_placeholders).
"""

from standin_placeholders import placeholder_module

__getattr__ = placeholder_module("corrade")
