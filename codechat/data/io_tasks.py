"""Input/output tasks for RL: self-contained pure functions of the corpus, tested on their own behaviour.

Doctests are few (345 in a GPU run's whole corpus at a06a26b; the pass-rate filter kept 8 of them at f18248e),
and MBPP's train split is in chat SFT, so a pool of those is either too small or already memorised. Most corpus
functions have no examples, but many small ones are pure: :func:`mine_io_tasks` keeps those and writes their tests
from what they do.

1. **Candidates** (the AST alone): module-level, undecorated, non-dunder functions with a docstring, 1-3 plain
   positional parameters, at most :data:`~codechat.data.mining.MAX_FUNCTION_LINES` lines, whose body
   names only its parameters, its own locals, itself, the builtins of :data:`PURE_BUILTINS` and
   modules of :data:`PURE_MODULES` imported at the module's top; no ``global``, ``yield``, ``await``,
   ``try``, ``with``, imports, private attributes, sets (their order follows the string hash seed,
   which differs between processes) or the names of :data:`FORBIDDEN` (``print``, ``hash``, ``id``, ...).
2. **Inputs**: each parameter gets a pool of values by its annotation, its default's type or its name
   (:func:`value_pool`: ``n`` an int, ``text`` a string, ``items`` a list, ...); up to :data:`CASES`
   combinations are drawn with a seed.
3. **Behaviour**: the function runs in the sandbox on every combination, twice on deep copies. A case
   counts when both calls return the same value, a plain one whose ``repr`` reads back equal
   (:func:`ast.literal_eval`: numbers but not floats, strings, bools, None, tuples, lists, dicts) and
   short (:data:`MAX_REPR` characters).
4. **Kept** when at least :data:`MIN_CASES` cases count with at least two different results: the
   tests (up to :data:`TESTS` ``assert f(...) == ...``, different results first) then pin its
   behaviour down. The prompt asks for the function by signature and docstring as the mined SFT pairs
   do; the reference is the function itself (with its imports); decontaminated and deduplicated as the
   doctest tasks are (:mod:`codechat.data.doctest_tasks`).
"""
from __future__ import annotations

import ast
import json
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codechat.data.doctest_tasks import (_decontaminator, _import_header, _names, fresh, judged_in_batches,
                                         module_functions)
from codechat.data.mining import MAX_DOC_CHARS, MAX_FUNCTION_LINES, MINED_PROMPT, MIN_DOC_CHARS, _trivial
from codechat.data.task import Task
from codechat.eval import sandbox
from codechat.eval.problems import Problem

#: Builtins a candidate's body may name (pure: no I/O, no process state, no hash-seeded order).
PURE_BUILTINS = frozenset({
    "abs", "all", "any", "ascii", "bin", "bool", "callable", "chr", "dict", "divmod", "enumerate", "filter",
    "format", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next", "oct", "hex",
    "ord", "pow", "range", "repr", "reversed", "round", "slice", "sorted", "str", "sum", "tuple", "zip",
    "ArithmeticError", "Exception", "IndexError", "KeyError", "StopIteration",
    "TypeError", "ValueError", "ZeroDivisionError", "NotImplementedError"})
#: Standard modules whose top-level import a candidate may use (pure functions and constants).
PURE_MODULES = frozenset({"math", "string", "re", "itertools", "functools", "operator", "bisect", "heapq",
                          "textwrap", "collections", "unicodedata", "keyword"})
#: Names that make a body impure or hash-seeded wherever they appear.
FORBIDDEN = frozenset({"set", "frozenset", "hash", "id", "print", "open", "input", "eval", "exec", "compile",
                       "globals", "locals", "vars", "getattr", "setattr", "delattr", "__import__", "object"})
CASES = 16  # input combinations tried per function
MIN_CASES = 4  # cases that must count
TESTS = 5  # asserts a task keeps
MAX_REPR = 120  # characters of an argument list or a result
IO_TIMEOUT_S = 5.0

