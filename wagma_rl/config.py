"""Typed run configuration: dataclass schemas filled from YAML files and ``a.b=value`` overrides.

A schema is a (nested) dataclass whose fields all have defaults; a section class may list keys
that moved elsewhere in a ``RENAMED`` class attribute (old key -> where it is now), so an old file
gets a message that names the new place instead of the list of valid keys. :func:`load_config` starts from the
defaults, applies a YAML file, then command-line overrides, and checks every key and type on the way,
so a typo or a wrong type stops the run before any work with a message that names the key and lists
the valid ones. :func:`save_config` writes the resolved config back as YAML (reloadable with
:func:`load_config`).
"""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Union

import yaml

__all__ = ["ConfigError", "load_config", "save_config", "config_to_dict", "parse_overrides"]


class ConfigError(ValueError):
    """A configuration key is unknown, has the wrong type, or an override is malformed."""


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` checked (and losslessly converted) to type ``tp``; raise ConfigError if not."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return _float_strings(value)
    if origin is Union or origin is types.UnionType:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"config key '{key}': expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"config key '{key}': {value!r} is not one of {list(choices)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}': expected a list, got {value!r}")
        args = typing.get_args(tp)
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}': expected a mapping, got {value!r}")
        return _float_strings(dict(value))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key '{key}': expected a section (mapping) of "
                              f"{sorted(f.name for f in dataclasses.fields(tp))}, got {value!r}")
        return _build(tp, value, prefix=key + ".")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{key}': expected true/false, got {value!r}")
    if tp in (int, float) and isinstance(value, str):
        # YAML 1.1 reads 1e-3 as a string (it wants 1.0e-3); the field says a number is meant.
        value = _float_strings(value)
    if tp is int:
        # bool is an int subclass in Python; a config `true` for an integer is a mistake.
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"config key '{key}': expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"config key '{key}': expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"config key '{key}': expected {_type_name(tp)}, got {value!r}")


def _build(cls: type, data: Mapping[str, Any], *, prefix: str = "", base: Any = None) -> Any:
    """Instantiate dataclass ``cls`` from ``data`` on top of ``base`` (or the defaults)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = _hints(cls)
    unknown = [k for k in data if k not in fields]
    moved = getattr(cls, "RENAMED", {})
    for k in unknown:
        if k in moved:
            raise ConfigError(f"config key '{prefix}{k}' has moved: use {moved[k]} (edit the config "
                              "file, or the config.yaml of a run folder written before the move)")
    if unknown:
        where = f"section '{prefix[:-1]}'" if prefix else "the top level"
        raise ConfigError(f"unknown config key '{prefix}{unknown[0]}'; valid keys in {where}: "
                          f"{', '.join(sorted(fields))}")
    kwargs = {}
    for name, f in fields.items():
        current = getattr(base, name) if base is not None else None
        if name not in data:
            if base is not None:
                kwargs[name] = current
            continue
        tp = hints[name]
        value = data[name]
        if dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
            kwargs[name] = _build(tp, value, prefix=f"{prefix}{name}.", base=current)
        else:
            kwargs[name] = _coerce(value, tp, prefix + name)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a field without a default that the data did not give
        raise ConfigError(f"cannot build {cls.__name__}: {exc}") from exc


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=x"]`` into the nested mapping ``{"a": {"b": 1}, "c": "x"}``.

    Values are parsed as YAML scalars/lists (``1`` -> int, ``0.5`` -> float, ``true`` -> bool,
    ``[1,2]`` -> list); anything else stays a string until the field's type is known (``1e-3`` is
    then a float for a number field and stays ``'1e-3'`` for a string one).
    """
    nested: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. ppo.lr=1e-3)")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} has an empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with another override of '{part}'")
        node[parts[-1]] = value
    return nested


def _read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} not found")
    with open(path) as fh:
        try:
            data = yaml.safe_load(fh)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
    return data


def _float_strings(data: Any) -> Any:
    """Convert YAML's '1e-3'-style strings (YAML 1.1 reads them as str) to floats; used where a
    number is meant (a number field) or the type is unknown (free-form options)."""
    if isinstance(data, dict):
        return {k: _float_strings(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_float_strings(v) for v in data]
    if isinstance(data, str):
        try:
            return float(data) if ("e" in data.lower() and data.strip()[0] in "+-.0123456789") else data
        except ValueError:
            return data
    return data


def load_config(schema: type, path: str | Path | None = None, overrides: Iterable[str] = (), *,
                data: Mapping[str, Any] | None = None) -> Any:
    """Return an instance of dataclass ``schema`` from defaults, then ``path`` (YAML), then ``data``,
    then ``overrides`` (``"a.b=value"`` strings), applied in that order.

    Raises :class:`ConfigError` naming the key when one is unknown or has the wrong type.
    """
    if not dataclasses.is_dataclass(schema):
        raise TypeError(f"schema must be a dataclass type, got {schema!r}")
    cfg = _build(schema, {})
    if path is not None:
        cfg = _build(schema, _read_yaml(path), base=cfg)
    if data:
        cfg = _build(schema, dict(data), base=cfg)
    over = parse_overrides(overrides)
    if over:
        cfg = _build(schema, over, base=cfg)
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Return the config as plain nested dicts/lists (YAML- and JSON-serialisable)."""
    def plain(v: Any) -> Any:
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        if isinstance(v, list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(dataclasses.asdict(cfg))


def save_config(cfg: Any, path: str | Path) -> Path:
    """Write ``cfg`` as YAML to ``path`` (parents created); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        yaml.safe_dump(config_to_dict(cfg), fh, sort_keys=False)
    tmp.replace(path)
    return path
