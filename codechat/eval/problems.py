"""The problems of the evaluation suites: HumanEval and MBPP, with their prompts and tests.

- HumanEval (Chen et al. 2021): the 164 problems shipped with codechat
  (:data:`codechat.data.benchmarks.HUMANEVAL_FILE`); ``humaneval:PATH`` reads another copy.
- MBPP (Austin et al. 2021): :func:`load_mbpp` reads the published ``mbpp.jsonl`` with the
  standard splits by task id (prompt 1-10, test 11-510, validation 511-600, train 601-974);
  :func:`judge_mbpp` runs programs against a task's asserts in :mod:`codechat.eval.sandbox`.

:func:`load_problems` turns a ``--suite`` spec into :class:`Problem` rows, each with its chat
prompt, its base-mode prompt and what its solutions are judged with.
"""
from __future__ import annotations

import ast
import builtins
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from codechat.data.benchmarks import HUMANEVAL_FILE, MBPP_SPLITS, mbpp_split
from codechat.eval import sandbox
from codechat.eval.extract import called_names, defined_names, parse_quietly

SUITES = ("humaneval", "mbpp")
#: One MBPP example in the paper's few-shot format; a shot appends its code and ``\n[DONE]\n\n``.
MBPP_FEWSHOT = ("You are an expert Python programmer, and here is your task: {text} "
                "Your code should pass these tests:\n\n{tests}\n[BEGIN]\n")


# ----------------------------------------------------------------------------- MBPP
MBPP_FEWSHOT_IDS = (2, 3, 4)  # the paper's three-shot prompt examples


@dataclass(frozen=True)
class MBPPTask:
    """One MBPP problem in the published format (``code`` is the reference solution)."""

    task_id: int
    text: str
    code: str
    test_list: tuple[str, ...]
    test_setup_code: str = ""
    challenge_test_list: tuple[str, ...] = ()

    @property
    def split(self) -> str:
        return mbpp_split(self.task_id)

    @property
    def entry_point(self) -> str | None:
        """The function the asserts call that the reference defines (``None`` if none)."""
        called = called_names(self.test_list)
        defined = defined_names(self.code)
        return next((n for n in called if n in defined),
                    next((n for n in called if not hasattr(builtins, n)), None))

    def program(self, completion: str | None = None) -> str:
        """The code to judge (default: the reference), then the task's setup code.

        Line ends are normalised (the release uses ``\\r\\n``)."""
        code = (self.code if completion is None else completion).replace("\r\n", "\n")
        setup = self.test_setup_code.replace("\r\n", "\n").strip()
        return code + ("\n\n" + setup + "\n" if setup else "\n")

    def job(self, completion: str | None = None, *, timeout_s: float = 10.0,
            memory_mb: int = 1024, challenge: bool = False) -> sandbox.Job:
        """A sandbox job: :meth:`program` against the three asserts (+ the challenge ones)."""
        tests = self.test_list + (self.challenge_test_list if challenge else ())
        return sandbox.Job(self.program(completion), tests, timeout_s, memory_mb)


def load_mbpp(path: str | Path, split: str = "test") -> list[MBPPTask]:
    """MBPP tasks of ``split`` ("prompt", "test", "validation", "train" or "all") from the
    published ``mbpp.jsonl``, ordered by task id.

    Raises:
        ValueError: unknown split, or no task of that split in the file.
    """
    if split != "all" and split not in MBPP_SPLITS:
        raise ValueError(f"unknown MBPP split {split!r}; use one of "
                         f"{sorted(MBPP_SPLITS) + ['all']}")
    tasks = []
    with open(path, encoding="utf-8") as f:
        for text in f:
            if not text.strip():
                continue
            r = json.loads(text)
            task = MBPPTask(int(r["task_id"]), r["text"], r["code"], tuple(r["test_list"]),
                            r.get("test_setup_code") or "", tuple(r.get("challenge_test_list")
                                                                 or ()))
            if split == "all" or task.split == split:
                tasks.append(task)
    if not tasks:
        raise ValueError(f"{path} holds no MBPP tasks of split {split!r}")
    return sorted(tasks, key=lambda t: t.task_id)


def judge_mbpp(tasks: Sequence[MBPPTask], completions: Sequence[str] | None = None, *,
               workers: int = 2, timeout_s: float = 10.0, memory_mb: int = 1024,
               box: sandbox.Sandbox | None = None) -> list[sandbox.ExecResult]:
    """Run each completion (default: each reference) against its task's asserts."""
    if completions is not None and len(completions) != len(tasks):
        raise ValueError(f"{len(completions)} completions for {len(tasks)} tasks")
    jobs = [t.job(None if completions is None else completions[i], timeout_s=timeout_s,
                  memory_mb=memory_mb) for i, t in enumerate(tasks)]
    if box is not None:
        return box.run_many(jobs, workers=workers)
    return sandbox.run_many(jobs, workers=workers)


