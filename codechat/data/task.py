"""The RL task type: a chat prompt the policy continues, and what its answer is judged with.

:class:`Task` is defined here, below every task source (``codechat.data.tasks`` loads specs,
``codechat.data.doctest_tasks`` mines doctests); both import it, neither imports the other's loader.
Kinds and fields: :mod:`codechat.data.tasks`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from codechat.chat.conversation import Conversation, Message
from codechat.eval import sandbox
from codechat.eval.problems import Problem

KINDS = ("code", "funcall")


@dataclass(frozen=True)
class Task:
    """One RL task: ``prompt`` (the conversation the policy continues) and its judge.

    Code tasks (``kind="code"``) carry ``tests`` (statements run in order after the program),
    ``test_setup_code``, ``entry_point`` and ``reference`` (a known-good solution, as judged, or
    ``None``), all those of ``problem``, the :class:`~codechat.eval.problems.Problem` that judges
    them (built from the fields when not given). Funcall tasks carry ``expected_call``
    (``{"name": str, "arguments": dict}``) and ``tools`` (the schemas declared by the prompt).
    ``source`` says where the task was read (``FILE:LINE`` where there is a line).

    Raises:
        ValueError: unknown kind, a prompt that ends with an assistant turn, a code task without
            tests, a funcall task without an expected call or tools, or fields that contradict
            ``problem``.
    """

    task_id: str
    kind: str
    prompt: Conversation
    tests: tuple[str, ...] = ()
    test_setup_code: str = ""
    entry_point: str | None = None
    reference: str | None = None
    expected_call: dict[str, Any] | None = None
    tools: tuple[dict[str, Any], ...] = ()
    source: str = ""
    problem: Problem | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"task {self.task_id!r}" + (f" ({self.source})" if self.source else "")
        if self.kind not in KINDS:
            raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.prompt, Conversation):
            raise ValueError(f"{where}: prompt must be a Conversation, got {type(self.prompt).__name__}")
        if self.prompt.messages[-1].role == "assistant":
            raise ValueError(f"{where}: the prompt ends with an assistant turn; the policy must answer it")
        object.__setattr__(self, "tests", tuple(self.tests))
        object.__setattr__(self, "tools", tuple(self.tools or ()))
        if self.kind == "code":
            if not self.tests or not all(isinstance(t, str) and t.strip() for t in self.tests):
                raise ValueError(f"{where}: a code task needs tests (non-empty statements), got {list(self.tests)!r}")
            if self.expected_call is not None or self.tools:
                raise ValueError(f"{where}: a code task has no expected_call or tools")
            if self.problem is None:
                user = [m.content for m in self.prompt.messages if m.role == "user"]
                object.__setattr__(self, "problem", Problem(
                    "task", self.task_id, "", user[-1] if user else "", "", self.entry_point, self.tests,
                    self.test_setup_code, reference=self.reference or ""))
            p = self.problem
            if (p.tests, p.test_setup_code, p.entry_point, p.reference or None) != \
                    (self.tests, self.test_setup_code, self.entry_point, self.reference):
                raise ValueError(f"{where}: tests, test_setup_code, entry_point and reference must be the problem's")
        else:
            if not isinstance(self.expected_call, dict) or not isinstance(self.expected_call.get("name"), str):
                raise ValueError(f"{where}: a funcall task needs expected_call {{'name', 'arguments'}}, "
                                 f"got {self.expected_call!r}")
            if not self.tools:
                raise ValueError(f"{where}: a funcall task needs the tools its prompt declares")
            if self.tests or self.reference is not None or self.problem is not None:
                raise ValueError(f"{where}: a funcall task has no tests, reference or problem")

    @classmethod
    def from_problem(cls, problem: Problem, source: str, task_id: str | None = None) -> Task:
        """The code task of ``problem``: its user turn (the chat-mode prompt of ``codechat eval``)."""
        return cls(task_id if task_id is not None else str(problem.task_id), "code",
                   Conversation((Message("user", problem.prompt),)), problem.tests, problem.test_setup_code,
                   problem.entry_point, problem.reference or None, source=source, problem=problem)

    def _code_problem(self) -> Problem:
        if self.kind != "code" or self.problem is None:
            raise ValueError(f"task {self.task_id!r} is a {self.kind} task: judge its call against expected_call")
        return self.problem

    def code(self, answer: str) -> str:
        """The code judged for the policy's chat ``answer`` (as ``codechat eval`` in chat mode); a
        non-HumanEval problem's ``header`` (doctest tasks: the imports) comes first when there is code."""
        from codechat.eval.suites import solution_code  # the eval runner, imported only when judging
        p = self._code_problem()
        code = solution_code(p, "chat", answer)
        return p.header + code if p.suite != "humaneval" and p.header and code.strip() else code

    def program(self, code: str) -> str:
        """The program the sandbox runs for ``code``: :meth:`Problem.program` (code, then setup)."""
        return self._code_problem().program(code)

    def job(self, answer: str, *, timeout_s: float = 10.0, memory_mb: int = 1024) -> sandbox.Job:
        """The sandbox job judging ``answer``: ``program(code(answer))`` against ``tests``."""
        return sandbox.Job(self.program(self.code(answer)), self.tests, timeout_s, memory_mb)

    def text(self) -> str:
        """What decontamination checks of the task: its last prompt turn, reference and tests, one per line."""
        return "\n".join([self.prompt.messages[-1].content or "", self.reference or "", *self.tests])

    def reference_job(self, *, timeout_s: float = 10.0, memory_mb: int = 1024) -> sandbox.Job:
        """The sandbox job judging ``reference``.

        Raises:
            ValueError: a funcall task, or no reference.
        """
        self._code_problem()
        if self.reference is None:
            raise ValueError(f"task {self.task_id!r} has no reference solution")
        return sandbox.Job(self.program(self.reference), self.tests, timeout_s, memory_mb)


def failing_references(tasks: Sequence[Task], *, box: sandbox.Sandbox | None = None, workers: int = 2,
                       timeout_s: float = 10.0, memory_mb: int = 1024) -> list[tuple[Task, sandbox.ExecResult]]:
    """Run the reference of every code task that has one; the ``(task, result)`` of those that fail."""
    todo = [t for t in tasks if t.kind == "code" and t.reference is not None]
    jobs = [t.reference_job(timeout_s=timeout_s, memory_mb=memory_mb) for t in todo]
    if not jobs:
        return []
    results = box.run_many(jobs, workers=workers) if box is not None else sandbox.run_many(jobs, workers=workers)
    return [(t, r) for t, r in zip(todo, results) if not r.passed]


def describe_failure(result: sandbox.ExecResult) -> str:
    failed = next((o for o in result.tests if o.outcome != "passed"), None)
    detail = result.error or (f"test {failed.index}: {failed.error or failed.outcome}" if failed else "")
    return f"{result.status}" + (f": {detail}" if detail else "")


__all__ = ["KINDS", "Task", "failing_references", "describe_failure"]
