"""Offline SFT data: functions mined from Python source into instruction conversations.

Mining. :func:`mine_records` turns Python source files (by default this Python's standard
library, present on every machine) into instruction conversations, so SFT runs with no download::

    user:      Write a Python function `name(args)` that: <the function's docstring>
    assistant: <the function's source, without its docstring>

With ``style="complete"`` the same function is asked for the way HumanEval asks (Chen et al.
2021; :data:`codechat.data.formats.HUMANEVAL_PROMPT`)::

    user:      Complete the following Python function:\n\n<its def line(s) and docstring>
    assistant: <the rest of the function: its body after the docstring, as indented in the file>

and ``style="both"`` yields both conversations of each function (:data:`MINE_STYLES`).

A function is kept when it is defined at module level without decorators, is not a dunder, has
a docstring of :data:`MIN_DOC_CHARS`..:data:`MAX_DOC_CHARS` characters, a body beyond the
docstring that is not only ``pass`` / ``...`` / ``raise NotImplementedError``, at most
:data:`MAX_FUNCTION_LINES` lines, and a source not seen before (exact duplicates are dropped).

Decontamination of what is mined (and of every other SFT source) is :mod:`codechat.data.decontam`'s.
"""
from __future__ import annotations

import ast
import hashlib
import json
import multiprocessing as mp
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from codechat.chat.conversation import Conversation, Message
from codechat.config.sft import MINE_STYLES
from codechat.data.formats import HUMANEVAL_PROMPT, Record
from codechat.data.sources import collect_files

#: The user turn of a mined pair.
MINED_PROMPT = "Write a Python function `{signature}` that: {doc}"
MIN_DOC_CHARS = 20
MAX_DOC_CHARS = 1500
MAX_FUNCTION_LINES = 60
MINED_FORMAT = "mined"


@dataclass
class MiningCounts:
    """Files read, functions seen and skipped (by reason), and records kept by :func:`mine_records`."""

    files: int = 0
    unparsable_files: int = 0
    functions: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "unparsable_files": self.unparsable_files, "functions": self.functions,
                "kept": self.kept, "skipped": dict(self.skipped)}


def source_lines(text: str) -> list[str]:
    """``text``'s lines as Python counts them (``ast`` line numbers index this list from 1): split at
    ``\n``, ``\r\n`` and ``\r`` only. ``str.splitlines`` also splits at form feeds, ``\x1c``-``\x1e``,
    ``\x85`` and ``\u2028``/``\u2029``, which real sources hold (page breaks, separators in strings);
    every line after one would be off by one, and a function's source sliced by its line numbers
    would be another's (the GPU speedrun's corpus miner died of it: ``SyntaxError`` in ``ast.parse``)."""
    return re.split(r"\r\n|\r|\n", text)


def _trivial(body: Sequence[ast.stmt]) -> bool:
    """Only ``pass``, ``...`` or ``raise NotImplementedError``."""
    for stmt in body:
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        if isinstance(stmt, ast.Raise) and "NotImplementedError" in ast.unparse(stmt):
            continue
        return False
    return True


def _pair(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str], style: str) -> list[tuple[str, str]] | str:
    """The ``(instruction, answer)`` pairs of ``style`` for one function, or the reason it is skipped."""
    if node.name.startswith("__") or node.decorator_list:
        return "decorated_or_dunder"
    doc = ast.get_docstring(node, clean=True)
    if not doc:
        return "no_docstring"
    if not MIN_DOC_CHARS <= len(doc) <= MAX_DOC_CHARS:
        return "docstring_length"
    if node.end_lineno is None or node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
        return "too_long"
    if _trivial(node.body[1:]):
        return "trivial_body"
    doc_node = node.body[0]
    if doc_node.lineno == node.lineno or lines[doc_node.end_lineno - 1][doc_node.end_col_offset:].strip() \
            or lines[doc_node.lineno - 1][:doc_node.col_offset].strip():
        return "docstring_shares_a_line"
    pairs = []
    if style in ("docstring", "both"):
        answer = "\n".join(lines[node.lineno - 1:doc_node.lineno - 1] + lines[doc_node.end_lineno:node.end_lineno])
        signature = f"{node.name}({ast.unparse(node.args)})"
        pairs.append((MINED_PROMPT.format(signature=signature, doc=doc), answer.rstrip()))
    if style in ("complete", "both"):
        head = "\n".join(lines[node.lineno - 1:doc_node.end_lineno])
        body = "\n".join(lines[doc_node.end_lineno:node.end_lineno])
        pairs.append((HUMANEVAL_PROMPT.format(prompt=head + "\n"), body.strip("\n").rstrip()))
    return pairs


#: One function of a mined file: its ``def`` line, the digest of its source and its pairs, or the
#: reason it is skipped.
_Mined = tuple[int, bytes, list[tuple[str, str]]] | str