_POOLS: dict[str, list[Any]] = {
    "int": [0, 1, 2, 3, 5, 7, 10, 12, -1, -4, 25, 100],
    "str": ["", "a", "abc", "Hello World", "racecar", "a,b,c", "  padded  ", "123", "snake_case_name", "CamelCase"],
    "bool": [True, False],
    "list_int": [[], [1], [3, 1, 2], [1, 2, 2, 3], [5, -1, 0, 4], [10, 20, 30, 40, 50]],
    "list_str": [[], ["a"], ["b", "a", "c"], ["hello", "world"], ["x", "x", "y"]],
    "dict": [{}, {"a": 1}, {"a": 1, "b": 2}, {"x": 10, "y": -3, "z": 0}],
}
_BY_NAME = {
    "int": {"n", "m", "k", "i", "j", "num", "number", "count", "size", "x", "y", "a", "b", "base", "start", "stop",
            "step", "width", "depth", "level", "index", "idx", "length", "limit", "year", "month", "day", "value",
            "val", "digits", "places", "times", "offset", "pos", "position", "total", "max_value", "min_value"},
    "str": {"s", "text", "string", "word", "name", "line", "sep", "prefix", "suffix", "char", "c", "ch", "string1",
            "string2", "s1", "s2", "pattern", "key", "title", "sentence", "message", "msg", "label", "identifier"},
    "list_int": {"lst", "items", "seq", "values", "nums", "numbers", "data", "arr", "array", "xs", "l", "elements",
                 "iterable", "sequence", "a_list", "ints", "scores"},
    "list_str": {"words", "names", "strings", "lines", "parts", "tokens", "keys", "labels"},
    "bool": {"flag", "strict", "reverse", "ignore_case", "upper", "lower"},
}


def value_pool(arg: ast.arg, default: ast.expr | None) -> list[Any]:
    """Candidate values of one parameter: by its annotation, else its default's type, else its name,
    else ints, strings and lists of ints together."""
    kind = None
    if arg.annotation is not None:
        a = ast.unparse(arg.annotation)
        low = a.lower()
        if any(w in low for w in ("list", "sequence", "iterable", "tuple")):
            kind = "list_str" if "str" in low else "list_int"
        elif "dict" in low or "mapping" in low:
            kind = "dict"
        else:  # the first member of a union: int | None -> int
            kind = next((k for k in ("bool", "int", "str") if re.search(rf"\b{k}\b", low.split("|")[0])), None)
    if kind is None and isinstance(default, ast.Constant) and default.value is not None:
        kind = {bool: "bool", int: "int", str: "str"}.get(type(default.value))
    if kind is None:
        kind = next((k for k, names in _BY_NAME.items() if arg.arg.lower() in names), None)
    return list(_POOLS[kind]) if kind else _POOLS["int"][:6] + _POOLS["str"][:5] + _POOLS["list_int"][:4]


def _params(node: ast.FunctionDef) -> list[ast.arg] | None:
    """The function's parameters when they are 1-3 plain positional ones (else None)."""
    a = node.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or not 1 <= len(a.args) <= 3:
        return None
    return list(a.args)


def _pure(node: ast.FunctionDef, module_names: set[str]) -> str:
    """Why ``node``'s body is not a candidate ("" when it is): rules in the module docstring."""
    params = {a.arg for a in node.args.args}
    local = params | {node.name}
    for n in ast.walk(node):
        if isinstance(n, (ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom, ast.Await, ast.Set, ast.SetComp,
                          ast.Import, ast.ImportFrom, ast.ClassDef, ast.AsyncFunctionDef, ast.With, ast.AsyncWith,
                          ast.Try, ast.Delete)):
            return "impure_construct"
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            local.add(n.id)
        elif isinstance(n, ast.arg):
            local.add(n.arg)
        elif isinstance(n, ast.FunctionDef):  # a nested helper
            local.add(n.name)
        elif isinstance(n, ast.Attribute) and n.attr.startswith("_"):
            return "private_attribute"
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local:
            if n.id in FORBIDDEN:
                return "impure_name"
            if n.id not in PURE_BUILTINS and n.id not in module_names:
                return "free_name"
    return ""


def _pure_imports(tree: ast.Module) -> set[str]:
    """Names the module's top-level imports bind to a module of :data:`PURE_MODULES` (or a name of one)."""
    names = set()
    for n in tree.body:
        if isinstance(n, ast.Import):
            names |= {a.asname or a.name for a in n.names if a.name in PURE_MODULES}
        elif isinstance(n, ast.ImportFrom) and not n.level and n.module in PURE_MODULES:
            names |= {a.asname or a.name for a in n.names if a.name != "*"}
    return names