# ----------------------------------------------------------------------------- problems
@dataclass(frozen=True)
class Problem:
    """One problem of a suite, with both of its prompts and what its solutions are judged with.

    A solution is judged as ``code``, then ``test_setup_code``, then each of ``tests`` in order
    (HumanEval: its ``check`` function, then ``check(entry_point)``; MBPP: its setup code, then
    its three asserts).
    """

    suite: str
    task_id: str | int
    split: str
    prompt: str  # the user turn of chat mode
    base_prompt: str  # the text continued in base mode
    entry_point: str | None
    tests: tuple[str, ...]
    test_setup_code: str = ""
    header: str = ""  # HumanEval: the prompt's text before the target function (imports, helpers)
    reference: str = ""  # a known-good solution, as judged (the canonical / reference code)

    def program(self, code: str) -> str:
        """The program the sandbox runs: ``code``, then ``test_setup_code``; ``""`` when ``code`` is
        blank (judged "the program has no code", whatever the setup defines)."""
        if not code.strip():
            return ""
        setup = self.test_setup_code.strip("\n")
        return code.rstrip() + ("\n\n\n" + setup + "\n" if setup else "\n")

    def row(self) -> dict[str, Any]:
        """The problem's fields stored with each sample (and kept by ``eval filter``)."""
        return {"suite": self.suite, "split": self.split, "task_id": self.task_id, "prompt": self.prompt,
                "entry_point": self.entry_point, "tests": list(self.tests), "test_setup_code": self.test_setup_code}


def parse_suite(spec: str) -> tuple[str, Path | None]:
    """``"humaneval"``, ``"humaneval:PATH"`` or ``"mbpp:PATH"`` -> ``(name, path or None)``.

    Raises:
        ValueError: unknown suite, ``mbpp`` without a path, or a path that does not exist.
    """
    name, _, path = spec.partition(":")
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; use humaneval, humaneval:PATH or mbpp:PATH")
    if name == "mbpp" and not path:
        raise ValueError("MBPP is read from a local file: give --suite mbpp:PATH, PATH being the published "
                         "mbpp.jsonl (https://github.com/google-research/google-research/tree/master/mbpp)")
    if path and not Path(path).is_file():
        raise ValueError(f"--suite {spec}: {path} is not a file")
    return name, Path(path) if path else None


def _humaneval_header(prompt: str, entry_point: str) -> str:
    """The lines of a HumanEval prompt before the definition of ``entry_point``."""
    tree = parse_quietly(prompt)
    node = next((n for n in (tree.body if tree else []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == entry_point), None)
    if node is None:
        return ""
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return "".join(prompt.splitlines(keepends=True)[:first - 1])


def load_humaneval(path: str | Path | None = None) -> list[Problem]:
    """The 164 HumanEval problems: the copy shipped with codechat (:data:`HUMANEVAL_FILE`) unless
    ``path``, a ``HumanEval.jsonl`` in the same format (``.gz`` allowed).

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    from codechat.data.formats import HUMANEVAL_PROMPT
    path = Path(path) if path else HUMANEVAL_FILE
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        rows = {r["task_id"]: r for r in (json.loads(line) for line in f if line.strip())}
    out = []
    for task_id, r in sorted(rows.items(), key=lambda kv: int(kv[0].rsplit("/", 1)[-1])):
        ep = r["entry_point"]
        out.append(Problem("humaneval", task_id, "test", HUMANEVAL_PROMPT.format(prompt=r["prompt"]), r["prompt"], ep,
                           (f"check({ep})",), r["test"], _humaneval_header(r["prompt"], ep),
                           r["prompt"] + r["canonical_solution"]))
    return out


def mbpp_shot(task: MBPPTask, with_code: bool) -> str:
    """One example in :data:`MBPP_FEWSHOT` form, solved (a shot) or open (the task)."""
    text = MBPP_FEWSHOT.format(text=task.text.strip(), tests="\n".join(t.strip() for t in task.test_list))
    if not with_code:
        return text
    return text + task.code.replace("\r\n", "\n").strip() + "\n[DONE]\n\n"


def load_mbpp_problems(path: str | Path, split: str = "test", shots: int = 3) -> list[Problem]:
    """MBPP problems of ``split``; their base prompt starts with ``shots`` solved tasks of 2-4."""
    from codechat.data.formats import mbpp_prompt
    if not 0 <= shots <= len(MBPP_FEWSHOT_IDS):
        raise ValueError(f"--shots must be in 0..{len(MBPP_FEWSHOT_IDS)} (the MBPP paper's examples are tasks "
                         f"{', '.join(map(str, MBPP_FEWSHOT_IDS))}), got {shots}")
    prompt_tasks = {t.task_id: t for t in load_mbpp(path, "prompt")} if shots else {}
    missing = [i for i in MBPP_FEWSHOT_IDS[:shots] if i not in prompt_tasks]
    if missing:
        raise ValueError(f"{path} lacks the few-shot tasks {missing}; use --shots 0 or the complete file")
    prefix = "".join(mbpp_shot(prompt_tasks[i], True) for i in MBPP_FEWSHOT_IDS[:shots])
    return [Problem("mbpp", t.task_id, t.split, mbpp_prompt(t.text, t.test_list), prefix + mbpp_shot(t, False),
                    t.entry_point, tuple(t.test_list), t.test_setup_code.replace("\r\n", "\n").strip(),
                    reference=t.code.replace("\r\n", "\n"))
            for t in load_mbpp(path, split)]


def load_problems(spec: str, split: str = "test", *, limit: int | None = None, shots: int = 3) -> list[Problem]:
    """The problems of ``--suite spec`` and ``--split``, the first ``limit`` of them (by task id).

    Raises:
        ValueError: a bad suite, split, shot count or limit.
    """
    name, path = parse_suite(spec)
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit}")
    if name == "humaneval":
        if split != "test":
            raise ValueError(f"HumanEval has only a test split, got --split {split}")
        problems = load_humaneval(path)
    else:
        problems = load_mbpp_problems(path, split, shots)
    return problems[:limit] if limit else problems
