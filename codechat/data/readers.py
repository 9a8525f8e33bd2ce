"""Data files and Hugging Face datasets -> ``(line, record)`` rows, streamed; bad rows raised or counted.

Files: ``.jsonl`` (``line`` is the 1-based line number), ``.json`` (JSON Lines when its first line
is a whole JSON object and a second line follows - read line by line like ``.jsonl``; otherwise an
array, or an object with a ``data`` array, read whole; ``line`` is the 1-based record index),
``.parquet`` (needs ``pyarrow``; read ``PARQUET_BATCH_ROWS`` rows at a time; ``line`` is the
1-based row), each optionally ``.gz`` (a gzipped Parquet file is read whole: Parquet needs random
access; it compresses internally, so store it without ``.gz``). A directory means every such file
under it, sorted. ``hf:ORG/NAME[:CONFIG][@SPLIT]`` is a dataset read through ``datasets``
(split default ``train``; ``line`` is the 1-based row), streamed on request.

Memory: JSON Lines and plain Parquet hold one line / one batch of rows at a time, whatever the
file size; a ``.json`` array or a gzipped Parquet file is held whole.

The optional packages (``pyarrow``, ``datasets``; ``pip install 'codechat[data]'``) are imported
only when a Parquet file or a dataset is read; without them the error says what to install.
"""
from __future__ import annotations

import gzip
import importlib
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

#: File name endings read (each also with ``.gz``).
EXTENSIONS: tuple[str, ...] = (".jsonl", ".json", ".parquet")
#: Rows of a Parquet file converted to Python objects at a time (bounds memory on large files).
PARQUET_BATCH_ROWS = 1024
#: What to install for the optional readers.
DATA_EXTRA = "pip install 'codechat[data]'"
HUB_PREFIX = "hf:"

T = TypeVar("T")


class FormatError(ValueError):
    """A data file or record cannot be read; the message names the file, the line and the field."""


class BadRecordError(FormatError):
    """One record fits no format, lacks a field or holds invalid values: what ``skip_bad`` skips."""


class BadRow(Exception):
    """A problem with one row: ``reason`` is the counter name (``bad_json``, ``no_format``,
    ``missing_field``, ``invalid``), the message the explanation (without file and line)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class LoadCounts:
    """Records read and records skipped (by reason) with ``skip_bad``; ``examples`` holds the first few errors."""

    records: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def skip(self, reason: str, message: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if len(self.examples) < 3:
            self.examples.append(message)

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())

    def as_dict(self) -> dict[str, Any]:
        return {"records": self.records, "skipped": dict(self.skipped), "examples": list(self.examples)}


def record_field(rec: Any, what: str, *names: str, kind: type | tuple[type, ...] = str) -> Any:
    """The first of ``names`` present (not None) in the record ``rec`` (a mapping), of type ``kind``.

    ``what`` names the record kind in messages (``"alpaca record"``, ...).

    Raises:
        BadRow: ``missing_field`` naming the fields looked for and those present, or ``invalid``
            (a value of another type, or a record that is not an object).
    """
    if not isinstance(rec, Mapping):
        raise BadRow("invalid", f"a {what} must be a JSON object, got {type(rec).__name__}")
    for name in names:
        value = rec.get(name)
        if value is not None:
            if not isinstance(value, kind):
                want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
                raise BadRow("invalid", f"field {name!r} of a {what} must be {want}, got {type(value).__name__}")
            return value
    raise BadRow("missing_field", f"{what} has no field {' or '.join(repr(n) for n in names)} "
                                  f"(fields present: {', '.join(sorted(rec)) or 'none'})")


def checked_rows(rows: Iterable[tuple[int, Any]], source: str, convert: Callable[[Any], T], *,
                 skip_bad: bool = False, counts: LoadCounts | None = None) -> Iterator[tuple[int, Any, T]]:
    """``(line, row, convert(row))`` for each row that ``convert`` accepts.

    A row that is a :class:`BadRow` (an unparsable line) or that ``convert`` rejects with one
    raises :class:`BadRecordError` ``"SOURCE:LINE: what is wrong"`` - or, with ``skip_bad``, is
    counted in ``counts.skipped`` by reason (the first messages in ``counts.examples``) and left out.
    """
    counts = counts if counts is not None else LoadCounts()
    for line, value in rows:
        try:
            if isinstance(value, BadRow):
                raise value
            out = convert(value)
        except BadRow as e:
            message = f"{source}:{line}: {e}"
            if not skip_bad:
                raise BadRecordError(message) from None
            counts.skip(e.reason, message)
            continue
        counts.records += 1
        yield line, value, out


# ----------------------------------------------------------------------------- files
def require(module: str, what: str) -> Any:
    """``importlib.import_module(module)``, or a :class:`FormatError` saying ``what`` needs :data:`DATA_EXTRA`."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise FormatError(f"{what} needs the `{module.partition('.')[0]}` package, which is not installed: "
                          f"{DATA_EXTRA}") from None


def _stem(path: Path) -> str:
    name = path.name.lower()
    return name[:-3] if name.endswith(".gz") else name


def is_data_file(path: Path) -> bool:
    """A file this module reads (by its name)."""
    return _stem(path).endswith(EXTENSIONS)