#: The probe the sandbox runs after the function: one test per case prints the case's result.
PROBE = '''
import copy as _copy, json as _json, ast as _ast
def _probe(_i, _args):
    _a = {f}(*_copy.deepcopy(_args))
    _b = {f}(*_copy.deepcopy(_args))
    _r = repr(_a)
    assert _a == _b and repr(_b) == _r and len(_r) <= {m} and not isinstance(_a, float)
    assert _ast.literal_eval(_r) == _a and repr(_ast.literal_eval(_r)) == _r
    assert "float" not in _r and "inf" not in _r and "nan" not in _r
    print(_json.dumps([_i, _r]))
'''


@dataclass
class IOCounts:
    """What :func:`mine_io_tasks` saw: files, functions, candidates, and why each was dropped."""

    files: int = 0
    unparsable_files: int = 0
    functions: int = 0
    candidates: int = 0  # pure by the AST, with inputs: run in the sandbox
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "unparsable_files": self.unparsable_files, "functions": self.functions, "candidates": self.candidates, "kept": self.kept,
                "skipped": dict(self.skipped)}


@dataclass
class _Candidate:
    name: str
    header: str  # the module's imports it uses
    source: str  # the function
    prompt: str
    base: str
    cases: list[tuple]
    relpath: str
    where: str


def _candidate(node: ast.AST, tree: ast.Module, lines: list[str], pure_names: set[str], relpath: str, path: str,
               seed: int) -> _Candidate | str:
    """One function's candidate (its cases not yet run), or why it is skipped."""
    if not isinstance(node, ast.FunctionDef) or node.decorator_list or node.name.startswith("__"):
        return "decorated_async_or_dunder"
    doc = ast.get_docstring(node, clean=True) or ""
    if not MIN_DOC_CHARS <= len(doc) <= MAX_DOC_CHARS or ">>>" in doc:  # doctests: doctest_tasks' own
        return "docstring"
    if node.end_lineno is None or node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES or _trivial(node.body[1:]):
        return "length_or_trivial"
    params = _params(node)
    if params is None:
        return "parameters"
    why = _pure(node, pure_names)
    if why:
        return why
    defaults = [None] * (len(params) - len(node.args.defaults)) + list(node.args.defaults)
    pools = [value_pool(a, d) for a, d in zip(params, defaults)]
    rng = random.Random(f"{seed}:{relpath}:{node.name}")
    cases, seen = [], set()
    for _ in range(CASES * 4):
        case = tuple(rng.choice(p) for p in pools)
        key = repr(case)
        if key not in seen and len(key) <= MAX_REPR:
            seen.add(key)
            cases.append(case)
        if len(cases) >= CASES:
            break
    source = "\n".join(lines[node.lineno - 1:node.end_lineno]) + "\n"
    header = _import_header(tree, _names(source) & pure_names)
    signature = f"{node.name}({ast.unparse(node.args)})"
    doc_end = node.body[0].end_lineno or node.lineno
    return _Candidate(node.name, header, source, MINED_PROMPT.format(signature=signature, doc=doc),
                      header + "\n".join(lines[node.lineno - 1:doc_end]) + "\n", cases, relpath, f"{path}:{node.lineno}")


def _task(c: _Candidate, results: list[tuple[tuple, str]]) -> Task | None:
    """The task of a candidate whose cases gave ``results`` (``(args, repr of the result)``), or None
    when they do not pin its behaviour down (fewer than MIN_CASES, or one result for all)."""
    if len(results) < MIN_CASES or len({r for _, r in results}) < 2:
        return None
    firsts, used = [], set()
    for args, r in results:  # one case of each result first, then the others, in case order
        if r not in used:
            used.add(r)
            firsts.append((args, r))
    chosen = (firsts + [x for x in results if x not in firsts])[:TESTS]
    tests = tuple(f"assert {c.name}({', '.join(map(repr, args))}) == {r}" for args, r in chosen)
    problem = Problem("io", f"{c.relpath}::{c.name}", "train", c.prompt, c.base, c.name, tests, "",
                      header=c.header, reference=c.header + c.source)
    return Task.from_problem(problem, c.where, task_id=f"io/{c.relpath}::{c.name}")


