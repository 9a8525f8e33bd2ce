"""Teacher completions through an OpenAI-compatible API: ``codechat distill``.

Every prompt of ``--prompts`` (any SFT source, see :mod:`codechat.data.prompts`: the
conversation up to its last user turn, with its tools) is sent once to ``--base-url``'s
``/v1/chat/completions`` with the :class:`TeacherGenConfig` sampling settings, ``concurrency``
requests at a time, through the official ``openai`` client (``pip install 'codechat[serve]'``;
its own retries are off so that the policy below is the one in force). What comes back is
judged (:func:`judge`):

- kept: text (``<think>...</think>`` removed with ``strip_think``), or tool calls with
  ``content: null`` (each call one function-call turn), appended to ``DIR/completions.jsonl``;
- rejected, with its reason (:data:`REJECT_REASONS`), appended to ``DIR/rejected.jsonl`` with
  the whole message: ``length`` (``finish_reason: "length"``, cut off by ``max_tokens``),
  ``content_filter``, ``empty_choices``, ``empty_content`` (nothing left once thinking is
  removed), ``unclosed_think`` (``<think>`` never closed), ``bad_tool_arguments`` (a call whose
  arguments are not a JSON object), ``bad_request`` (an HTTP 400/413/422 for this prompt).

429 (rate limited), 408/409/5xx, dropped connections, timeouts and unreadable responses are
retried ``retries`` times with exponential back-off (``backoff_base_s`` x 2^attempt, x a
random 0.5-1, at most ``backoff_max_s``), or after the server's ``Retry-After`` /
``retry-after-ms`` when it sends one (at most ``retry_after_max_s``). A prompt still failing
then is *failed*: written to ``rejected.jsonl`` with ``"final": false``, and the next run asks
again. 401/403/404 stop the run (a wrong key, model or URL fails every prompt alike).

Every line carries the prompt ``id`` and is flushed when written, so ``kill -9`` loses only
the requests in flight; a rerun with the same ``--out`` skips the ids kept or finally rejected
(an unfinished last line, cut by a crash, is removed first). Ctrl-C stops at once, whatever is
in flight: the requests in flight and their retries are cancelled (nothing is written for them,
the next run asks them again), the summary is written and the command exits 130. A process
started with SIGINT ignored (a script's ``cmd &`` job; its children inherit that) ignores Ctrl-C,
as POSIX asks, and says so when it starts: stop it with ``kill -TERM`` (what was written is
kept, as after ``kill -9``). ``DIR/summary.json`` (rewritten atomically after every answer) holds:

``prompts`` (this run's prompt set), ``kept``, ``rejected`` (final, by reason), ``failed``
(retried by the next run, by last reason), ``pending`` (what a rerun would ask), ``tokens``
(``prompt`` / ``completion``: the ``usage`` sums over every stored line), ``teacher``
(model and generation settings; a rerun with other ones is refused), ``settings`` (the URL
and the whole :class:`TeacherGenConfig`), ``this_run``
(``requests`` sent, ``retries`` by reason, ``kept``, ``rejected``, ``failed``, ``skipped``
(already done), ``wall_s``, ``interrupted``).

The API key is read from the environment variable ``api_key_env`` (default
``OPENAI_API_KEY``), else from a ``.env`` file in the working directory; never from the
config. It is never printed nor written: it is removed from any server text that is stored.
"""
from __future__ import annotations

import argparse
import asyncio
import email.utils
import os
import random
import re
import signal
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codechat.chat.openai_messages import openai_tools, to_openai
from codechat.config.hosts import is_loopback_url
from codechat.config.sft import SFT_FORMATS, SFTConfig
from codechat.config.stages import ConfigError, to_dict
from codechat.data.formats import FormatError, to_conversation
from codechat.data.prompts import prompt_id, prompt_of
from codechat.data.teacher_store import AnswerStore, Prompt

#: Reasons an answer is rejected for good (see the module docstring).
REJECT_REASONS = ("length", "content_filter", "empty_choices", "empty_content", "unclosed_think",
                  "bad_tool_arguments", "bad_request")
