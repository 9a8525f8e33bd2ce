"""RL tasks: a chat prompt the policy continues, and what its answer is judged with.

A :class:`Task` is either

- ``code``: the answer's code is judged in :mod:`codechat.eval.sandbox` exactly as
  ``codechat eval run`` judges chat-mode samples. A code task wraps a
  :class:`codechat.eval.problems.Problem` and delegates to it: :meth:`Task.code` is
  :func:`codechat.eval.suites.solution_code` (code out of the answer; HumanEval's header and
  body-only answers), :meth:`Task.program` is :meth:`Problem.program` (the code, then
  ``test_setup_code``), and the program runs against ``tests`` (statements, usually asserts, in
  order). :meth:`Task.job` is the whole thing as a :class:`~codechat.eval.sandbox.Job`; a reward
  of :mod:`codechat.eval.rewards` is a function of its result;
- ``funcall``: the answer should be the function call ``expected_call``
  (``{"name", "arguments"}``) to one of ``tools`` (the JSON schemas the prompt declares).

:func:`load_tasks` reads a spec:

============================ ==================================================================
spec                         tasks
============================ ==================================================================
``mbpp:PATH``                the published ``mbpp.jsonl``; ``split`` default ``train`` (601-974;
                             also prompt, test, validation, all). Prompt: the user turn of SFT and
                             eval (:data:`codechat.data.formats.MBPP_PROMPT`); ids ``MBPP/N``.
``humaneval[:PATH]``         the 164 problems (shipped copy by default), split ``test`` only;
                             a warning says this trains on an evaluation set.
``tasks:PATH``               the ``tasks.jsonl`` written by ``codechat eval filter``: one JSON row
                             per problem with ``task_id``, ``suite``, ``split``, ``prompt`` (the user
                             turn), ``tests``, ``test_setup_code``, ``entry_point`` (and ``n``, ``c``,
                             ``pass_rate``); rows with MBPP's ``text`` + ``test_list`` instead of
                             ``prompt`` + ``tests`` are read too, and optional ``reference``,
                             ``header``, ``base_prompt`` fields are kept. HumanEval rows get their
                             header / reference back from the shipped copy (matched by id and
                             prompt). ``split`` (default: every row) keeps rows whose ``split`` is it.
``funcall:PATH``             conversations with tools (any chat format of
                             :mod:`codechat.data.formats`): every assistant turn that calls a
                             function is a task whose prompt is the conversation before it;
                             ``split`` default ``train`` of
                             :func:`codechat.data.benchmarks.conversation_split` (also
                             ``heldout``, ``all``). Ids ``FILE:LINE:TURN``.
``doctest[:PATH]``           mined from doctests in Python source (default: this Python's
                             standard library, :func:`codechat.config.stages.default_corpus_dirs`); see
                             :func:`~codechat.data.doctest_tasks.mine_doctest_tasks`.
============================ ==================================================================

Doctest tasks (:func:`~codechat.data.doctest_tasks.mine_doctest_tasks`). A module-level function whose docstring holds ``>>>``
examples becomes a task, under the limits of SFT's mined pairs (:mod:`codechat.data.mining`: not
decorated, not a dunder, a docstring of at most ``MAX_DOC_CHARS`` characters, at most
``MAX_FUNCTION_LINES`` lines, a body that is not only ``pass`` / ``...``); methods are not
(they need their class):

- prompt: the user turn of SFT's mined pairs (:data:`codechat.data.mining.MINED_PROMPT`,
  ``Write a Python function `name(args)` that: <docstring>``) with the *whole* docstring,
  examples included: it is the format SFT trained on, and, as MBPP's prompt shows its asserts, the
  examples state the contract (a docstring without them is often underspecified);
- tests (:func:`~codechat.data.doctest_tasks.doctest_tests`): each example with an expected output becomes one test. A
  literal output (``ast.literal_eval`` parses it) is compared by value, ``assert (EXPR) == LIT``
  (robust to set / dict order and to how the literal is spelt; ``1 == 1.0 == True``); any other
  output, and any statement's or ``print(...)``'s, by the text doctest would compare: what it
  prints (stdout captured) and the ``repr`` of an expression's value unless ``None``
  (``NORMALIZE_WHITESPACE`` honoured); an expected traceback by the exception's class name (not
  its message); an expression that shows nothing by ``assert (EXPR) is None``; an ``assert``
  example is a test as it is. Statements without output (``>>> x = 3``) are set-up: they run at
  the start of the next test, and so does a check that does not mention the function (it tests
  nothing of the answer's). ``+SKIP`` examples, ``+ELLIPSIS`` outputs holding ``...`` and outputs with ``<BLANKLINE>`` are
  dropped. A function whose examples rebind its name (``from statistics import median``) is
  skipped: its tests would judge the original instead of the answer;
- ``test_setup_code`` is empty; the module's top-level absolute imports that bind a name the
  function or its examples use (``from typing import List``, ``import re``) form the problem's
  ``header``, put before the answer's code when it is judged (annotations and defaults are
  evaluated when the ``def`` runs);
- reference: the header, then the function's own source. A task is kept only when its reference
  passes its tests in the sandbox, so a function that needs the rest of its module (globals,
  helpers, classes) is excluded; so is any task whose text (prompt, reference, tests) overlaps a
  HumanEval problem or an MBPP test problem (``mbpp_file``) by the rule of
  :class:`codechat.data.decontam.Decontaminator`.

The yield is small: CPython 3.11's standard library (1790 files) has 161 module-level functions
with doctests in 34 files; 76 become candidates and 37 keep (the others mostly need their
module's helpers), in about 3 s on 2 cores.

Errors are :class:`ValueError` (:class:`codechat.data.formats.FormatError` for unreadable
records) naming the spec, file and line: an unknown spec prefix, a missing file, a bad split or
limit, a task without tests, a call turn whose conversation declares no tools, duplicate task ids,
an empty result, and, with ``check_references=True``, references that fail their own tests
(the ids are listed).

Departure from DESIGN.md's arrows: this module (``data/``) imports :mod:`codechat.eval.problems`
and :mod:`codechat.eval.sandbox`, so that a task is judged by the very code that judges
evaluation samples (no second copy of prompts or programs).
"""
from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

