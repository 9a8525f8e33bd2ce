"""The files of a distillation directory: append-only answers, rejections, the summary, and a lock.

:class:`AnswerStore` is what :mod:`codechat.data.teacher` writes through (the line layouts are
in :mod:`codechat.data.prompts` and :mod:`codechat.data.teacher`). Each line is written whole
with one ``write`` and flushed, so a killed run leaves every answer it wrote; an unfinished last
line (a write cut by a crash or power loss) is completed when it is whole JSON and removed
otherwise when the store opens. ``DIR/.lock`` (``flock``) keeps a second run from writing the
same directory at once; the kernel drops it when its process dies, ``kill -9`` included.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from codechat.chat.conversation import Conversation
from codechat.config.atomic import write_text
from codechat.config.stages import ConfigError
from codechat.data.prompts import COMPLETIONS, REJECTED, SUMMARY, jsonl_rows

#: The summary is rewritten at most this often while answers arrive (and always at the end).
SUMMARY_EVERY_S = 1.0
#: What replaces the API key in any text that is stored.
REDACTED = "[api key]"
_TAIL_BLOCK = 1 << 16


@dataclass(frozen=True)
class Prompt:
    """One prompt to answer: its id (:func:`codechat.data.prompts.prompt_id`) and conversation (ends at a user turn)."""

    id: str
    conversation: Conversation


@dataclass
class RunStats:
    """This run's counts (``summary.json``'s ``this_run``; documented in :mod:`codechat.data.teacher`)."""

    requests: int = 0
    retries: Counter = field(default_factory=Counter)
    kept: int = 0
    rejected: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    skipped: int = 0
    interrupted: bool = False
    started: float = field(default_factory=time.monotonic)

    def retry(self, reason: str) -> None:
        self.retries[reason] += 1

    def postfix(self) -> dict[str, int]:
        """The progress bar's counters."""
        return {"kept": self.kept, "rejected": sum(self.rejected.values()), "failed": sum(self.failed.values()),
                "retries": sum(self.retries.values())}

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "retries": dict(self.retries), "kept": self.kept,
                "rejected": dict(self.rejected), "failed": dict(self.failed), "skipped": self.skipped,
                "wall_s": round(time.monotonic() - self.started, 3), "interrupted": self.interrupted}


