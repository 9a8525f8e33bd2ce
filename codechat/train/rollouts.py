"""RL rollouts: ``group_size`` samples per task through the generation engine, judged as they finish.

:func:`collect` renders each task's prompt, asks the :class:`~codechat.engine.Engine` for a
group of samples (one request per task: its samples share one prefill, and every task of the
batch runs in the same continuous batch), and hands each sample to the :class:`Judge` the moment
its row finishes, so the sandbox runs programs while the engine still decodes the other rows.
The sampled ids and the engine's per-token log-probs are kept as generated (never re-tokenised
from text): the trainer scores exactly those tokens.

Rewards (:class:`Judge`): code tasks run ``task.job(answer)`` in a bounded pool of sandbox
workers and apply ``binary``, ``fractional`` or ``tiered`` (:mod:`codechat.eval.rewards`) to
the :class:`~codechat.eval.sandbox.ExecResult`; function-call tasks are scored in process by
``funcall_tiered``. A rollout whose judging failed (the sandbox itself broke) has reward
``None``: it is *unscorable*, gets advantage 0 and is counted.
"""
from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

from codechat.data.task import Task
from codechat.eval import rewards as R

#: ``--reward`` values and the task kind each one judges.
REWARD_KINDS = {"binary": "code", "fractional": "code", "tiered": "code", "funcall_tiered": "funcall"}


@dataclass
class Rollout:
    """One sampled completion and its verdict.

    Attributes:
        task_id: the task (and group) it answers.
        prompt_ids: the rendered prompt (int ids).
        completion_ids: the sampled ids, the stop id included when the row stopped.
        engine_logprobs: the engine's log-probability of each completion id under the
            distribution it was drawn from (same length as ``completion_ids``).
        finish: ``stop`` or ``length`` (cut at ``max_new_tokens``).
        text: the completion decoded without its stop id (what the judge read; ``<|function_call|>``
            spelled out).
        reward: the reward, or ``None`` when unscorable.
        passed: code: every test passed; funcall: the exact expected call (reward 1.0).
        tests_passed: code: tests passed (0 for funcall).
        detail: the sandbox status (code) or ``""``.
    """

    task_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    engine_logprobs: list[float]
    finish: str
    text: str = ""
    reward: float | None = None
    passed: bool = False
    tests_passed: int = 0
    detail: str = ""


@dataclass
class RolloutBatch:
    """The rollouts of one RL step, task-major (``group_size`` consecutive rows per task), and timings.

    ``generate_s``: seconds from the first request to the last sampled token; ``judge_s``:
    seconds from then until the last verdict (judging that overlapped generation is not counted);
    ``prompts_truncated``: prompts shortened (oldest turns first) to leave room to generate.
    """

    rollouts: list[Rollout]
    generate_s: float
    judge_s: float
    prompts_truncated: int = 0

    def passes_per_task(self, group_size: int) -> list[int]:
        """Rollouts that passed every test, per task (``group_size`` consecutive rows each)."""
        rs = self.rollouts
        return [sum(r.passed for r in rs[i:i + group_size]) for i in range(0, len(rs), group_size)]

    @property
    def completion_tokens(self) -> int:
        return sum(len(r.completion_ids) for r in self.rollouts)