def mine_io_tasks(srcs: Sequence[str | Path] | None = None, *, max_files: int = 0, max_tasks: int = 0,
                  mbpp_file: str | Path | None = None, decontaminator: Any = None, box: sandbox.Sandbox | None = None,
                  workers: int = 2, timeout_s: float = IO_TIMEOUT_S, seed: int = 0,
                  counts: IOCounts | None = None) -> list[Task]:
    """Input/output tasks mined from the ``.py`` files under ``srcs`` (default: this Python's standard
    library), in file then line order; rules in the module docstring. Decontamination, ``box``,
    ``workers``, ``max_files`` and ``max_tasks`` as :func:`codechat.data.doctest_tasks.mine_doctest_tasks`;
    ``seed`` draws the inputs. ``counts`` receives what was seen and dropped.

    Raises:
        codechat.config.stages.ConfigError: a source does not exist or holds no ``.py`` file.
    """
    counts = counts if counts is not None else IOCounts()
    decon = decontaminator if decontaminator is not None else _decontaminator(mbpp_file)
    seen: set[bytes] = set()

    def candidates() -> Iterator[_Candidate]:
        module, names = None, set()  # a file's functions come together: its pure imports found once
        for f, tree, lines, node in module_functions(srcs, max_files, counts):
            counts.functions += 1
            if tree is not module:
                module, names = tree, _pure_imports(tree)
            try:
                c = _candidate(node, tree, lines, names, f.relpath, str(f.path), seed)
            except SyntaxError:  # one odd function must not end the mining of the rest (counted)
                c = "source_does_not_parse"
            if isinstance(c, str):
                counts.skip(c)
            elif fresh(decon, seen, c.prompt + "\n" + c.source, c.source, counts):
                counts.candidates += 1
                yield c

    def judge(batch: list[_Candidate]) -> list[Task]:
        jobs = [sandbox.Job(c.header + c.source + PROBE.format(f=c.name, m=MAX_REPR),
                            [f"_probe({i}, {case!r})" for i, case in enumerate(c.cases)], timeout_s=timeout_s)
                for c in batch]
        results = box.run_many(jobs, workers=workers) if box is not None else sandbox.run_many(jobs, workers=workers)
        tasks = []
        for c, r in zip(batch, results):
            got = {}
            for line in r.stdout.splitlines():
                try:
                    i, out = json.loads(line)
                    got[int(i)] = out
                except (ValueError, TypeError):
                    continue
            ok = [(c.cases[t.index], got[t.index]) for t in r.tests if t.outcome == "passed" and t.index in got]
            task = _task(c, ok)
            if task is None:
                counts.skip("behaviour_not_pinned")
            else:
                tasks.append(task)
        return tasks

    kept = judged_in_batches(candidates(), judge, max_tasks)
    counts.kept = len(kept)
    return kept


def write_corpus_tasks(srcs: Sequence[str | Path], path: str | Path, *, io_max_tasks: int = 0,
                       **mine: Any) -> dict[str, Any]:
    """The doctest tasks and then the input/output tasks of ``srcs`` (``mine``: the keyword arguments both
    miners take; ``io_max_tasks`` > 0 caps the latter) in one ``tasks.jsonl`` that ``tasks:PATH`` reads
    back (:func:`codechat.data.doctest_tasks.write_tasks`). Lets the speedrun mine every corpus source in
    a background process while the GPU pretrains; its RL stage then reads the file.

    Returns:
        ``{"doctest": DoctestCounts.as_dict(), "io": IOCounts.as_dict(), "kept": tasks written}``.
    """
    from codechat.data.doctest_tasks import DoctestCounts, mine_doctest_tasks, write_tasks
    dc, io = DoctestCounts(), IOCounts()
    decon = mine.pop("decontaminator", None) or _decontaminator(mine.pop("mbpp_file", None))
    tasks = mine_doctest_tasks(srcs, counts=dc, decontaminator=decon, **mine)
    tasks += mine_io_tasks(srcs, counts=io, decontaminator=decon, **{**mine, "max_tasks": io_max_tasks})
    write_tasks(tasks, path)
    return {"doctest": dc.as_dict(), "io": io.as_dict(), "kept": len(tasks)}


__all__ = ["IOCounts", "PURE_BUILTINS", "PURE_MODULES", "mine_io_tasks", "value_pool", "write_corpus_tasks"]