def repair_tail(path: Path) -> None:
    """Make ``path`` end with a newline: a whole-JSON last line gets its newline, a cut one is removed."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
        end = f.tell()
        pos, tail = end, b""
        while pos > 0 and b"\n" not in tail:  # read back to the last newline, a block at a time
            step = min(_TAIL_BLOCK, pos)
            pos -= step
            f.seek(pos)
            tail = f.read(step) + tail
        cut = tail.rfind(b"\n") + 1  # 0: the whole file is one unfinished line
        try:
            json.loads(tail[cut:])
        except ValueError:
            f.truncate(pos + cut)
            return
        f.seek(end)
        f.write(b"\n")


class AnswerStore:
    """``DIR/completions.jsonl``, ``DIR/rejected.jsonl`` and ``DIR/summary.json`` of one distillation.

    Use as a context manager (it takes the directory's lock and opens the files). ``secret`` (the
    API key) is replaced by :data:`REDACTED` in everything written.

    Args:
        out: the directory.
        ids: this run's prompt ids (the summary counts them).
        teacher: model and generation settings; a directory made with others is refused.
        settings: the whole teacher configuration, recorded in the summary.

    Raises:
        ConfigError: another run holds the directory, or it was made with another teacher setting.
    """

    def __init__(self, out: Path, ids: list[str], teacher: dict[str, Any], settings: dict[str, Any],
                 secret: str | None = None) -> None:
        self.out, self.ids, self.teacher, self.settings, self.secret = out, ids, teacher, settings, secret
        self.stats = RunStats()
        self.kept: set[str] = set()
        self.last_rejection: dict[str, tuple[str, bool]] = {}  # id -> (reason, final) of its latest rejection
        self.tokens = Counter(prompt=0, completion=0)
        self._files: dict[str, TextIO] = {}
        self._lock: TextIO | None = None
        self._summary_at = 0.0

    def __enter__(self) -> AnswerStore:
        self.out.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.out / ".lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise ConfigError(f"{self.out} is being written by another codechat distill; wait for it or give "
                              "another --out") from None
        saved = self._saved_teacher()
        if saved is not None and saved != {k: self.teacher.get(k) for k in saved}:
            self.close()
            raise ConfigError(f"{self.out} holds answers of another teacher setting (saved {saved}, now "
                              f"{self.teacher}); give a new --out, or the settings it was made with")
        for name in (COMPLETIONS, REJECTED):
            repair_tail(self.out / name)
            if (self.out / name).is_file():
                for _, _, obj in jsonl_rows(self.out / name):
                    self._count(name, obj)
            self._files[name] = open(self.out / name, "a", encoding="utf-8")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        if self._lock is not None:
            self._lock.close()  # closing the file drops the flock
            self._lock = None

    def _saved_teacher(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.out / SUMMARY).read_text())["teacher"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _count(self, name: str, obj: dict[str, Any]) -> None:
        usage = obj.get("usage") or {}
        self.tokens["prompt"] += int(usage.get("prompt_tokens") or 0)
        self.tokens["completion"] += int(usage.get("completion_tokens") or 0)
        if name == COMPLETIONS:
            self.kept.add(obj["id"])
        else:
            self.last_rejection[obj["id"]] = (str(obj.get("reason")), bool(obj.get("final")))

    def done(self, pid: str) -> bool:
        """Kept, or rejected for good: a rerun does not ask again."""
        return pid in self.kept or self.last_rejection.get(pid, ("", False))[1]

    def _append(self, name: str, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, ensure_ascii=False)
        if self.secret:
            line = line.replace(self.secret, REDACTED)
        f = self._files[name]
        f.write(line + "\n")
        f.flush()  # in the kernel now: a killed process loses nothing it wrote
        self._count(name, obj)
        if time.monotonic() - self._summary_at >= SUMMARY_EVERY_S:
            self.write_summary()

    def keep(self, pid: str, answer: list[dict[str, Any]], **meta: Any) -> None:
        """Append a kept answer (``meta``: finish_reason, usage, model)."""
        self.stats.kept += 1
        self._append(COMPLETIONS, {"id": pid, "answer": answer, **meta})

    def reject(self, pid: str, reason: str, *, final: bool, detail: str = "", **meta: Any) -> None:
        """Append a rejection; ``final`` False (a request that kept failing) is asked again by the next run."""
        (self.stats.rejected if final else self.stats.failed)[reason] += 1
        self._append(REJECTED, {"id": pid, "reason": reason, "final": final, "detail": detail[:2000], **meta})

    def summary(self) -> dict[str, Any]:
        """The counts of ``summary.json`` (see :mod:`codechat.data.teacher`)."""
        rejected, failed = Counter(), Counter()
        for pid in self.ids:
            if pid not in self.kept and pid in self.last_rejection:
                reason, final = self.last_rejection[pid]
                (rejected if final else failed)[reason] += 1
        kept = sum(pid in self.kept for pid in self.ids)
        return {"prompts": len(self.ids), "kept": kept, "rejected": dict(rejected), "failed": dict(failed),
                "pending": len(self.ids) - kept - sum(rejected.values()), "tokens": dict(self.tokens),
                "teacher": self.teacher, "settings": self.settings, "this_run": self.stats.as_dict()}

    def write_summary(self) -> dict[str, Any]:
        """Write ``summary.json`` atomically; returns it."""
        s = self.summary()
        text = json.dumps(s, indent=1, ensure_ascii=False)
        write_text(self.out / SUMMARY, text.replace(self.secret, REDACTED) if self.secret else text)
        self._summary_at = time.monotonic()
        return s


__all__ = ["Prompt", "RunStats", "AnswerStore", "repair_tail", "SUMMARY_EVERY_S", "REDACTED"]
