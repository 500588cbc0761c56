"""Start-up hook of the Habitat contract tests (this folder is first on PYTHONPATH there; nowhere
else): habitat-lab's Python 3.11 compatibility (``envs.habitat.py311``, which the adapter also
applies before it imports habitat; here it must precede the test modules' own ``import habitat``)
and the stand-ins for the Magnum and Corrade bindings.
"""

import os
import sys

# The repository is on PYTHONPATH too; py311.py is loaded by path so that importing it does
# not import the `envs` package (gymnasium, numpy) into every interpreter at start-up.
def _allow_habitat_config_defaults() -> None:
    import importlib.util

    for entry in sys.path:
        path = os.path.join(entry, "envs", "habitat", "py311.py")
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_habitat_py311", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            module.allow_habitat_config_defaults()
            return
    raise ImportError("envs/habitat/py311.py is not on PYTHONPATH: run the contract tests with "
                      "PYTHONPATH=tests/habitat_standins:<repository>")


_allow_habitat_config_defaults()


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