#: Reasons a request is retried (and a prompt's reason when it still fails after ``retries``).
RETRY_REASONS = ("rate_limited", "server_error", "connection_error", "timeout", "bad_response")
#: HTTP statuses that stop the whole run: every prompt would fail alike.
FATAL_STATUS = {401: "the API key was refused", 403: "the API key may not use this model",
                404: "no such model or endpoint"}
INSTALL_HINT = "codechat distill needs the openai package: pip install 'codechat[serve]'"
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


class TeacherError(RuntimeError):
    """The teacher refuses every request (HTTP 401/403/404): the run stops."""


@dataclass(frozen=True)
class TeacherGenConfig:
    """How the teacher is asked: sampling, concurrency and the retry policy (the seed's settings).

    Raises:
        ConfigError: a value out of range, naming the setting (``teacher.*``).
    """

    temperature: float = 1.0  # sampling temperature sent with each request
    top_p: float = 0.95  # nucleus sampling mass sent with each request
    max_tokens: int = 16384  # completion tokens at most; an answer cut there is rejected (length)
    strip_think: bool = True  # remove <think>...</think> from kept answers (an unclosed <think> is rejected)
    concurrency: int = 16  # requests in flight at once
    retries: int = 3  # further attempts of a request after a 429 / 5xx / connection error / timeout
    system_prompt: str = ""  # system message sent when a prompt has none of its own ("" -> none; not trained on)
    request_timeout_s: float = 600.0  # seconds a request may take, answer included, before it is retried
    connect_timeout_s: float = 10.0  # seconds to open a connection
    backoff_base_s: float = 1.0  # first retry waits about this long, doubling each attempt
    backoff_max_s: float = 60.0  # back-off never waits longer (without Retry-After)
    retry_after_max_s: float = 300.0  # a server's Retry-After is honoured up to this many seconds

    def __post_init__(self) -> None:
        def check(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)
        check(0.0 <= self.temperature <= 2.0, f"teacher.temperature must be in [0, 2], got {self.temperature}")
        check(0.0 < self.top_p <= 1.0, f"teacher.top_p must be in (0, 1], got {self.top_p}")
        for name in ("max_tokens", "concurrency"):
            check(getattr(self, name) >= 1, f"teacher.{name} must be >= 1, got {getattr(self, name)}")
        check(self.retries >= 0, f"teacher.retries must be >= 0 (0: no retry), got {self.retries}")
        for name in ("request_timeout_s", "connect_timeout_s"):
            check(getattr(self, name) > 0, f"teacher.{name} must be > 0 seconds, got {getattr(self, name)}")
        for name in ("backoff_base_s", "backoff_max_s", "retry_after_max_s"):
            check(getattr(self, name) >= 0, f"teacher.{name} must be >= 0 seconds, got {getattr(self, name)}")

    def generation(self) -> dict[str, Any]:
        """The settings that shape the answers (a rerun into the same directory must keep them)."""
        return {k: getattr(self, k) for k in ("temperature", "top_p", "max_tokens", "strip_think", "system_prompt")}


