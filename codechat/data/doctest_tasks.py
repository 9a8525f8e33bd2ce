"""Doctest tasks for RL: functions whose docstring examples become their tests.

:func:`mine_doctest_tasks` finds module-level functions with ``>>>`` examples in Python source,
turns the examples into tests (:func:`doctest_tests`), keeps those whose reference (the function's
own source) passes in the sandbox, and drops anything overlapping HumanEval / MBPP's test problems;
:mod:`codechat.data.tasks` describes the prompts and tests these tasks get (``doctest[:PATH]``).
"""
from __future__ import annotations

import ast
import builtins
import doctest
import hashlib
import logging
import textwrap
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codechat.data.mining import MAX_DOC_CHARS, MAX_FUNCTION_LINES, MINED_PROMPT, _trivial, source_lines
from codechat.data.task import Task
from codechat.eval import sandbox
from codechat.eval.problems import Problem

log = logging.getLogger(__name__)

#: Seconds a doctest reference may run when it is checked.
DOCTEST_TIMEOUT_S = 5.0
#: Programs judged per sandbox batch while mining doctests (mining stops early at ``max_tasks``).
DOCTEST_BATCH = 32


# ----------------------------------------------------------------------------- doctests -> tests
def _parenthesised(source: str) -> str:
    """``source`` (one expression) in parentheses, safe with a trailing comment or several lines."""
    return f"({source}\n)" if "\n" in source or "#" in source else f"({source})"


def _captured(source: str, expression: bool, want: str, normalize: bool) -> str:
    """A test comparing what running ``source`` shows with ``want``, as doctest does: its printed
    output, then (an expression) the ``repr`` of its value unless that is ``None``."""
    body = f"_v = {_parenthesised(source)}\nif _v is not None:\n    print(repr(_v))" if expression else source
    got = "' '.join(_out.getvalue().split())" if normalize else "_out.getvalue()"
    expected = " ".join(want.split()) if normalize else want
    return ("import contextlib as _contextlib, io as _io\n"
            "with _contextlib.redirect_stdout(_io.StringIO()) as _out:\n"
            f"{textwrap.indent(body, '    ')}\n"
            f"assert {got} == {expected!r}, {got}")


def _example_test(ex: doctest.Example) -> tuple[str, str] | None:
    """``("setup", code)``, ``("test", code)`` for one doctest example, or ``None`` (dropped)."""
    source = ex.source.rstrip("\n")
    if ex.options.get(doctest.SKIP):
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    if ex.exc_msg is not None:
        name = ex.exc_msg.split(":", 1)[0].strip().rsplit(".", 1)[-1]
        if not name.isidentifier():
            return None
        return "test", (f"try:\n{textwrap.indent(source, '    ')}\n"
                        f"except BaseException as _e:\n    assert type(_e).__name__ == {name!r}, repr(_e)\n"
                        f"else:\n    raise AssertionError('no {name} raised')")
    want = ex.want
    expr = tree.body[0].value if len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr) else None
    printing = isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "print"
    if not want:
        if len(tree.body) == 1 and isinstance(tree.body[0], ast.Assert):
            return "test", source  # the example is a check itself
        if expr is not None and not printing:  # an expression that shows nothing evaluates to None
            return "test", f"assert {_parenthesised(source)} is None"
        return "setup", source
    if "<BLANKLINE>" in want or (ex.options.get(doctest.ELLIPSIS) and doctest.ELLIPSIS_MARKER in want):
        return None
    if expr is not None and not printing:
        text = want.strip()
        try:
            ast.literal_eval(text)
            return "test", f"assert {_parenthesised(source)} == {_parenthesised(text)}"
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return "test", _captured(source, expr is not None, want, bool(ex.options.get(doctest.NORMALIZE_WHITESPACE)))


def _names(code: str) -> set[str]:
    tree = ast.parse(code)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _binds(code: str, name: str) -> bool:
    """Whether ``code`` rebinds ``name`` (an import, assignment, ``def`` or ``class``): a test that
    imports the original function would judge it instead of the answer."""
    for n in ast.walk(ast.parse(code)):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)) and n.id == name:
            return True
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name:
            return True
        if isinstance(n, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name.split(".")[0]) == name or a.name == "*" for a in n.names):
            return True
    return False


def doctest_tests(docstring: str, entry_point: str) -> tuple[str, ...]:
    """The tests made of ``docstring``'s ``>>>`` examples (rules in the module docstring).

    Each test is the set-up examples since the previous test, then one check; a check that does
    not mention ``entry_point`` becomes set-up of the next one.

    Raises:
        ValueError: the docstring's examples cannot be parsed (:class:`doctest.DocTestParser`).
    """
    tests, setup = [], []
    for ex in doctest.DocTestParser().get_examples(docstring):
        made = _example_test(ex)
        if made is None:
            continue
        what, code = made
        if what == "setup":
            setup.append(code)
            continue
        block = "\n".join(setup + [code])
        if entry_point in _names(block):
            tests.append(block)
            setup = []
        else:  # it checks nothing of the function's, but later examples may need what it did
            setup.append(code)
    return tuple(tests)


