"""Placeholders for the parts of a stood-in compiled module that the contract tests never use.

habitat-lab names magnum and habitat-sim types in annotations and builds a few of their values
as class-level defaults when its modules are imported. A placeholder type can be named, called
(giving an inert placeholder value) and subclassed; reading anything from a placeholder value
raises, so code that really needs the missing part fails loudly.
"""

__all__ = ["placeholder_type", "placeholder_module"]


def placeholder_type(qualname):
    """A class named ``qualname`` whose attributes are placeholders and whose instances are inert."""

    def cls_attr(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder_type(f"{qualname}.{name}")

    def inst_attr(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotImplementedError(f"{qualname}(...).{name} is not emulated by the test "
                                  f"stand-in; the Habitat contract tests must not need it")

    meta = type("PlaceholderMeta", (type,), {"__getattr__": cls_attr})
    return meta(qualname.rsplit(".", 1)[-1], (), {
        "__init__": lambda self, *args, **kwargs: None, "__getattr__": inst_attr,
        "__qualname__": qualname, "__repr__": lambda self: f"<stand-in {qualname}>"})


def placeholder_module(modname):
    """A module ``__getattr__`` that answers every public name with a placeholder type."""

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder_type(f"{modname}.{name}")

    return __getattr__
