"""The SFT mixture spec: ``SOURCE[@SPLIT][#FORMAT][:WEIGHT],...`` parsed into :class:`SourceSpec` s.

The grammar and what each source may be are in :mod:`codechat.data.mixture`'s docstring; both the
mixture and :mod:`codechat.data.provenance` (what decontamination must check) read specs through here.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from codechat.config.sft import SFT_FORMATS
from codechat.config.stages import ConfigError
from codechat.data.benchmarks import CONVERSATION_SPLITS
from codechat.data.readers import data_files


@dataclass(frozen=True)
class SourceSpec:
    """One item of a mixture spec."""

    source: str
    weight: float = 1.0
    format: str = "auto"
    split: str = ""  # a local file's conversation split (data.benchmarks.conversation_split): train | heldout


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_spec(spec: str) -> list[SourceSpec]:
    """The items of ``SOURCE[@SPLIT][#FORMAT][:WEIGHT],...``, validated (``@train`` / ``@heldout``:
    one part of a local file by :func:`codechat.data.benchmarks.conversation_split`).

    Raises:
        ConfigError: an empty item, an unknown format or split, a negative or non-finite weight, or all
            weights zero.
    """
    if not spec or not spec.strip():
        raise ConfigError("the data spec is empty; give --data SOURCE[:WEIGHT],...")
    out = []
    for k, item in enumerate(spec.split(",")):
        item = item.strip()
        if not item:
            raise ConfigError(f"data spec {spec!r}: item {k + 1} is empty")
        head, sep, tail = item.rpartition(":")
        source, weight = (head, float(tail)) if sep and head and _is_number(tail) else (item, 1.0)
        fmt, split = "auto", ""
        if "#" in source and not Path(source).exists():
            source, _, fmt = source.rpartition("#")
            if fmt not in SFT_FORMATS:
                raise ConfigError(f"data spec item {item!r}: unknown format {fmt!r} after '#'; known: "
                                  f"{', '.join(SFT_FORMATS)}")
        if "@" in source and not source.startswith("hf:") and not Path(source).exists():
            source, _, split = source.rpartition("@")
            if split not in CONVERSATION_SPLITS:
                raise ConfigError(f"data spec item {item!r}: unknown split {split!r} after '@'; a local file "
                                  f"takes {' or '.join(CONVERSATION_SPLITS)} (data.benchmarks.conversation_split)")
        if not math.isfinite(weight):
            raise ConfigError(f"data spec item {item!r}: the weight {tail} is not a finite number (non-finite weight)")
        if weight < 0:
            raise ConfigError(f"data spec item {item!r}: negative weight {weight}; weights must be >= 0")
        out.append(SourceSpec(source.strip(), weight, fmt, split))
    if not any(s.weight > 0 for s in out):
        raise ConfigError(f"data spec {spec!r}: all weights are zero; give at least one source a positive weight")
    return out


def missing_sources(spec: str, base_dir: str | os.PathLike | None = None, flag: str = "--data") -> list[str]:
    """One message per local source of ``spec`` (any weight; ``mine:DIR`` too) that does not exist or holds no data;
    ``flag``: the option the messages name.

    Cheap (no record is read), so a stage can report missing inputs before any other work.

    Raises:
        ConfigError: the spec itself is malformed (see :func:`parse_spec`).
    """
    out = []
    for item in parse_spec(spec):
        if item.source.startswith("hf:"):
            continue
        if item.source.startswith("mine:"):
            where = item.source[len("mine:"):]
            if where and not Path(resolve_path(where, base_dir)).is_dir():
                out.append(f"data source {item.source!r} ({flag}): directory {where!r} does not exist; fix the path")
            continue
        try:
            data_files(resolve_path(item.source, base_dir))
        except ValueError as e:
            out.append(f"{e} ({flag}); fix the path or remove it from the spec")
    return out


def resolve_path(path: str, base_dir: str | os.PathLike | None) -> str:
    """``path`` (``~`` expanded) against ``base_dir`` unless absolute or ``base_dir`` is None."""
    p = Path(path).expanduser()
    return str(p if p.is_absolute() or base_dir is None else Path(base_dir) / p)


__all__ = ["SourceSpec", "parse_spec", "missing_sources", "resolve_path"]
