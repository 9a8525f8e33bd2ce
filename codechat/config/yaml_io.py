"""Configuration I/O, for any frozen config dataclass: build one from nested mappings (types
converted, unknown keys refused), load it from defaults <- a YAML file <- dotted CLI overrides,
write it back as YAML. The dataclasses themselves are in :mod:`codechat.config.stages`.
"""
from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

class ConfigError(ValueError):
    """A setting is invalid; the message names it and says what to do."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain nested dict (tuples become lists) suitable for YAML/JSON."""
    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in fields(v)}
        if isinstance(v, tuple):
            return [conv(x) for x in v]
        return v
    return conv(cfg)


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """Convert a YAML/CLI value to the annotated type of field ``name``."""
    origin = typing.get_origin(tp)
    try:
        if tp is bool:
            if isinstance(value, str):
                low = value.lower()
                _check(low in ("1", "0", "true", "false", "yes", "no"), f"{name}: expected true/false, got {value!r}")
                return low in ("1", "true", "yes")
            return bool(value)
        if tp is int:
            if isinstance(value, str):
                return int(float(value)) if ("e" in value.lower() and "." not in value) else int(value)
            _check(float(value).is_integer(), f"{name}: expected an integer, got {value!r}")
            return int(value)
        if tp is float:
            return float(value)
        if tp is str:
            return str(value)
        if origin is tuple:
            if isinstance(value, str):
                value = [v for v in value.split(",") if v]
            return tuple(str(v) for v in value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{name}: cannot read {value!r} as {getattr(tp, '__name__', tp)} ({e})") from None
    return value


def build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Construct dataclass ``cls`` from a nested mapping, converting types and rejecting unknown keys.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or a failed validation.
    """
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, val in values.items():
        _check(key in known, f"unknown setting {prefix}{key}; known: {', '.join(prefix + k for k in known)}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            base = to_dict(known[key].default_factory()) if known[key].default_factory is not dataclasses.MISSING else {}
            kwargs[key] = build(tp, {**base, **(val or {})}, prefix + key + ".")
        else:
            kwargs[key] = _coerce(val, tp, prefix + key)
    return cls(**kwargs)


def load(cls: type, path: str | os.PathLike | None = None, overrides: dict[str, Any] | None = None,
         base: Any = None) -> Any:
    """Config ``cls`` from defaults (or ``base``), then a YAML file, then dotted overrides.

    ``overrides`` maps dotted names (``"optim.lr"``) to values (strings from the CLI are
    converted to the field's type).

    A field that is derived from others (``model.head_dim`` from ``n_embd // n_head``, see
    ``DERIVED`` on a config class) is derived again when one of its inputs is set in a later
    layer than the field itself: ``--model.n_head 4`` on the ``tiny`` preset (2 heads of 48) gives
    4 heads of 24, not 4 heads of a stale 48.

    Raises:
        ConfigError: missing/invalid YAML file, unknown setting or failed validation.
    """
    tree: dict[str, Any] = to_dict(base if base is not None else cls())
    layer: dict[str, int] = {}  # dotted key -> 1 when set by the YAML file, 2 by an override
    if path:
        p = Path(path)
        _check(p.is_file(), f"--config {p}: file not found")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"--config {p}: not valid YAML ({e})") from None
        _check(isinstance(data, dict), f"--config {p}: expected a mapping of sections at the top level")
        _merge(tree, data, str(p))
        layer.update(dict.fromkeys(_dotted_keys(data), 1))
    layer.update(dict.fromkeys(overrides or {}, 2))
    for dotted, val in (overrides or {}).items():
        node = tree
        *parents, leaf = dotted.split(".")
        for part in parents:
            _check(isinstance(node.get(part), dict), f"unknown setting --{dotted}")
            node = node[part]
        _check(leaf in node, f"unknown setting --{dotted}")
        node[leaf] = val
    _rederive(cls, tree, layer)
    return build(cls, tree)


def _dotted_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    return [k for key, v in data.items()
            for k in (_dotted_keys(v, f"{prefix}{key}.") if isinstance(v, dict) else [f"{prefix}{key}"])]


def _rederive(cls: type, tree: dict[str, Any], layer: dict[str, int], prefix: str = "") -> None:
    """Reset to 0 (derive again) each derived field of ``tree`` whose inputs were set later than it."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if dataclasses.is_dataclass(hints[f.name]) and isinstance(tree.get(f.name), dict):
            _rederive(hints[f.name], tree[f.name], layer, f"{prefix}{f.name}.")
    for name, inputs in getattr(cls, "DERIVED", {}).items():
        if max(layer.get(prefix + i, 0) for i in inputs) > layer.get(prefix + name, 0):
            tree[name] = 0


def _merge(dst: dict[str, Any], src: dict[str, Any], where: str) -> None:
    for k, v in src.items():
        _check(k in dst, f"{where}: unknown setting {k!r}; known: {', '.join(dst)}")
        if isinstance(dst[k], dict):
            _check(isinstance(v, dict), f"{where}: {k} must be a mapping")
            _merge(dst[k], v, where)
        else:
            dst[k] = v


def save_yaml(cfg: Any, path: str | os.PathLike) -> None:
    """Write ``cfg`` as YAML atomically (temp name, then rename)."""
    from codechat.config.atomic import write_text
    write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def parse_overrides(args: list[str]) -> dict[str, str]:
    """``["--optim.lr", "3e-4", "--train.compile=true"]`` -> ``{"optim.lr": "3e-4", "train.compile": "true"}``.

    Raises:
        ConfigError: an argument that is not a dotted ``--section.field`` or lacks a value.
    """
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        _check(a.startswith("--") and "." in a, f"unrecognised argument {a!r}; settings look like --optim.lr 3e-4")
        if "=" in a:
            k, v = a[2:].split("=", 1)
            i += 1
        else:
            _check(i + 1 < len(args), f"{a} needs a value")
            k, v = a[2:], args[i + 1]
            i += 2
        out[k] = v
    return out


__all__ = ["ConfigError", "to_dict", "build", "load", "save_yaml", "parse_overrides"]