from codechat.chat.conversation import Conversation
from codechat.data.benchmarks import CONVERSATION_SPLITS, HUMANEVAL_FILE, MBPP_SPLITS, conversation_split
from codechat.data.doctest_tasks import DOCTEST_TIMEOUT_S, DoctestCounts, mine_doctest_tasks
from codechat.data.formats import HUMANEVAL_PROMPT, mbpp_prompt
from codechat.data.task import Task, describe_failure, failing_references
from codechat.eval import sandbox
from codechat.eval.problems import Problem, load_humaneval, load_mbpp_problems

log = logging.getLogger(__name__)

PREFIXES = ("mbpp", "humaneval", "tasks", "funcall", "doctest")
#: The split each spec reads unless ``split`` is given (the RL default: held-in data).
DEFAULT_SPLITS: dict[str, str | None] = {"mbpp": "train", "humaneval": "test", "tasks": None, "funcall": "train",
                                         "doctest": None}
#: Splits that evaluation reports on: training on them is warned about.
EVAL_SPLITS: dict[str, tuple[str, ...]] = {"mbpp": ("test", "validation", "all"), "humaneval": ("test",),
                                           "funcall": ("heldout", "all")}


# ----------------------------------------------------------------------------- the other loaders
def _task_id(suite: Any, raw: Any) -> str:
    """``MBPP/N`` for an MBPP problem, the problem's own id otherwise (``HumanEval/0``)."""
    return f"MBPP/{raw}" if suite == "mbpp" else str(raw)


@functools.lru_cache(maxsize=1)
def _shipped_humaneval() -> dict[str, Problem]:
    return {str(p.task_id): p for p in load_humaneval()}


def _humaneval_parts(task_id: Any, prompt: str, entry_point: str | None) -> tuple[str, str, str]:
    """``(base_prompt, header, reference)`` of a HumanEval row: from the shipped copy when its
    problem has the same id and chat prompt, else derived from the chat prompt (no reference)."""
    from codechat.eval.problems import _humaneval_header
    p = _shipped_humaneval().get(task_id)
    if p is not None and p.prompt == prompt:
        return p.base_prompt, p.header, p.reference
    prefix = HUMANEVAL_PROMPT.split("{prompt}")[0]
    base = prompt[len(prefix):] if prompt.startswith(prefix) else ""
    return base, _humaneval_header(base, entry_point) if base and entry_point else "", ""


