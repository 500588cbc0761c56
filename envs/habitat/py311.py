"""Python 3.11 compatibility for habitat-lab 0.3.3, applied before ``habitat`` is imported.

habitat-lab 0.3.3 supports Python 3.9/3.10. Its structured configs give dataclass fields
instances of other (unhashable) config dataclasses as defaults, e.g. ``iterator_options:
IteratorOptionsConfig = IteratorOptionsConfig()``, which Python 3.11's dataclasses reject
("mutable default ... use default_factory"), so ``import habitat`` fails there. The project's
CPU torch wheel is for 3.11, so :func:`allow_habitat_config_defaults` turns exactly those
defaults -- fields of classes in ``habitat*`` modules whose default is an unhashable dataclass
instance -- into ``default_factory`` fields returning a copy (OmegaConf copies a default into
every config anyway, so the composed configs are the same). Nothing else changes.
"""

from __future__ import annotations

import copy
import dataclasses
import sys

__all__ = ["allow_habitat_config_defaults"]


def allow_habitat_config_defaults():
    """Patch ``dataclasses`` as described above (once; a no-op before Python 3.11). Must run
    before habitat's config modules are imported to have an effect."""
    if sys.version_info < (3, 11) or getattr(dataclasses._get_field, "_habitat_compat", False):
        return
    get_field = dataclasses._get_field

    def _habitat_get_field(cls, a_name, a_type, *args):
        default = cls.__dict__.get(a_name, dataclasses.MISSING)
        if (cls.__module__.startswith("habitat") and dataclasses.is_dataclass(default)
                and not isinstance(default, type) and type(default).__hash__ is None):
            setattr(cls, a_name,
                    dataclasses.field(default_factory=lambda: copy.deepcopy(default)))
        return get_field(cls, a_name, a_type, *args)

    _habitat_get_field._habitat_compat = True
    dataclasses._get_field = _habitat_get_field
