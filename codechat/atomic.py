"""Atomic file writes, for every output that a crash must not leave half-written.

The text goes to a temporary name in the target's own directory (the process id in it, so two
writers never share one) and is renamed over the target with ``os.replace``, which is atomic on
POSIX: a reader sees the old file or the new one, never a part. Checkpoint directories are
written the same way by :mod:`codechat.checkpoint`.
"""
from __future__ import annotations

import os
from pathlib import Path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, creating its directory; returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f"{p.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)
    return p
