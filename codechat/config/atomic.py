"""Atomic file writes, for every output that a crash must not leave half-written.

The text goes to a temporary name in the target's own directory (the process id in it, so two
writers never share one) and is renamed over the target with ``os.replace``, which is atomic on
POSIX: a reader sees the old file or the new one, never a part. Whole directories (exports,
imports) are written under ``.tmp-NAME`` beside the target and renamed the same way
(:func:`write_dir`); training checkpoints by :mod:`codechat.checkpoint`.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, creating its directory; returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f"{p.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)
    return p


@contextlib.contextmanager
def write_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty ``.tmp-NAME`` directory beside ``path`` to fill; when the block ends without
    an error it replaces ``path`` (an earlier one is removed first). After an error ``path`` is as
    it was and the partial ``.tmp-NAME`` is left for inspection (the next call clears it)."""
    dst = Path(path)
    tmp = dst.parent / f".tmp-{dst.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)
