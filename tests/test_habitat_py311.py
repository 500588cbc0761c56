"""``envs.habitat.py311``: habitat-lab 0.3.3's config dataclasses load on Python 3.11.

habitat-lab gives dataclass fields unhashable dataclass instances as defaults, which Python
3.11 rejects, so ``import habitat`` failed there before the adapter applied this patch (found
preparing the real habitat-sim run; the contract tests had applied it only in their start-up
hook).
"""

import dataclasses
import sys

import pytest

from envs.habitat.py311 import allow_habitat_config_defaults

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="a Python 3.11 check")


@dataclasses.dataclass
class Inner:
    shuffle: bool = True


def _define(module):
    """A config class as habitat-lab writes one, defined as if in ``module``."""
    ns = {"__module__": module, "__annotations__": {"options": Inner}, "options": Inner()}
    return dataclasses.dataclass(type("Outer", (), ns))


def test_habitats_unhashable_dataclass_defaults_become_fresh_copies():
    allow_habitat_config_defaults()
    allow_habitat_config_defaults()  # idempotent: the patch is not stacked
    cls = _define("habitat.config.default_structured_configs")
    a, b = cls(), cls()
    assert a.options == Inner() and a.options is not b.options
    a.options.shuffle = False
    assert b.options.shuffle is True and cls().options.shuffle is True


def test_other_modules_still_get_pythons_error():
    allow_habitat_config_defaults()
    with pytest.raises(ValueError, match="mutable default"):
        _define("someone_else.configs")
