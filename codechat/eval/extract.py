"""Code out of chat answers: fenced blocks, bare code among prose, and the function the tests call.

:func:`extract_code` is what ``codechat eval`` judges in chat mode; :func:`parse_quietly`,
:func:`called_names`, :func:`defined_names` and :func:`defines` are the small AST helpers it
is built on, shared with the problem loaders.
"""
from __future__ import annotations

import ast
import re
import textwrap
import warnings
from typing import Sequence


def parse_quietly(source: str) -> ast.Module | None:
    """``ast.parse`` without the SyntaxWarnings old code raises (invalid escapes)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ast.parse(source.replace("\r\n", "\n"))
        except (SyntaxError, ValueError):
            return None


def called_names(tests: Sequence[str]) -> list[str]:
    """Names called as plain functions in ``tests``, in first-seen order."""
    names: list[str] = []
    for t in tests:
        tree = parse_quietly(t)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id not in names:
                    names.append(node.func.id)
    return names


def defined_names(code: str) -> set[str]:
    """Top-level functions and classes of ``code``."""
    tree = parse_quietly(code)
    if tree is None:
        return set()
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                         ast.ClassDef))}


# ----------------------------------------------------------------------------- extraction
_PY_TAGS = {"", "python", "py", "python3", "py3"}
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.#-]*)[^\n]*\n(.*?)(?:^[ \t]*\1[ \t]*$|\Z)", re.M | re.S)
_CODE_START = re.compile(r"^[ \t]*(?:def |async def |class |import |from [\w.]+ import |@\w)")


def defines(code: str, name: str) -> bool:
    """Whether ``code`` defines ``name`` at its top level (any ``def``/``class`` line of that name
    when it does not parse)."""
    if parse_quietly(code) is not None:
        return name in defined_names(code)
    return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", code, re.M) is not None


def _trim_prose(code: str) -> str:
    """Drop leading and trailing top-level bare names and strings (prose such as ``Output`` parses)."""
    tree = parse_quietly(code)
    if tree is None or not tree.body:
        return code
    lines, body = code.split("\n"), list(tree.body)

    def prose(node: ast.stmt) -> bool:
        return isinstance(node, ast.Expr) and isinstance(node.value, (ast.Name, ast.Attribute, ast.Constant))
    while len(body) > 1 and prose(body[-1]):
        body.pop()
    first = 0
    while len(body) > 1 and prose(body[0]):
        body.pop(0)
        first = min([body[0].lineno] + [d.lineno for d in getattr(body[0], "decorator_list", [])]) - 1
    return "\n".join(lines[first:body[-1].end_lineno])


def _code_spans(text: str) -> list[str]:
    """Maximal runs of lines that parse (once dedented) around each ``def``/``class``/import/decorator
    line: down as far as the code still parses, then up over what precedes it (constants)."""
    def parses(a: int, b: int) -> bool:
        return parse_quietly(textwrap.dedent("\n".join(lines[a:b]))) is not None
    lines, spans, i, floor = text.split("\n"), [], 0, 0
    while i < len(lines):
        if _CODE_START.match(lines[i]):
            end = next((e for e in range(len(lines), i, -1) if parses(i, e)), i)
            if end > i:
                start = i
                while start > floor and parses(start - 1, end):
                    start -= 1
                spans.append(_trim_prose(textwrap.dedent("\n".join(lines[start:end]))).strip("\n"))
                i = floor = end
                continue
        i += 1
    return spans


def _unparsed_code(text: str) -> list[str]:
    """The text from its first ``def``/``class``/import/decorator line on, when no span of it parses:
    the answer is code that does not parse (judged with its own SyntaxError), not an answer without code."""
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    return [] if first is None else ["\n".join(lines[first:])]


def _normalise(block: str) -> str:
    """A block without blank edge lines, dedented when only that makes it parse."""
    block = block.strip("\n").rstrip()
    if parse_quietly(block) is None and parse_quietly(textwrap.dedent(block)) is not None:
        return textwrap.dedent(block)
    return block


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code of a chat answer: fenced blocks, else the bare code among prose.

    Candidates are the fenced blocks tagged python (or untagged); without any, the whole text
    if it parses, else every maximal run of parseable lines starting at a top-level
    ``def``/``class``/import. Among candidates, the first that defines ``entry_point`` (the
    function the tests call) wins, with any other candidates that define names it calls but
    does not define (helpers) placed before it; without ``entry_point`` or a candidate defining
    it, every candidate that parses, joined. Code that never parses is still the answer (a broken
    fenced block, or the text from its first ``def`` on): the sandbox names its SyntaxError. Returns
    ``""`` when nothing looks like code.
    """
    text = text.replace("\r\n", "\n")
    blocks = [m.group(3) for m in _FENCE.finditer(text) if m.group(2).lower() in _PY_TAGS]
    if not blocks:
        bare = text.strip("\n")
        whole = parse_quietly(bare) is not None or parse_quietly(textwrap.dedent(bare)) is not None
        blocks = [bare] if whole else _code_spans(text) or _unparsed_code(text)
    blocks = [b for b in map(_normalise, blocks) if b.strip()]
    if not blocks:
        return ""
    parsing = [b for b in blocks if parse_quietly(b) is not None]
    hits = [b for b in blocks if entry_point and defines(b, entry_point)]
    if hits:
        chosen = next((b for b in hits if b in parsing), hits[0])
        need = set(called_names([chosen])) - defined_names(chosen)
        helpers = [b for b in parsing if b is not chosen and defined_names(b) & need]
        return "\n\n\n".join(helpers + [chosen])
    if parsing:
        return "\n\n\n".join(parsing)
    return max(blocks, key=len)
