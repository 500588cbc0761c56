"""Attribute-bag configuration objects, like habitat-sim's pybind11 config structs."""


class ConfigStruct:
    """Keyword defaults become attributes. habitat-lab copies every key of its own config onto
    these objects after checking ``hasattr``; the stand-in accepts any key (reading an unset
    one gives None) and the simulator checks the values it emulates."""

    _defaults: dict = {}

    def __init__(self, **kwargs):
        for key, value in {**self._defaults, **kwargs}.items():
            setattr(self, key, value() if callable(value) else value)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return None