def _mine_file(path: str, style: str) -> list[_Mined] | None:
    """What one file holds (:func:`_pair` per module-level function), or ``None`` if it does not parse."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in old code
            tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    lines = source_lines(text)
    out: list[_Mined] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            pairs = _pair(node, lines, style)
            if isinstance(pairs, str):
                out.append(pairs)
            else:
                source = "\n".join(lines[node.lineno - 1:node.end_lineno])
                out.append((node.lineno, hashlib.sha256(source.encode("utf-8")).digest(), pairs))
    return out


def mine_records(srcs: Sequence[str | os.PathLike], *, max_files: int = 0, max_examples: int = 0,
                 counts: MiningCounts | None = None, style: str = "docstring", workers: int = 1) -> Iterator[Record]:
    """(docstring -> function) conversations from the ``.py`` files under ``srcs``, in file order.

    Each :class:`Record` has the file as ``source``, the ``def`` line as ``line`` and format
    ``"mined"``. ``style`` is one of :data:`MINE_STYLES` (``both``: two records per function).
    ``max_files`` / ``max_examples`` > 0 stop early (``max_examples`` counts records).
    ``workers`` > 1 parses files in that many spawned processes (0: one per CPU core); the
    records are the same, in the same order, for any number (a script calling this with
    ``workers`` != 1 must do so under ``if __name__ == "__main__":``).

    Raises:
        ConfigError: a source does not exist or holds no ``.py`` file.
        ValueError: an unknown ``style`` or a negative ``workers``.
    """
    if style not in MINE_STYLES:
        raise ValueError(f"mining style must be one of {', '.join(MINE_STYLES)}, got {style!r}")
    if workers < 0:
        raise ValueError(f"mining workers must be >= 0 (0: one per CPU core), got {workers}")
    counts = counts if counts is not None else MiningCounts()
    files = collect_files(srcs, (".py",), max_files)
    paths = [str(f.path) for f in files]
    n = workers or os.cpu_count() or 1
    with ExitStack() as stack:
        if n > 1 and len(paths) > 1:
            pool = stack.enter_context(mp.get_context("spawn").Pool(min(n, len(paths))))
            results = pool.imap(partial(_mine_file, style=style), paths, chunksize=8)
        else:
            results = (_mine_file(p, style) for p in paths)
        seen: set[bytes] = set()
        for path, mined in zip(paths, results):
            counts.files += 1
            if mined is None:
                counts.unparsable_files += 1
                continue
            for item in mined:
                counts.functions += 1
                if isinstance(item, str):
                    counts.skip(item)
                    continue
                line, digest, pairs = item
                if digest in seen:
                    counts.skip("duplicate")
                    continue
                seen.add(digest)
                for prompt, answer in pairs:
                    counts.kept += 1
                    yield Record(Conversation((Message("user", prompt), Message("assistant", answer))), path, line,
                                 MINED_FORMAT)
                    if max_examples and counts.kept >= max_examples:
                        return


def write_mined(srcs: Sequence[str | os.PathLike], paths: Sequence[str | os.PathLike], *, max_files: int = 0,
                style: str = "docstring", workers: int = 1) -> dict[str, Any]:
    """Mine ``srcs`` once (:func:`mine_records`, so a function found under two of them is kept once)
    into ``paths[i]`` for the files under ``srcs[i]`` (the innermost when they nest): JSON-lines
    files of ``completion`` records (``prompt``, ``completion``, ``id`` = ``FILE:LINE`` of the
    function) that an SFT mixture reads like any data file. Each file is written under a
    temporary name and renamed, so it is whole or absent.

    Lets the speedrun mine in a background process while the GPU pretrains: its SFT stage then
    reads the files instead of parsing the corpus itself.

    Returns:
        The :class:`MiningCounts` (``as_dict``) plus ``records`` per path (every path gets a file,
        possibly empty).

    Raises:
        ValueError: ``srcs`` and ``paths`` differ in length; the errors of :func:`mine_records`.
    """
    if len(srcs) != len(paths):
        raise ValueError(f"write_mined needs one path per source, got {len(srcs)} sources and {len(paths)} paths")
    roots = [Path(s).resolve() for s in srcs]
    by_depth = sorted(range(len(roots)), key=lambda i: -len(roots[i].parts))
    counts, outs = MiningCounts(), [Path(p) for p in paths]
    tmps = [p.with_name(f"{p.name}.tmp{os.getpid()}") for p in outs]
    n = [0] * len(outs)
    part_of: dict[str, int] = {}  # a file's part, found once per file (its records come together)
    with ExitStack() as stack:
        for p in outs:
            p.parent.mkdir(parents=True, exist_ok=True)
        files = [stack.enter_context(open(t, "w", encoding="utf-8")) for t in tmps]
        for rec in mine_records(srcs, max_files=max_files, counts=counts, style=style, workers=workers):
            if (k := part_of.get(rec.source)) is None:
                where = Path(rec.source).resolve()
                k = part_of[rec.source] = next((i for i in by_depth if where.is_relative_to(roots[i])), by_depth[-1])
            user, answer = rec.conversation.messages
            files[k].write(json.dumps({"prompt": user.content, "completion": answer.content,
                                       "id": f"{rec.source}:{rec.line}"}) + "\n")
            n[k] += 1
    for t, p in zip(tmps, outs):
        os.replace(t, p)
    return {**counts.as_dict(), "records": {str(p): k for p, k in zip(outs, n)}}


def without_ids(path: str | os.PathLike, out: str | os.PathLike, ids: set[str]) -> int:
    """Copy :func:`write_mined`'s file ``path`` to ``out`` without the records whose ``id`` (``FILE:LINE``)
    is in ``ids`` (written under a temporary name and renamed); returns how many were left out."""
    from codechat.config.atomic import write_text
    kept, dropped = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if json.loads(line)["id"] in ids:
                dropped += 1
            else:
                kept.append(line)
    write_text(out, "".join(kept))
    return dropped


__all__ = ["MINED_PROMPT", "MINE_STYLES", "MiningCounts", "mine_records", "write_mined", "without_ids"]
