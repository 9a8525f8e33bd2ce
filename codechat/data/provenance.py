"""Where the records of an SFT mixture spec come from, as far as decontamination cares: the MBPP
files among its sources (their held-out tasks are checked by identity) and the sources of
third-party data that could hold copies of benchmark problems (not pairs mined from Python
source). Only the first record of each file is read.
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from codechat.config.sft import SFTConfig
from codechat.config.stages import ConfigError
from codechat.data.readers import data_files, read_rows
from codechat.data.spec import parse_spec, resolve_path


def mbpp_files(spec: str, cfg: SFTConfig, base_dir: str | os.PathLike | None = None) -> list[str]:
    """The data files of the positive-weight local sources of ``spec`` that hold MBPP records.

    A file counts when its format is forced to ``mbpp`` (``PATH#mbpp`` or ``sft.format``) or, under
    ``auto``, when its first record is detected as ``mbpp``. ``hf:`` sources are not read here.

    Raises:
        ConfigError: a local source does not exist.
    """
    out = []
    for item in parse_spec(spec):
        if item.weight == 0 or item.source.startswith(("hf:", "mine:")):
            continue
        fmt = item.format if item.format != "auto" else cfg.format
        try:
            files = data_files(resolve_path(item.source, base_dir))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        out += [str(f) for f in files if fmt == "mbpp" or (fmt == "auto" and _first_format(f) == "mbpp")]
    return out


#: The ``id`` of a pair :func:`codechat.data.mining.write_mined` wrote: ``FILE.py:LINE`` of the function.
_MINED_ID = re.compile(r"\.py:\d+$")


def third_party_sources(spec: str, cfg: SFTConfig, base_dir: str | os.PathLike | None = None,
                        mbpp: Sequence[str] = ()) -> list[str]:
    """The positive-weight sources of ``spec`` whose records could be copies of benchmark problems,
    as named in the spec: every ``hf:`` source and every local source with a file that is neither
    one of ``mbpp`` (MBPP files, whose held-out tasks are checked by identity: :func:`mbpp_files`)
    nor a file of pairs mined from Python source (:func:`codechat.data.mining.write_mined`'s, known
    by its first record: ``prompt``, ``completion`` and an ``id`` ending in ``.py:LINE``).
    ``mine:`` sources are mined pairs too. Only first records are read.

    Raises:
        ConfigError: a local source does not exist.
    """
    out = []
    for item in parse_spec(spec):
        if item.weight == 0 or item.source.startswith("mine:"):
            continue
        if item.source.startswith("hf:"):
            out.append(item.source)
            continue
        try:
            files = data_files(resolve_path(item.source, base_dir))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if any(str(f) not in mbpp and not _is_mined(f) for f in files):
            out.append(item.source)
    return out


def _is_mined(path: Path) -> bool:
    """Whether the first record of one file is a mined pair (:func:`third_party_sources`)."""
    try:
        first = next((v for _, v in read_rows(path)), None)
    except ValueError:
        return False
    return (isinstance(first, dict) and set(first) == {"prompt", "completion", "id"}
            and _MINED_ID.search(str(first["id"])) is not None)


def _first_format(path: Path) -> str | None:
    """The detected format of the first record of one file (``None``: unreadable, loading reports it)."""
    from codechat.data.formats import detect_format
    try:
        first = next((v for _, v in read_rows(path)), None)
    except ValueError:
        return None
    return detect_format(first) if isinstance(first, dict) else None


__all__ = ["mbpp_files", "third_party_sources"]
