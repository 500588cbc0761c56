"""Python 3.11 compatibility for habitat-lab 0.3.3, loaded at interpreter start-up for the
Habitat contract tests (this folder is first on PYTHONPATH there; nowhere else).

habitat-lab 0.3.3 supports Python 3.9/3.10. Its structured configs give dataclass fields
instances of other (unhashable) config dataclasses as defaults, e.g. ``iterator_options:
IteratorOptionsConfig = IteratorOptionsConfig()``, which Python 3.11's dataclasses reject
("mutable default ... use default_factory"). The only CPU torch wheel here is for 3.11, so the
contract tests run on 3.11 and this hook turns exactly those defaults -- fields of classes in
``habitat*`` modules whose default is an unhashable dataclass instance -- into
``default_factory`` fields returning a copy (OmegaConf copies a default into every config
anyway, so the composed configs are the same). Nothing else changes.
"""

import copy
import dataclasses

_get_field = dataclasses._get_field


def _habitat_get_field(cls, a_name, a_type, *args):
    default = cls.__dict__.get(a_name, dataclasses.MISSING)
    if (cls.__module__.startswith("habitat") and dataclasses.is_dataclass(default)
            and not isinstance(default, type) and type(default).__hash__ is None):
        setattr(cls, a_name, dataclasses.field(default_factory=lambda: copy.deepcopy(default)))
    return _get_field(cls, a_name, a_type, *args)


dataclasses._get_field = _habitat_get_field


# STAND-INS for the compiled Magnum and Corrade bindings (shipped with habitat-sim, not on PyPI).
# habitat-lab imports them at module level and names their types in annotations and class-level
# defaults; PointNav never computes with them. Each is a module of placeholders that can be named
# but raise when used (standin_placeholders), registered here rather than as folders of their own.
def _register_binding_standins() -> None:
    import sys
    import types

    from standin_placeholders import placeholder_module

    for name in ("magnum", "corrade"):
        if name not in sys.modules:
            module = types.ModuleType(name, f"STAND-IN for {name}'s compiled bindings (tests only)")
            module.__getattr__ = placeholder_module(name)
            sys.modules[name] = module


_register_binding_standins()