@dataclass(frozen=True)
class DistillConfig:
    """Everything ``codechat distill`` needs; the API key is deliberately not a setting.

    Raises:
        ConfigError: a bad value (a missing ``prompts`` / ``base_url`` / ``model`` / ``out``:
            :meth:`check_required`, as the defaults must build).
    """

    prompts: str = ""  # SFT source spec SOURCE[@SPLIT][#FORMAT],... (weights are ignored; weight 0 skips)
    base_url: str = ""  # the API root, e.g. http://127.0.0.1:8000/v1
    model: str = ""  # the teacher's model name
    out: str = ""  # directory of completions.jsonl, rejected.jsonl, summary.json
    api_key_env: str = "OPENAI_API_KEY"  # environment (or ./.env) variable holding the API key
    format: str = "auto"  # record format of every source (see codechat.data.formats)
    skip_bad: bool = False  # skip (and count) records that fit no format or have no user turn
    limit: int = 0  # > 0 -> only the first N prompts (smoke runs)
    teacher: TeacherGenConfig = field(default_factory=TeacherGenConfig)

    def __post_init__(self) -> None:
        if self.base_url and urllib.parse.urlparse(self.base_url).scheme not in ("http", "https"):
            raise ConfigError(f"--base-url {self.base_url!r} must start with http:// or https://")
        if self.format not in SFT_FORMATS:
            raise ConfigError(f"format must be one of {', '.join(SFT_FORMATS)}, got {self.format!r}")
        if self.limit < 0 or not self.api_key_env:
            raise ConfigError("limit must be >= 0 (0: all) and api_key_env a variable name")

    def check_required(self) -> None:
        """Raises ConfigError naming the first of ``prompts``, ``base_url``, ``model``, ``out`` left empty."""
        for name, flag in (("prompts", "--prompts SPEC"), ("base_url", "--base-url URL"), ("model", "--model NAME"),
                           ("out", "--out DIR")):
            if not getattr(self, name):
                raise ConfigError(f"no {flag} given (distill needs prompts, a teacher URL, its model and --out)")


# ----------------------------------------------------------------------------- key and prompts
def api_key(env_name: str, cwd: str | os.PathLike = ".") -> str | None:
    """The key in ``$env_name``, else in ``cwd/.env`` (read by python-dotenv), else ``None``."""
    if os.environ.get(env_name):
        return os.environ[env_name]
    env_file = Path(cwd) / ".env"
    if env_file.is_file():
        try:
            from dotenv import dotenv_values
        except ImportError:
            raise ConfigError(INSTALL_HINT) from None
        return dotenv_values(env_file).get(env_name) or None
    return None


def _openai() -> Any:
    """The ``openai`` module, imported only here (training never imports it).

    Raises:
        ConfigError: it is not installed (:data:`INSTALL_HINT`).
    """
    try:
        import openai
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return openai