class Judge:
    """Scores rollouts with the named reward; code through a pool of ``workers`` sandbox processes.

    Args:
        reward: a key of :data:`REWARD_KINDS`.
        workers: programs judged at once (threads feeding one :class:`~codechat.eval.sandbox.Sandbox`).
        timeout_s, memory_mb: limits per program.

    Raises:
        ValueError: an unknown reward.
    """

    def __init__(self, reward: str, *, workers: int = 2, timeout_s: float = 10.0, memory_mb: int = 1024) -> None:
        if reward not in REWARD_KINDS:
            raise ValueError(f"unknown reward {reward!r}; use one of {', '.join(REWARD_KINDS)}")
        self.reward, self.kind = reward, REWARD_KINDS[reward]
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        self.workers = workers
        self._box = None
        self._pool: ThreadPoolExecutor | None = None
        self._tools: dict[str, dict] = {}

    def check(self, tasks: Sequence[Task]) -> None:
        """Raises ValueError (naming the setting and a task) unless every task is of this reward's
        kind, and every funcall task's expected function is among its declared tools."""
        for t in tasks:
            if t.kind != self.kind:
                fits = [k for k, v in REWARD_KINDS.items() if v == t.kind]
                raise ValueError(f"--reward {self.reward} judges {self.kind} tasks, but task {t.task_id!r} "
                                 f"({t.source}) is a {t.kind} task: use --reward {' / '.join(fits)}")
            if t.kind == "funcall":
                names = set(self.tools(t))
                if t.expected_call["name"] not in names:
                    raise ValueError(f"task {t.task_id!r} ({t.source}): the expected call "
                                     f"{t.expected_call['name']!r} is not among its tools {sorted(names)}")

    def tools(self, task: Task) -> dict:
        """The :class:`~codechat.tools.Tool` objects of a funcall task by name (loaded once per task)."""
        if task.task_id not in self._tools:
            from codechat.tools import tool_from_schema
            loaded = [tool_from_schema(s, f"task {task.task_id}") for s in task.tools]
            self._tools[task.task_id] = {t.name: t for t in loaded}
        return self._tools[task.task_id]

    def submit(self, task: Task, rollout: Rollout) -> Future | None:
        """Start judging ``rollout`` (code: in the pool; funcall: at once). Returns the future, or None."""
        if self.kind == "funcall":
            rollout.reward = R.funcall_tiered(rollout.text, task.expected_call, self.tools(task))
            rollout.passed = rollout.reward == R.FUNCALL.exact
            return None
        if self._pool is None:
            from codechat.eval.sandbox import Sandbox
            self._box = Sandbox(self.workers)
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="judge")
        job = task.job(rollout.text, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
        return self._pool.submit(self._judge_code, job, rollout)

    def _judge_code(self, job: Any, rollout: Rollout) -> None:
        try:
            result = self._box.run(job.program, job.tests, timeout_s=job.timeout_s, memory_mb=job.memory_mb)
        except Exception as e:  # noqa: BLE001 - the sandbox broke: unscorable, counted, never fatal
            rollout.reward, rollout.detail = None, f"unscorable: {type(e).__name__}: {e}"
            return
        rollout.reward = R.REWARDS[self.reward](result)
        rollout.passed, rollout.tests_passed, rollout.detail = result.passed, result.tests_passed, result.status

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._box.close()
            self._pool = self._box = None


def _request_of(engine: Any, tok: Any, task: Task, seed: int, group_size: int,
                sampling: Any) -> tuple[Any, list[int], bool]:
    """The engine request of ``group_size`` samples of ``task`` (its prompt rendered to leave room for
    ``sampling.max_new_tokens``, cut to half the engine's context at most), its prompt ids, and
    whether old turns were dropped or the prompt cut to fit."""
    from dataclasses import replace

    from codechat.chat.budget import render_for_completion_within
    from codechat.chat.calls import FUNCTION_CALL_TOKEN
    from codechat.engine import Request
    new = min(sampling.max_new_tokens, engine.max_len // 2)
    ids, counts = render_for_completion_within(tok, task.prompt, engine.max_len - new)
    stops = sorted(tok.special_ids - {tok.special_id(FUNCTION_CALL_TOKEN)})
    request = Request(ids, replace(sampling, max_new_tokens=new), samples=group_size, seed=seed, stop_ids=stops)
    return request, ids, bool(counts.turns_dropped or counts.prompt_tokens_cut)


def _rollout(engine: Any, tok: Any, ev: Any, task_id: str, prompt_ids: list[int]) -> Rollout:
    """The :class:`Rollout` of the finished row of token event ``ev`` (the judge never sees the stop id)."""
    s = engine.output(ev.request)[ev.sample]
    answer = s.token_ids[:-1] if s.finish == "stop" else s.token_ids
    return Rollout(task_id, prompt_ids, list(s.token_ids), list(s.logprobs), s.finish, text=tok.decode(answer))


def collect(engine: Any, tok: Any, tasks: Sequence[Task], seeds: Sequence[int], judge: Judge, *,
            group_size: int, sampling: Any) -> RolloutBatch:
    """Sample ``group_size`` completions of every task and judge them; rollouts task-major.

    Args:
        engine: a :class:`~codechat.engine.Engine` holding the current policy's weights.
        tok: the tokenizer.
        tasks, seeds: the step's tasks and one sampling seed per task (sample ``i`` of a task is
            the engine's stream ``(seed, i)``: the same whatever else is in the batch).
        judge: the :class:`Judge`.
        group_size: samples per task.
        sampling: the :class:`~codechat.engine.SamplingConfig` (its ``max_new_tokens`` is cut to
            what the context leaves after the prompt).

    Raises:
        ValueError: a prompt that leaves no room to generate even after dropping old turns.
    """
    owner: dict[int, tuple[int, list[int]]] = {}
    truncated = 0
    t0 = time.perf_counter()
    for j, (task, seed) in enumerate(zip(tasks, seeds)):
        request, ids, cut = _request_of(engine, tok, task, seed, group_size, sampling)
        truncated += cut
        owner[engine.add(request)] = (j, ids)
    slots: list[Rollout | None] = [None] * (len(tasks) * group_size)
    futures: list[Future] = []
    while engine.has_work():
        for ev in engine.step():
            if ev.finish is None or ev.request not in owner:
                continue
            j, ids = owner[ev.request]
            r = slots[j * group_size + ev.sample] = _rollout(engine, tok, ev, tasks[j].task_id, ids)
            f = judge.submit(tasks[j], r)
            if f is not None:
                futures.append(f)
    for rid in owner:
        engine.pop(rid)
    t1 = time.perf_counter()
    for f in futures:
        f.result()
    t2 = time.perf_counter()
    assert all(r is not None for r in slots), "the engine finished without every sample"
    return RolloutBatch(slots, generate_s=t1 - t0, judge_s=t2 - t1, prompts_truncated=truncated)  # type: ignore[arg-type]


def stream_passes(engine: Any, tok: Any, feed: Iterable[tuple[Task, int]], judge: Judge, *, group_size: int,
                  sampling: Any) -> Iterator[tuple[Task, int]]:
    """Sample ``group_size`` completions of each ``(task, seed)`` of ``feed`` and yield ``(task, passed)``
    (samples that passed every test) as each task's samples are judged, in the order they finish.

    ``feed`` is read only while the engine has room: its rows running and queued stay at one and a half
    times its slots, so the next tasks' rows join as earlier rows finish (continuous batching) rather
    than a batch waiting for its longest row. :func:`codechat.train.task_pool.filter_pool`'s sampler.

    Raises:
        ValueError: a prompt that leaves no room to generate even after dropping old turns.
    """
    target = engine.slots + engine.slots // 2
    feed = iter(feed)
    owner: dict[int, tuple[Task, list[int]]] = {}  # request id -> task, prompt ids
    left: dict[int, int] = {}  # request id -> rows not yet finished
    verdicts: dict[int, list[Future]] = {}  # request id -> its finished rows' judging (code tasks)
    rollouts: dict[int, list[Rollout]] = {}
    more = True
    while True:
        while more and sum(engine.busy()) + group_size <= target:
            try:
                task, seed = next(feed)
            except StopIteration:
                more = False
                break
            request, ids, _ = _request_of(engine, tok, task, seed, group_size, sampling)
            rid = engine.add(request)
            owner[rid], left[rid], verdicts[rid], rollouts[rid] = (task, ids), group_size, [], []
        if not owner:
            return
        if engine.has_work():
            for ev in engine.step():
                if ev.finish is None or ev.request not in owner:
                    continue
                task, ids = owner[ev.request]
                r = _rollout(engine, tok, ev, task.task_id, ids)
                rollouts[ev.request].append(r)
                left[ev.request] -= 1
                if (f := judge.submit(task, r)) is not None:
                    verdicts[ev.request].append(f)
        else:  # every row generated: wait for a verdict rather than spin
            wait([f for fs in verdicts.values() for f in fs], return_when=FIRST_COMPLETED)
        for rid in [rid for rid in owner if not left[rid] and all(f.done() for f in verdicts[rid])]:
            for f in verdicts.pop(rid):
                f.result()
            engine.pop(rid)
            del left[rid]
            yield owner.pop(rid)[0], sum(r.passed for r in rollouts.pop(rid))


__all__ = ["REWARD_KINDS", "Rollout", "RolloutBatch", "Judge", "collect", "stream_passes"]