# ----------------------------------------------------------------------------- doctest mining
@dataclass
class DoctestCounts:
    """What :func:`mine_doctest_tasks` saw: files, functions with doctests, and why each was dropped."""

    files: int = 0
    files_with_doctests: int = 0
    unparsable_files: int = 0
    functions: int = 0  # module-level functions whose docstring holds ">>>"
    candidates: int = 0  # with tests, not contaminated, not a duplicate: their references were run
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    reference_failures: dict[str, int] = field(default_factory=dict)  # sandbox status -> count

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "files_with_doctests": self.files_with_doctests,
                "unparsable_files": self.unparsable_files, "functions": self.functions,
                "candidates": self.candidates, "kept": self.kept, "skipped": dict(self.skipped),
                "reference_failures": dict(self.reference_failures)}


def _import_header(tree: ast.Module, used: set[str]) -> str:
    """The module's top-level absolute imports (not ``__future__``) that bind a name in ``used``."""
    lines = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            bound = {(a.asname or a.name.split(".")[0]) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module != "__future__":
            bound = {(a.asname or a.name) for a in node.names if a.name != "*"}
        else:
            continue
        if bound & used:
            lines.append(ast.unparse(node))
    return "".join(line + "\n" for line in lines) + ("\n\n" if lines else "")


def _doctest_candidate(node: ast.FunctionDef | ast.AsyncFunctionDef, tree: ast.Module, lines: list[str],
                       relpath: str, path: str) -> Task | str:
    """The task of one function with doctests (its reference not yet run), or why it is skipped."""
    if node.name.startswith("__") or node.decorator_list:
        return "decorated_or_dunder"
    doc = ast.get_docstring(node, clean=True) or ""
    if len(doc) > MAX_DOC_CHARS:
        return "docstring_length"
    if node.end_lineno is None or node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
        return "too_long"
    if _trivial(node.body[1:]):
        return "trivial_body"
    try:
        tests = doctest_tests(doc, node.name)
    except ValueError:
        return "bad_doctest"
    if not tests:
        return "no_tests"
    if any(_binds(t, node.name) for t in tests):
        return "tests_rebind_the_function"
    source = "\n".join(lines[node.lineno - 1:node.end_lineno]) + "\n"
    used = _names(source) | set().union(*(_names(t) for t in tests))
    header = _import_header(tree, used - set(dir(builtins)))
    signature = f"{node.name}({ast.unparse(node.args)})"
    doc_end = node.body[0].end_lineno or node.lineno
    problem = Problem("doctest", f"{relpath}::{node.name}", "train", MINED_PROMPT.format(signature=signature, doc=doc),
                      header + "\n".join(lines[node.lineno - 1:doc_end]) + "\n", node.name, tests, "",
                      header=header, reference=header + source)
    return Task.from_problem(problem, f"{path}:{node.lineno}", task_id=f"doctest/{relpath}::{node.name}")


def _decontaminator(mbpp_file: str | Path | None) -> Any:
    from codechat.data.decontam import Decontaminator, humaneval_problems, mbpp_problems
    problems = humaneval_problems()
    if mbpp_file:
        problems += mbpp_problems(mbpp_file)
    else:
        log.warning("doctest tasks are checked against HumanEval only: give the published mbpp.jsonl as mbpp_file "
                    "to exclude tasks overlapping MBPP's test problems too")
    return Decontaminator(problems)


def mine_doctest_tasks(srcs: Sequence[str | Path] | None = None, *, max_files: int = 0, max_tasks: int = 0,
                       mbpp_file: str | Path | None = None, decontaminator: Any = None,
                       box: sandbox.Sandbox | None = None, workers: int = 2, timeout_s: float = DOCTEST_TIMEOUT_S,
                       counts: DoctestCounts | None = None) -> list[Task]:
    """Code tasks mined from the doctests of the ``.py`` files under ``srcs`` (default: this
    Python's standard library), in file then line order; rules in the module docstring.

    Only files whose text holds ``>>>`` are parsed. Candidates are decontaminated by ``decontaminator``
    (a :class:`codechat.data.decontam.Decontaminator`, e.g. the one a task pool checks all its tasks with,
    whose builder says what it checks; ``mbpp_file`` is then unused) or, when it is None, against
    HumanEval and MBPP's test problems in ``mbpp_file`` (without ``mbpp_file``: HumanEval only, and a
    one-line warning through the logger ``codechat.data.doctest_tasks``), deduplicated by reference,
    then their references run in the sandbox (``box``, or the shared pool) ``DOCTEST_BATCH`` at a
    time, ``timeout_s`` each; those that pass are kept. ``max_files`` / ``max_tasks`` > 0 stop early.
    ``counts`` receives what was seen and dropped (:class:`DoctestCounts`).

    Raises:
        codechat.config.stages.ConfigError: a source does not exist or holds no ``.py`` file.
    """
    counts = counts if counts is not None else DoctestCounts()
    decon = decontaminator if decontaminator is not None else _decontaminator(mbpp_file)
    seen: set[bytes] = set()
    with_doctests: set[str] = set()

    def candidates() -> Iterator[Task]:
        for f, tree, lines, node in module_functions(srcs, max_files, counts, must_contain=">>>"):
            if ">>>" not in (ast.get_docstring(node, clean=True) or ""):
                continue
            with_doctests.add(f.relpath)
            counts.functions += 1
            try:
                task = _doctest_candidate(node, tree, lines, f.relpath, str(f.path))
            except SyntaxError:  # one odd function must not end the mining of the rest (counted)
                task = "source_does_not_parse"
            if isinstance(task, str):
                counts.skip(task)
            elif fresh(decon, seen, task.text(), task.reference or "", counts):
                counts.candidates += 1
                yield task

    def judge(batch: list[Task]) -> list[Task]:
        jobs = [t.reference_job(timeout_s=timeout_s) for t in batch]
        results = box.run_many(jobs, workers=workers) if box is not None else sandbox.run_many(jobs, workers=workers)
        for r in results:
            if not r.passed:
                counts.reference_failures[r.status] = counts.reference_failures.get(r.status, 0) + 1
        return [t for t, r in zip(batch, results) if r.passed]

    kept = judged_in_batches(candidates(), judge, max_tasks)
    counts.files_with_doctests, counts.kept = len(with_doctests), len(kept)
    return kept


# ----------------------------------------------------------------------------- shared by the task miners
def module_functions(srcs: Sequence[str | Path] | None, max_files: int, counts: Any,
                     must_contain: str = "") -> Iterator[tuple[Any, ast.Module, list[str], ast.FunctionDef]]:
    """``(file, tree, lines, node)`` of every module-level function (``def`` or ``async def``) in the
    ``.py`` files under ``srcs`` (default: this Python's standard library) whose text holds
    ``must_contain``, in file then line order. ``counts.files`` counts every file,
    ``counts.unparsable_files`` those that cannot be read or parsed.

    Raises:
        codechat.config.stages.ConfigError: a source does not exist or holds no ``.py`` file.
    """
    from codechat.config.stages import default_corpus_dirs
    from codechat.data.sources import collect_files
    for f in collect_files(list(srcs) if srcs else list(default_corpus_dirs()), (".py",), max_files):
        counts.files += 1
        try:
            text = f.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            counts.unparsable_files += 1
            continue
        if must_contain not in text:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escapes in old code
                tree = ast.parse(text)
        except (SyntaxError, ValueError):
            counts.unparsable_files += 1
            continue
        lines = source_lines(text)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f, tree, lines, node


def fresh(decon: Any, seen: set[bytes], text: str, key: str, counts: Any) -> bool:
    """Whether a candidate neither overlaps a benchmark problem (``decon.overlap(text)``) nor repeats an
    earlier one's ``key`` (kept in ``seen``); else ``counts.skip`` says which."""
    if decon.overlap(text):
        counts.skip("contaminated")
        return False
    digest = hashlib.sha256(key.encode()).digest()
    if digest in seen:
        counts.skip("duplicate")
        return False
    seen.add(digest)
    return True


def judged_in_batches(candidates: Iterator[Any], judge: Callable[[list[Any]], list[Task]], max_tasks: int
                      ) -> list[Task]:
    """The tasks ``judge`` keeps of ``candidates``, judged :data:`DOCTEST_BATCH` at a time (a batch of
    sandbox programs), no more candidates drawn once ``max_tasks`` > 0 are kept."""
    kept: list[Task] = []
    batch: list[Any] = []
    for c in candidates:
        batch.append(c)
        if len(batch) >= DOCTEST_BATCH:
            kept += judge(batch)
            batch = []
            if max_tasks and len(kept) >= max_tasks:
                break
    if batch:
        kept += judge(batch)
    return kept[:max_tasks] if max_tasks else kept


def write_tasks(tasks: Sequence[Task], path: str | Path) -> None:
    """``tasks`` (code tasks) as a ``tasks.jsonl`` that ``tasks:PATH`` reads back as the same tasks (ids,
    prompts, tests, header, reference), written under a temporary name and renamed: whole or absent.
    Each row's ``origin`` is where its function was mined (``FILE:LINE``, a mined SFT pair's ``id``)."""
    import json

    from codechat.config.atomic import write_text
    rows = []
    for t in tasks:
        p = t.problem
        rows.append(json.dumps({**p.row(), "task_id": t.task_id, "base_prompt": p.base_prompt, "header": p.header,
                                "reference": p.reference, "origin": t.source}) + "\n")
    write_text(path, "".join(rows))


def write_doctest_tasks(srcs: Sequence[str | Path], path: str | Path, **mine: Any) -> dict[str, Any]:
    """Mine ``srcs`` (:func:`mine_doctest_tasks`, ``mine`` its keyword arguments) into ``path``
    (:func:`write_tasks`).

    Returns:
        The :class:`DoctestCounts` (``as_dict``).
    """
    counts = DoctestCounts()
    write_tasks(mine_doctest_tasks(srcs, counts=counts, **mine), path)
    return counts.as_dict()


__all__ = ["DoctestCounts", "doctest_tests", "mine_doctest_tasks", "write_doctest_tasks", "write_tasks"]