def shown_url(url: str) -> str:
    """``url`` without a ``user:password@`` part, for logs and the summary."""
    parts = urllib.parse.urlparse(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def load_prompts(cfg: DistillConfig) -> list[Prompt]:
    """The prompts of ``cfg.prompts`` (every record of each positive-weight source, in order; ``limit``).

    Raises:
        ConfigError: a source cannot be read, two prompts share an id, or (without ``skip_bad``) a
            record has no user turn; each named by file and line.
    """
    from codechat.data.mixture import load_source
    from codechat.data.spec import parse_spec
    sft = SFTConfig(format=cfg.format, skip_bad=cfg.skip_bad, decontaminate=False)
    out: list[Prompt] = []
    seen: dict[str, str] = {}
    for item in parse_spec(cfg.prompts):
        if item.weight == 0:
            continue
        for rec in load_source(item, sft):
            prompt, pid, where = prompt_of(rec.conversation), prompt_id(rec), f"{rec.source}:{rec.line}"
            if prompt is None:
                if cfg.skip_bad:
                    continue
                raise ConfigError(f"{where}: the record has no user turn, so no prompt to answer (--skip-bad skips "
                                  "such records)")
            if pid in seen:
                raise ConfigError(f"{where}: prompt id {pid!r} is also the id of {seen[pid]}; give the records "
                                  "distinct 'id' fields (or none: FILE:LINE is used)")
            seen[pid] = where
            out.append(Prompt(pid, prompt))
            if cfg.limit and len(out) == cfg.limit:
                return out
    if not out:
        raise ConfigError(f"--prompts {cfg.prompts}: no prompt found")
    return out


# ----------------------------------------------------------------------------- the wire format
def request_messages(prompt: Prompt, system_prompt: str = "") -> list[dict[str, Any]]:
    """The prompt as OpenAI chat messages (:func:`codechat.chat.openai_messages.to_openai`), ``system_prompt``
    first when the prompt has no system message."""
    msgs = to_openai(prompt.conversation.messages)
    if system_prompt and prompt.conversation.messages[0].role != "system":
        msgs.insert(0, {"role": "system", "content": system_prompt})
    return msgs


@dataclass(frozen=True)
class Judged:
    """What :func:`judge` made of a response: ``reason`` ``""`` (kept, ``answer`` its turns) or a rejection."""

    reason: str
    answer: list[dict[str, Any]]
    message: dict[str, Any] | None
    finish_reason: str | None
    detail: str = ""


def _dump(obj: Any) -> Any:
    """A response object (pydantic, from the openai client) as plain JSON values."""
    return obj.model_dump(exclude_none=True) if hasattr(obj, "model_dump") else obj


def judge(response: Any, strip_think: bool) -> Judged:
    """Keep or reject one chat completion (see the module docstring for the reasons)."""
    choices = getattr(response, "choices", None) or []
    if not choices:
        return Judged("empty_choices", [], None, None)
    finish = getattr(choices[0], "finish_reason", None)
    message = _dump(getattr(choices[0], "message", None)) or {}
    if finish in ("length", "content_filter"):
        return Judged(finish, [], message, finish)
    content = message.get("content") or ""
    if strip_think:
        content = _THINK.sub("", content)
        if "<think>" in content:
            return Judged("unclosed_think", [], message, finish)
        content = content.rpartition("</think>")[2]  # a template that opened the thought itself
        content = content.strip()
    calls = message.get("tool_calls") or ([message["function_call"]] if message.get("function_call") else [])
    if not calls and not content.strip():
        return Judged("empty_content", [], message, finish)
    try:
        conv, _ = to_conversation({"messages": [{"role": "assistant", "content": content, "tool_calls": calls}]},
                                  "messages")
    except FormatError as e:  # arguments that are not a JSON object, or a broken call in the text
        return Judged("bad_tool_arguments", [], message, finish, str(e))
    return Judged("", [m.to_dict() for m in conv.messages], message, finish)


def retry_after(headers: Any) -> float | None:
    """Seconds a response asks to wait: ``retry-after-ms``, or ``Retry-After`` as seconds or an HTTP date."""
    if headers is None:
        return None
    try:
        if headers.get("retry-after-ms"):
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        value = headers.get("retry-after")
        if not value:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def classify(exc: Exception, openai: Any) -> tuple[str, bool, float | None]:
    """``(reason, retryable, retry_after_s)`` of a failed request.

    Raises:
        TeacherError: HTTP 401/403/404 (:data:`FATAL_STATUS`).
    """
    if isinstance(exc, openai.APITimeoutError):
        return "timeout", True, None
    if isinstance(exc, openai.APIConnectionError):
        return "connection_error", True, None
    if isinstance(exc, openai.APIStatusError):
        status, wait = exc.status_code, retry_after(exc.response.headers)
        if status in FATAL_STATUS:
            raise TeacherError(f"the teacher answered HTTP {status} ({FATAL_STATUS[status]})")
        if status == 429:
            return "rate_limited", True, wait
        if status >= 500 or status in (408, 409):
            return "server_error", True, wait
        return "bad_request", False, None
    return "bad_response", True, None  # a 200 whose body is not a chat completion


def backoff(cfg: TeacherGenConfig, attempt: int, server_wait: float | None, rng: random.Random) -> float:
    """Seconds before retry ``attempt`` (0-based): the server's wait when it gave one, else jittered doubling."""
    if server_wait is not None:
        return min(server_wait, cfg.retry_after_max_s)
    return min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** attempt) * rng.uniform(0.5, 1.0)