def is_parquet(path: Path) -> bool:
    return _stem(path).endswith(".parquet")


def data_files(path: str | os.PathLike) -> list[Path]:
    """``[path]`` for a file, or every data file under a directory (sorted, hidden entries skipped).

    Raises:
        FormatError: the path does not exist, or a directory holds no data file.
    """
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FormatError(f"data source {str(path)!r} does not exist")
    files = sorted(f for f in p.rglob("*") if f.is_file() and is_data_file(f)
                   and not any(part.startswith(".") for part in f.relative_to(p).parts))
    if not files:
        raise FormatError(f"data directory {str(path)!r} holds no {'/'.join(EXTENSIONS)} file (optionally .gz)")
    return files


def _open_binary(path: Path) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    with _open_binary(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    value = json.loads(line)
                except (ValueError, RecursionError) as e:  # not UTF-8 JSON, or past the decoder (depth, digits)
                    value = BadRow("bad_json", f"not valid JSON ({type(e).__name__}: {e})")
                yield n, value


def _is_json_lines(path: Path) -> bool:
    """Whether a ``.json`` file is JSON Lines: a first non-blank line that is a whole object, then another line."""
    with _open_binary(path) as raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace") as f:
        lines = (line for line in f if line.strip())
        first = next(lines, "")
        try:
            is_object = isinstance(json.loads(first), dict)
        except (ValueError, RecursionError):
            return False
        return is_object and next(lines, None) is not None


def read_rows(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """``(line, value)`` of every record of one file; a JSON line that is not JSON gives a :class:`BadRow`.

    Raises:
        FormatError: unsupported extension, a ``.json`` file that is not JSON, or ``pyarrow`` missing.
    """
    p = Path(path)
    stem = _stem(p)
    if stem.endswith(".jsonl") or (stem.endswith(".json") and _is_json_lines(p)):
        yield from _json_lines(p)
    elif stem.endswith(".json"):
        with _open_binary(p) as raw:
            try:
                data = json.loads(raw.read().decode("utf-8"))
            except (ValueError, RecursionError) as e:
                raise FormatError(f"{p}: not a valid JSON file ({type(e).__name__}: {e})") from None
        if isinstance(data, Mapping):
            data = data["data"] if isinstance(data.get("data"), list) else [data]
        if not isinstance(data, list):
            raise FormatError(f"{p}: expected a JSON array of records, got {type(data).__name__}")
        yield from enumerate(data, 1)
    elif stem.endswith(".parquet"):
        pq = require("pyarrow.parquet", f"{p}: reading a .parquet file (or convert it to .jsonl)")
        n = 0
        with _open_binary(p) as raw:
            source = io.BytesIO(raw.read()) if p.name.lower().endswith(".gz") else raw
            for batch in pq.ParquetFile(source).iter_batches(batch_size=PARQUET_BATCH_ROWS):
                for row in batch.to_pylist():
                    n += 1
                    yield n, row
    else:
        raise FormatError(f"{p}: unsupported file type; use {', '.join(EXTENSIONS)} (optionally .gz)")


# ----------------------------------------------------------------------------- Hugging Face datasets
def parse_hub_name(name: str) -> tuple[str, str | None, str]:
    """``(path, config or None, split)`` of ``hf:ORG/NAME[:CONFIG][@SPLIT]`` (split default ``train``).

    Raises:
        FormatError: not of that form.
    """
    if not name.startswith(HUB_PREFIX):
        raise FormatError(f"data source {name!r}: expected {HUB_PREFIX}ORG/NAME[:CONFIG][@SPLIT]")
    rest, at, split = name[len(HUB_PREFIX):].rpartition("@")
    if not at:
        rest, split = name[len(HUB_PREFIX):], "train"
    path, _, config = rest.partition(":")
    if not path or not split:
        raise FormatError(f"data source {name!r}: expected {HUB_PREFIX}ORG/NAME[:CONFIG][@SPLIT]")
    return path, config or None, split


def hub_rows(name: str, *, streaming: bool = False) -> Iterator[tuple[int, Any]]:
    """``(row, record)`` of ``hf:ORG/NAME[:CONFIG][@SPLIT]`` through ``datasets.load_dataset``.

    ``streaming`` reads the rows as they arrive (nothing held, nothing cached on disk) instead of
    downloading and caching the whole split first. ``ORG/NAME`` may also be a local directory of
    data files, as ``datasets`` allows.

    Raises:
        FormatError: a malformed name, ``datasets`` not installed, or ``datasets`` failed to open it.
    """
    path, config, split = parse_hub_name(name)
    datasets = require("datasets", f"data source {name!r}")
    try:
        ds = datasets.load_dataset(path, config, split=split, streaming=streaming)
    except Exception as e:  # network, missing dataset/config/split: one error naming the source
        raise FormatError(f"data source {name!r} could not be loaded by datasets: {e}") from e
    for k, row in enumerate(ds, 1):
        yield k, dict(row)


__all__ = ["EXTENSIONS", "PARQUET_BATCH_ROWS", "DATA_EXTRA", "HUB_PREFIX", "FormatError", "BadRecordError", "BadRow",
           "LoadCounts", "record_field", "checked_rows", "require", "is_data_file", "is_parquet", "data_files",
           "read_rows", "parse_hub_name", "hub_rows"]
