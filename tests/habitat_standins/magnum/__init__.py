"""STAND-IN for magnum (Magnum's compiled Python bindings, shipped with habitat-sim; not on PyPI).

Used only by the Habitat contract tests (tests/habitat_contract/). habitat-lab imports magnum at
module level and names its types in annotations and defaults; PointNav never computes with them.
So every attribute is a placeholder type that can be named but raises when it is used.
"""

from standin_placeholders import placeholder_module

__getattr__ = placeholder_module("magnum")