# ----------------------------------------------------------------------------- the run
async def _ask(client: Any, openai: Any, cfg: DistillConfig, prompt: Prompt, store: AnswerStore,
               rng: random.Random) -> None:
    """Ask for one prompt's answer, retrying as configured, and store the outcome."""
    t = cfg.teacher
    request: dict[str, Any] = {"model": cfg.model, "messages": request_messages(prompt, t.system_prompt),
                               "temperature": t.temperature, "top_p": t.top_p, "max_tokens": t.max_tokens}
    if prompt.conversation.tools:
        request["tools"] = openai_tools(prompt.conversation)
    for attempt in range(t.retries + 1):
        store.stats.requests += 1
        try:
            response = await client.chat.completions.create(**request)
        except (openai.APIError, ValueError) as e:  # ValueError: a 200 whose body is not JSON
            reason, retryable, wait = classify(e, openai)
            if not retryable or attempt == t.retries:
                store.reject(prompt.id, reason, final=not retryable, detail=str(e))
                return
            store.stats.retry(reason)
            await asyncio.sleep(backoff(t, attempt, wait, rng))
            continue
        usage = _dump(getattr(response, "usage", None)) or {}
        judged = judge(response, t.strip_think)
        if judged.reason:
            store.reject(prompt.id, judged.reason, final=True, detail=judged.detail, message=judged.message,
                         finish_reason=judged.finish_reason, usage=usage)
        else:
            store.keep(prompt.id, judged.answer, finish_reason=judged.finish_reason, usage=usage,
                       model=getattr(response, "model", None) or cfg.model)
        return


async def _distill(cfg: DistillConfig, todo: list[Prompt], store: AnswerStore, key: str, show_progress: bool,
                   openai: Any) -> None:
    from tqdm.auto import tqdm
    t = cfg.teacher
    timeout = openai.Timeout(t.request_timeout_s, connect=t.connect_timeout_s)
    rng = random.Random(0)
    pending = iter(todo)
    with tqdm(total=len(todo), desc="distill", unit="prompt", disable=not show_progress) as bar:
        async def worker() -> None:
            for prompt in pending:  # one shared iterator: each prompt is taken by one worker
                await _ask(client, openai, cfg, prompt, store, rng)
                bar.update()
                bar.set_postfix(store.stats.postfix(), refresh=False)

        async with openai.AsyncOpenAI(base_url=cfg.base_url, api_key=key, max_retries=0, timeout=timeout) as client:
            try:
                async with asyncio.TaskGroup() as group:
                    for _ in range(min(t.concurrency, len(todo))):
                        group.create_task(worker())
            except ExceptionGroup as eg:  # the first error (a TeacherError) stopped the others
                raise eg.exceptions[0] from None


def run_distill(cfg: DistillConfig, *, show_progress: bool = True, say: Any = print) -> dict[str, Any]:
    """Answer every prompt of ``cfg`` not yet done in ``cfg.out``; returns the summary.

    Raises:
        ConfigError: bad prompts, no API key for a remote teacher, a directory in use by another run or
            made with another teacher setting, or the ``openai`` package missing.
        TeacherError: the teacher refused the key, the model or the URL.
        KeyboardInterrupt: Ctrl-C (SIGINT), once the requests in flight are cancelled and the summary is
            written with ``this_run.interrupted`` true.
    """
    cfg.check_required()
    openai = _openai()
    key = api_key(cfg.api_key_env)
    if key is None:
        if not is_loopback_url(cfg.base_url):
            raise ConfigError(f"no API key: set ${cfg.api_key_env} in the environment or in ./.env "
                              f"(--api-key-env names another variable)")
        say(f"no ${cfg.api_key_env} in the environment or ./.env: asking {shown_url(cfg.base_url)} without a key")
    prompts = load_prompts(cfg)
    teacher = {"model": cfg.model, **cfg.teacher.generation()}
    settings = {"base_url": shown_url(cfg.base_url), **to_dict(cfg.teacher)}
    store = AnswerStore(Path(cfg.out), [p.id for p in prompts], teacher, settings, secret=key)
    with store:
        todo = [p for p in prompts if not store.done(p.id)]
        store.stats.skipped = len(prompts) - len(todo)
        say(f"distill: {len(prompts)} prompts, {store.stats.skipped} already done, asking {len(todo)} of "
            f"{cfg.model} at {shown_url(cfg.base_url)} ({cfg.teacher.concurrency} at a time)")
        if todo and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            say(f"Ctrl-C is ignored here: this process was started with SIGINT ignored (a script's background "
                f"job); stop it with kill -TERM {os.getpid()} (what was written is kept; a rerun continues)")
        try:
            if todo:
                asyncio.run(_distill(cfg, todo, store, key or "none", show_progress, openai))
        except KeyboardInterrupt:
            store.stats.interrupted = True
            say(f"interrupted: answers so far are kept in {cfg.out}; run the same command again to continue")
            raise
        finally:
            summary = store.write_summary()
    return summary


