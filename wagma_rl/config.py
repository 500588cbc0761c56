"""Typed run configuration: dataclass schemas filled from YAML files and ``a.b=value`` overrides.

A schema is a (nested) dataclass whose fields all have defaults; a numeric field declares its range
beside it, ``x: int = ranged(1, ">= 1")`` (``"> 0"``, ``">= 1"``, ``"[0, 1]"``, ``"[0, 1)"``, ...: the
field's metadata), checked for every file and override; a section class lists the sections of the
other entry point's schema in ``FOREIGN`` (key -> what to run instead); it may list keys
that moved elsewhere in a ``RENAMED`` class attribute (old key -> where it is now) and values that
were renamed in ``RENAMED_VALUES`` (key -> {old value: new value}). Such an old spelling is refused,
never translated: the file gets a one-line message that names the new key or value (instead of the
list of valid ones), and the resolved config a run saves holds one spelling only. The one exception
is a top-level schema's ``LEGACY`` (old dotted key -> new dotted key, or a function of the config
built so far that returns it): keys moved in this release, still read for one release; each one
read gives a rename note (:func:`config_notes`, which the run's log shows), not an error. :func:`load_config` starts from the
defaults, applies a YAML file, then command-line overrides, and checks every key and type on the way,
so a typo or a wrong type stops the run before any work with a message that names the key and lists
the valid ones. :func:`save_config` writes the resolved config back as YAML (reloadable with
:func:`load_config`); :func:`format_config` gives that YAML as text, with ``explain`` each key's
meaning as a comment above it (the docstring under its field, :func:`field_docs`).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Union

import yaml

__all__ = ["ConfigError", "load_config", "save_config", "config_to_dict", "format_config",
           "field_docs", "parse_overrides", "check_ranges", "ranged", "config_notes",
           "foreign_checkpoint", "CommandLine"]


class ConfigError(ValueError):
    """A configuration key is unknown, has the wrong type, or an override is malformed."""


def ranged(default: Any, spec: str) -> Any:
    """A dataclass field with ``default`` whose value must lie in ``spec`` (``"> 0"``, ``">= 1"``,
    ``"[0, 1)"``, ...); :func:`load_config` refuses a value outside it, naming the key. ``None``,
    where the field allows it, is not checked."""
    _in_range(0.0, spec)  # a malformed spec fails at import, not at a user's run
    return dataclasses.field(default=default, metadata={"range": spec})


def config_notes(cfg: Any) -> list[str]:
    """The lines :func:`load_config` has for the run's log about reading ``cfg``: one line naming
    the old keys it translated and their new names (empty when every key had its current
    spelling)."""
    return list(getattr(cfg, "_config_notes", ()))


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
        real = [a for a in args if a is not type(None)]
        if all(typing.get_origin(a) is Literal for a in real):  # e.g. Literal["nesterov"] | None
            choices = [c for a in real for c in typing.get_args(a)]
            empty = " (or empty)" if type(None) in args else ""
            raise ConfigError(f"config key '{key}': {value!r} is not one of {choices}{empty}")
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
    foreign = getattr(cls, "FOREIGN", {})
    for k in unknown:
        if k in foreign:
            raise ConfigError(f"config key '{prefix}{k}' is not a key of this job: {foreign[k]}")
        if k in moved:
            raise ConfigError(f"config key '{prefix}{k}' has moved: use {moved[k]} (edit the config "
                              "file, or the config.yaml of a run folder written before the move)")
    if unknown:
        where = f"section '{prefix[:-1]}'" if prefix else "the top level"
        raise ConfigError(f"unknown config key '{prefix}{unknown[0]}'; valid keys in {where}: "
                          f"{', '.join(sorted(fields))}")
    renamed = getattr(cls, "RENAMED_VALUES", {})
    for k, value in data.items():
        if isinstance(value, str) and value in renamed.get(k, {}):
            raise ConfigError(f"config key '{prefix}{k}': {value!r} has been renamed: use "
                              f"{prefix}{k}={renamed[k][value]} (edit the config file, or the "
                              "config.yaml of a run folder written before the rename)")
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


class CommandLine(argparse.ArgumentParser):
    """An entry point's command-line parser: ``key=value`` overrides may stand before, between or
    after the flags (:meth:`parse_args` is argparse's ``parse_intermixed_args``), and a usage
    error is one line and exit status 2, as every other refusal of the entry points (argparse
    prints the whole usage first; ``--help`` still shows it)."""

    def parse_args(self, args=None, namespace=None):
        return self.parse_intermixed_args(args, namespace)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def foreign_checkpoint(schema: type, state: Mapping[str, Any], path: str | Path) -> str | None:
    """Why the checkpoint ``state`` (read from ``path``) is not one of ``schema``'s jobs, naming
    the entry point that continues it (its saved config has a section of ``schema.FOREIGN``), or
    None."""
    foreign = getattr(schema, "FOREIGN", {})
    section = next((k for k in (state.get("config") or {}) if k in foreign), None)
    if section is None:
        return None
    return (f"checkpoint {str(path)!r} was not written by this kind of job; its config's section "
            f"'{section}': {foreign[section]}")


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

    Raises :class:`ConfigError` naming the key when one is unknown, has the wrong type or is outside
    the range its section declares.
    """
    if not dataclasses.is_dataclass(schema):
        raise TypeError(f"schema must be a dataclass type, got {schema!r}")
    cfg, notes = _build(schema, {}), []
    if path is not None:
        cfg = _build(schema, _translate(schema, _read_yaml(path), cfg, notes), base=cfg)
    if data:
        cfg = _build(schema, _translate(schema, dict(data), cfg, notes), base=cfg)
    over = parse_overrides(overrides)
    if over:
        cfg = _build(schema, _translate(schema, over, cfg, notes), base=cfg)
    check_ranges(cfg)
    renamed = ", ".join(dict.fromkeys(notes))
    object.__setattr__(cfg, "_config_notes", [
        f"renamed config keys, read until the next release (rename them in the config file): "
        f"{renamed}"] if notes else [])
    return cfg


def _translate(schema: type, data: dict[str, Any], base: Any, notes: list[str]) -> dict[str, Any]:
    """``data`` with the keys in ``schema.LEGACY`` moved to their new place (a note each)."""
    legacy = getattr(schema, "LEGACY", {})
    if not legacy:
        return data
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for old, new in legacy.items():
        section, key = old.split(".", 1)
        if not isinstance(out.get(section), dict) or key not in out[section]:
            continue
        value = out[section].pop(key)
        if not out[section]:
            del out[section]
        if callable(new):
            new = new(base, data)
        new_section, new_key = new.split(".", 1)
        target = out.setdefault(new_section, {})
        if not isinstance(target, dict):
            raise ConfigError(f"config key '{new_section}' must be a section (it receives the old "
                              f"key '{old}')")
        if new_key in target and target[new_key] != value:
            raise ConfigError(f"config keys '{old}' (old) and '{new}' both given, with different "
                              f"values: keep '{new}' only")
        target[new_key] = value
        notes.append(f"{old} -> {new}")
    return out


def _in_range(value: float, spec: str) -> bool:
    spec = spec.strip()
    if spec[0] in "[(":
        lo, hi = (float(v) for v in spec[1:-1].split(","))
        return ((value >= lo) if spec[0] == "[" else (value > lo)) and \
            ((value <= hi) if spec[-1] == "]" else (value < hi))
    op, bound = spec.split()
    return {">": value > float(bound), ">=": value >= float(bound),
            "<": value < float(bound), "<=": value <= float(bound)}[op]


def check_ranges(cfg: Any, *, prefix: str = "") -> None:
    """Raise :class:`ConfigError` for the first key outside the range declared beside its field
    (:func:`ranged`; None values, where a key allows them, are not checked)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        spec = f.metadata.get("range")
        if dataclasses.is_dataclass(value):
            check_ranges(value, prefix=f"{prefix}{f.name}.")
        elif spec and value is not None and not _in_range(value, spec):
            want = f"in {spec}" if spec[0] in "[(" else spec
            raise ConfigError(f"config key '{prefix}{f.name}': must be {want}, got {value}")


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Return the config as plain nested dicts/lists (YAML- and JSON-serialisable)."""
    return _plain(dataclasses.asdict(cfg))


def _plain(value: Any) -> Any:
    """A config value as plain data: tuples become lists, nested."""
    if isinstance(value, (tuple, list)):
        return [_plain(x) for x in value]
    if isinstance(value, dict):
        return {k: _plain(x) for k, x in value.items()}
    return value


def field_docs(schema: type) -> dict[str, str]:
    """The docstring written under each field of dataclass ``schema`` (inherited fields
    included), by field name; a field without one is left out. Read from the source, so a schema
    whose source cannot be found gives ``{}``."""
    docs: dict[str, str] = {}
    for cls in reversed(schema.__mro__):  # a subclass's docstring wins
        if not dataclasses.is_dataclass(cls):
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
        except (OSError, TypeError, SyntaxError, IndexError, AttributeError):
            continue
        for stmt, after in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def format_config(cfg: Any, *, explain: bool = False) -> str:
    """``cfg`` as the YAML text :func:`save_config` writes (every key with its value, in schema
    order); with ``explain``, each key's docstring (:func:`field_docs`) as ``#`` lines above it,
    which leaves the text valid YAML of the same config."""
    if not explain:
        return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
    return "\n".join(_explained(cfg, indent="")) + "\n"


def _explained(section: Any, *, indent: str) -> list[str]:
    """The YAML lines of dataclass instance ``section``, each key under its docstring."""
    docs, lines = field_docs(type(section)), []
    for f in dataclasses.fields(section):
        lines += [f"{indent}# {line}".rstrip() for line in docs.get(f.name, "").splitlines()]
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            lines += [f"{indent}{f.name}:", *_explained(value, indent=indent + "  ")]
        else:
            text = yaml.safe_dump({f.name: _plain(value)}, sort_keys=False)
            lines += [indent + line for line in text.splitlines()]
    return lines


def save_config(cfg: Any, path: str | Path) -> Path:
    """Write ``cfg`` as YAML to ``path`` (parents created); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(format_config(cfg))
    tmp.replace(path)
    return path
