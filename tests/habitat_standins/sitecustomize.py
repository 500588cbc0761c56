import copy, dataclasses
_orig = dataclasses._get_field
def _get_field(cls, a_name, a_type, *rest):
    default = cls.__dict__.get(a_name, dataclasses.MISSING)
    if (dataclasses.is_dataclass(default) and not isinstance(default, type)
            and type(default).__hash__ is None and cls.__module__.startswith("habitat")):
        setattr(cls, a_name, dataclasses.field(default_factory=lambda d=default: copy.deepcopy(d)))
    return _orig(cls, a_name, a_type, *rest)
dataclasses._get_field = _get_field