# ----------------------------------------------------------------------------- the command
def add_cli(sub: Any) -> None:
    """Register ``codechat distill``."""
    p = sub.add_parser("distill", help="build SFT data from a teacher's answers (an OpenAI-compatible API)",
                       description="Ask a teacher model behind an OpenAI-compatible API to answer every prompt of "
                                   "--prompts (any SFT data: each record's conversation up to its last user turn) "
                                   "and write OUT/completions.jsonl (kept answers), OUT/rejected.jsonl (rejected, "
                                   "with reasons) and OUT/summary.json. Rerun the same command to continue after a "
                                   "crash or Ctrl-C. The key comes from $OPENAI_API_KEY (or --api-key-env) or "
                                   "./.env, never from a flag. Train on the answers with `codechat sft --data SPEC "
                                   "--teacher-completions OUT/completions.jsonl`. Overrides: --teacher.* "
                                   "(codechat.data.teacher.TeacherGenConfig). Exit status 0: every prompt kept or "
                                   "rejected; 1: some still failed after the retries (a rerun asks them again); 2: "
                                   "an error; 130: interrupted.")
    p.add_argument("--prompts", metavar="SPEC", help="SFT sources SOURCE[@SPLIT][#FORMAT],... (files, dirs, hf:...)")
    p.add_argument("--base-url", metavar="URL", help="API root of the teacher, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", metavar="NAME", help="the teacher model's name")
    p.add_argument("--out", metavar="DIR", help="output directory (a rerun continues it)")
    p.add_argument("--config", metavar="FILE", help="YAML file of settings (a DistillConfig: prompts, ..., teacher)")
    p.add_argument("--api-key-env", metavar="VAR", help="variable holding the API key (default OPENAI_API_KEY)")
    p.add_argument("--concurrency", type=int, metavar="N", help="requests in flight (teacher.concurrency, default 16)")
    p.add_argument("--temperature", type=float, metavar="T", help="teacher.temperature (default 1.0)")
    p.add_argument("--max-tokens", type=int, metavar="N", help="teacher.max_tokens (default 16384)")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N prompts")
    p.add_argument("--skip-bad", action="store_true", help="skip records that fit no format or have no user turn")
    p.set_defaults(func=_cmd_distill, accepts_overrides=True)


def _cmd_distill(args: argparse.Namespace, overrides: dict[str, str]) -> int:
    from codechat.config.stages import load
    flags = {"prompts": args.prompts, "base_url": args.base_url, "model": args.model, "out": args.out,
             "api_key_env": args.api_key_env, "limit": args.limit, "skip_bad": args.skip_bad or None,
             "teacher.concurrency": args.concurrency, "teacher.temperature": args.temperature,
             "teacher.max_tokens": args.max_tokens}
    cfg = load(DistillConfig, args.config, {**{k: v for k, v in flags.items() if v is not None}, **overrides})
    try:
        s = run_distill(cfg)
    except TeacherError as e:
        raise ConfigError(f"{e}; check --base-url, --model and ${cfg.api_key_env}") from None
    def counted(what: str) -> str:  # "3 rejected {'length': 2, ...}", or "0 rejected"
        return f"{sum(s[what].values())} {what}" + (f" {s[what]}" if s[what] else "")
    print(f"done: {s['kept']} kept, {counted('rejected')}, {counted('failed')} of {s['prompts']} prompts; "
          f"{s['tokens']['completion']} completion tokens; {Path(cfg.out) / 'completions.jsonl'}")
    return 0 if not s["failed"] else 1


__all__ = ["TeacherGenConfig", "DistillConfig", "TeacherError", "REJECT_REASONS", "RETRY_REASONS", "api_key",
           "load_prompts", "request_messages", "judge", "retry_after", "classify", "backoff", "run_distill", "add_cli"]