def _row_task(row: Any, where: str) -> Task:
    """The code task of one ``tasks.jsonl`` row (format in the module docstring)."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a task row must be a JSON object, got {type(row).__name__}")
    if "task_id" not in row:
        raise ValueError(f"{where}: the row has no task_id (fields: {', '.join(sorted(row)) or 'none'})")
    tests = row.get("tests") if row.get("tests") is not None else row.get("test_list")
    if not tests:
        raise ValueError(f"{where}: task {row['task_id']!r} has no tests (fields 'tests' / 'test_list')")
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise ValueError(f"{where}: the tests of task {row['task_id']!r} must be a list of strings")
    prompt = row.get("prompt")
    if prompt is None and isinstance(row.get("text"), str):
        prompt = mbpp_prompt(row["text"], tests)
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}: task {row['task_id']!r} has no prompt (fields 'prompt' / 'text')")
    suite, entry = row.get("suite") or "task", row.get("entry_point")
    base, header, reference = row.get("base_prompt") or "", row.get("header") or "", row.get("reference") or ""
    if suite == "humaneval" and not (base and header):
        b, h, r = _humaneval_parts(row["task_id"], prompt, entry)
        base, header, reference = base or b, header or h, reference or r
    problem = Problem(suite, row["task_id"], row.get("split") or "", prompt, base, entry, tuple(tests),
                      row.get("test_setup_code") or "", header, reference)
    try:
        return Task.from_problem(problem, where, task_id=_task_id(suite, row["task_id"]))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _load_rows(path: Path, split: str | None) -> list[Task]:
    tasks, ids = [], {}
    with open(path, encoding="utf-8") as f:
        for lineno, text in enumerate(f, 1):
            if not text.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e})") from None
            task = _row_task(row, where)
            if split is not None and row.get("split") != split:
                continue
            if task.task_id in ids:
                raise ValueError(f"{where}: task {task.task_id!r} already read at line {ids[task.task_id]}")
            ids[task.task_id] = lineno
            tasks.append(task)
    return tasks


def _load_funcall(path: Path, split: str) -> list[Task]:
    from codechat.data.formats import records_from_rows
    from codechat.data.readers import read_rows
    if split not in CONVERSATION_SPLITS + ("all",):
        raise ValueError(f"funcall:{path}: split must be one of {', '.join(CONVERSATION_SPLITS + ('all',))}, "
                         f"got {split!r}")
    tasks = []
    for line, raw in read_rows(path):
        record = next(records_from_rows([(line, raw)], str(path)))  # FormatError names file and line
        if split != "all" and conversation_split(raw) != split:
            continue
        conv = record.conversation
        for i, m in enumerate(conv.messages):
            if m.role != "assistant" or m.function_call is None or i == 0:
                continue
            if not conv.tools:
                raise ValueError(f"{path}:{line}: turn {i} calls {m.function_call['name']!r} but the conversation "
                                 "declares no tools")
            tasks.append(Task(f"{path.name}:{line}:{i}", "funcall", Conversation(conv.messages[:i], conv.tools),
                              expected_call=m.function_call, tools=conv.tools, source=f"{path}:{line}"))
    return tasks


def parse_spec(spec: str) -> tuple[str, Path | None]:
    """``"PREFIX[:PATH]"`` -> ``(prefix, path or None)``.

    Raises:
        ValueError: an unknown prefix, a missing path where one is needed, or a path that does not exist.
    """
    prefix, _, path = spec.partition(":")
    if prefix not in PREFIXES:
        raise ValueError(f"unknown task spec {spec!r}: use mbpp:PATH, humaneval[:PATH], tasks:PATH, funcall:PATH "
                         "or doctest[:DIR]")
    if prefix in ("mbpp", "tasks", "funcall") and not path:
        raise ValueError(f"task spec {spec!r} needs a file: {prefix}:PATH")
    if path and not Path(path).exists():
        raise ValueError(f"task spec {spec!r}: {path} does not exist")
    if path and prefix != "doctest" and not Path(path).is_file():
        raise ValueError(f"task spec {spec!r}: {path} is not a file")
    return prefix, Path(path) if path else None


def load_tasks(spec: str, *, split: str | None = None, limit: int | None = None, check_references: bool = False,
               mbpp_file: str | Path | None = None, decontaminator: Any = None, max_files: int = 0,
               box: sandbox.Sandbox | None = None, workers: int = 2, timeout_s: float = 10.0) -> list[Task]:
    """The tasks of ``spec`` (table in the module docstring), the first ``limit`` of them. What is
    warned about is one line through the logger ``codechat.data.tasks`` (``codechat: warning: ...``).

    Args:
        split: the split to read; ``None``: the spec's RL default (:data:`DEFAULT_SPLITS`). An
            evaluation split (:data:`EVAL_SPLITS`) is read with a warning.
        limit: keep the first ``limit`` tasks (doctest: stop mining once that many are kept).
        check_references: run the references of the tasks that carry one (MBPP, HumanEval, rows
            with a reference) in the sandbox and raise if any fails. Doctest references are
            always run (a failing one excludes its task).
        mbpp_file: doctest: also exclude tasks overlapping the MBPP test problems of this file.
        decontaminator: doctest: the benchmark check to use instead of HumanEval plus ``mbpp_file``'s
            (:func:`~codechat.data.doctest_tasks.mine_doctest_tasks`).
        max_files: doctest: read at most this many files (0: all).
        box, workers, timeout_s: the sandbox pool, its parallel programs and seconds per program
            (doctest references: :data:`DOCTEST_TIMEOUT_S` at most).

    Raises:
        ValueError: an unknown spec prefix, a missing file, a bad split or limit, a bad row or
            record (file and line named), a task without tests, failing references (ids named)
            or no task at all.
    """
    prefix, path = parse_spec(spec)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    split = DEFAULT_SPLITS[prefix] if split is None else split
    if prefix == "doctest" and split is not None:
        raise ValueError(f"task spec {spec!r}: doctest tasks have no splits, got split {split!r}")
    if split in EVAL_SPLITS.get(prefix, ()):
        log.warning(f"RL on {spec} split {split!r} trains on data that evaluation reports on; its scores "
                    "will no longer measure generalisation")
    if prefix == "mbpp":
        if split != "all" and split not in MBPP_SPLITS:
            raise ValueError(f"task spec {spec!r}: unknown MBPP split {split!r}; use one of "
                             f"{', '.join(list(MBPP_SPLITS) + ['all'])}")
        tasks = [Task.from_problem(p, str(path), task_id=_task_id("mbpp", p.task_id))
                 for p in load_mbpp_problems(path, split, shots=0)]
    elif prefix == "humaneval":
        if split != "test":
            raise ValueError(f"task spec {spec!r}: HumanEval has only a test split, got {split!r}")
        tasks = [Task.from_problem(p, str(path or HUMANEVAL_FILE)) for p in load_humaneval(path)]
    elif prefix == "tasks":
        tasks = _load_rows(path, split)
    elif prefix == "funcall":
        tasks = _load_funcall(path, split)
    else:
        counts = DoctestCounts()
        tasks = mine_doctest_tasks([path] if path else None, max_files=max_files, max_tasks=limit or 0,
                                   mbpp_file=mbpp_file, decontaminator=decontaminator, box=box, workers=workers,
                                   timeout_s=min(timeout_s, DOCTEST_TIMEOUT_S), counts=counts)
        if not tasks:
            raise ValueError(f"task spec {spec!r}: no doctest task survived: {json.dumps(counts.as_dict())}")
    if not tasks:
        raise ValueError(f"task spec {spec!r}" + (f" (split {split!r})" if split else "") + ": no task")
    tasks = tasks[:limit] if limit else tasks
    if check_references and prefix not in ("doctest", "funcall"):  # funcall tasks have no reference
        if not any(t.reference is not None for t in tasks):
            log.warning(f"check_references: no task of {spec} carries a reference solution; nothing was checked")
        failed = failing_references(tasks, box=box, workers=workers, timeout_s=timeout_s)
        if failed:
            raise ValueError(f"task spec {spec!r}: the references of {len(failed)} tasks fail their own tests "
                             "in the sandbox: " + "; ".join(f"{t.task_id} ({t.source}): {describe_failure(r)}"
                                                            for t, r in failed[:20]))
    return tasks


__all__ = ["PREFIXES", "DEFAULT_SPLITS", "EVAL_SPLITS", "parse_spec", "load_tasks"]
