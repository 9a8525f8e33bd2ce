"""Atomic file writes, for every output that a crash must not leave half-written.

The text goes to a temporary name in the target's own directory (the process id in it, so two
writers never share one) and is renamed over the target with ``os.replace``, which is atomic on
POSIX: a reader sees the old file or the new one, never a part. Whole directories (exports,
imports) are written under ``.tmp-NAME`` beside the target and renamed the same way
(:func:`write_dir`); training checkpoints by :mod:`codechat.checkpoint`.

Files keep the mode a plain ``open()`` gives, ``0o666 & ~umask`` (``-rw-r--r--`` under the usual
umask 022): :func:`write_dir` sets it on every file written into the directory, since some writers
create theirs private (safetensors' ``save_file`` makes ``0o600``, as ``tempfile.mkstemp`` does).
"""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator


def current_umask() -> int:
    """This process's umask (e.g. ``0o022``): from ``/proc/self/status`` on Linux, else set and
    restored at once with ``os.umask``."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def usual_modes(root: str | os.PathLike) -> None:
    """Give every file under ``root`` the mode a plain ``open()`` would have created, ``0o666 &
    ~umask`` (an executable file, one with any execute bit: ``0o777 & ~umask``); directories and
    links are left as they are."""
    mask = current_umask()
    for folder, _, files in os.walk(root):
        for name in files:
            f = os.path.join(folder, name)
            if os.path.islink(f):
                continue
            os.chmod(f, (0o777 if os.stat(f).st_mode & 0o111 else 0o666) & ~mask)


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
    an error its files get the usual mode (:func:`usual_modes`) and it replaces ``path`` (an earlier
    one is removed first). After an error ``path`` is as it was and the partial ``.tmp-NAME`` is
    left for inspection (the next call clears it)."""
    dst = Path(path)
    tmp = dst.parent / f".tmp-{dst.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    usual_modes(tmp)
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)
