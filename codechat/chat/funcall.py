"""``codechat funcall``: a conversation in which the model may call declared Python functions.

The loop (:func:`answer`): the system turn declares the tools (the one layout of
:func:`codechat.chat.conversation.system_text`, the same as in SFT and evaluation) -> user -> model. When the
model's reply is a function call, :class:`codechat.tools.Dispatcher` validates it against the
declared schema and runs it in a worker process; its result — or the error, when the name is
undeclared, the arguments invalid, the call unparseable, the executor raised, timed out or
printed too much — goes back to the model as a ``function_response`` turn, and the model goes on,
until it answers in text or ``max_tool_calls`` calls were made. Model output never crashes the
loop, and nothing undeclared runs.

Tools come from ``--executors FILE`` (each public function defined in the file, or its
``EXECUTORS`` dict; schemas from type hints and docstrings: :func:`codechat.tools.load_executors`)
and ``--tools python,calculator`` (:func:`codechat.tools.builtins.builtin_tools`).

Strict calls (``--strict``, ``--tool-choice``; :func:`tool_constraints`): the replies are generated
under :func:`codechat.chat.strict.tool_grammar`, so a call always parses, names a declared tool and
has arguments valid under its schema. ``--tool-choice required`` or a tool's name forces the first
reply to each user turn to be such a call; the replies after a function response are ``auto`` (strict
with ``--strict``), so the model can answer with what the call returned. ``--tool-choice none``
declares no tool: the model is not told of them and nothing runs.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence, TextIO

from codechat.chat.calls import TOOL_CHOICES
from codechat.chat.conversation import Conversation, Message, reply_message
from codechat.tools import Tool

if TYPE_CHECKING:  # the engine imports torch: this module does not, so `codechat funcall` checks its tools first
    from codechat.engine import Engine, SamplingConfig
    from codechat.engine.grammar import Grammar
    from codechat.tokenizer import Tokenizer



@dataclass(frozen=True)
class Step:
    """One turn added by :func:`answer`: the message, and for a function response whether the call
    succeeded."""

    message: Message
    ok: bool = True


@dataclass(frozen=True)
class Constraints:
    """The grammars of the replies to one user turn (None: free): ``first`` for the reply to the user,
    ``after_call`` for each reply after a function response."""

    first: Grammar | None = None
    after_call: Grammar | None = None


def check_tool_choice(choice: str, tools: Sequence[Tool]) -> None:
    """Raise ValueError unless ``choice`` is ``auto``, ``required``, ``none`` or the name of one of ``tools``
    (a check that needs no model, made before it loads)."""
    names = [t.name for t in tools]
    if choice not in TOOL_CHOICES and choice not in names:
        raise ValueError(f"--tool-choice {choice!r} is neither {', '.join(TOOL_CHOICES)} nor a declared tool "
                         f"({', '.join(names)})")


def tool_constraints(engine: Engine, tok: Tokenizer, tools: Sequence[Tool], choice: str = "auto",
                     strict: bool = False) -> Constraints:
    """The :class:`Constraints` of ``--tool-choice choice`` (module docstring); free replies (no grammar
    compiled, the grammar library not needed) for ``none`` and for ``auto`` without ``strict``.

    Raises:
        codechat.engine.grammar.GrammarError: ``choice`` names no tool, or a tool's parameters
            schema does not compile (its message names the path, ``$.tools[i].parameters...``, and
            the keyword).
        codechat.engine.grammar.GrammarUnavailable: a constraint is needed and llguidance is not installed.
    """
    if choice == "none" or (choice == "auto" and not strict):
        return Constraints()
    from codechat.chat.strict import tool_grammar
    from codechat.engine.grammar import GrammarCompiler
    gc = GrammarCompiler(tok, engine.vocab_size)
    schemas = [t.schema() for t in tools]
    return Constraints(tool_grammar(gc, schemas, choice, strict), tool_grammar(gc, schemas, "auto", strict))


def answer(engine: Engine, tok: Tokenizer, messages: list[Message], tools: Sequence[Tool], dispatcher,
           cfg: SamplingConfig, *, max_tool_calls: int = 4, seed: int = 0,
           on_text: Callable[[str], None] = lambda s: None, on_step: Callable[[Step], None] = lambda s: None,
           on_notice: Callable[[str], None] = lambda s: None, constraints: Constraints = Constraints()
           ) -> list[Message]:
    """Continue ``messages`` (ending with a user turn) until the model answers in text.

    Args:
        messages: the conversation so far (a system message first, if any); extended in place
            with every assistant turn and function response.
        tools: the declared tools; their schemas go into the system turn.
        dispatcher: a :class:`codechat.tools.Dispatcher` over the same tools.
        max_tool_calls: calls answered at most; a further call ends the loop with a notice.
        on_text: streamed reply text; ``on_step``: every added turn; ``on_notice``: what the loop
            did that the model did not say (dropped context, the call limit).
        constraints: the grammars of the first reply and of those after a function response
            (:func:`tool_constraints`).

    Returns:
        ``messages``.
    """
    from codechat.chat.repl import generate_reply
    schemas = tuple(t.schema() for t in tools) or None
    calls = 0
    while True:
        reply = generate_reply(engine, tok, Conversation(tuple(messages), schemas), cfg, seed=seed + len(messages),
                               on_text=on_text, on_notice=on_notice,
                               grammar=constraints.after_call if calls else constraints.first)
        wants_call = reply.call is not None or reply.error is not None
        msg = reply_message(reply) if reply.call is not None else Message("assistant", reply.content)
        messages.append(msg)
        on_step(Step(msg))
        if not wants_call:
            return messages
        if calls >= max_tool_calls:
            on_notice(f"[stopped: the model asked for a call after {max_tool_calls} tool calls]")
            return messages
        calls += 1
        result = dispatcher(reply.call) if reply.call is not None else dispatcher(None, error=str(reply.error))
        response = result.message()
        messages.append(response)
        on_step(Step(response, result.ok))


def load_tools(executors: str | None, builtins: str | None) -> list[Tool]:
    """The tools of ``--executors FILE`` and ``--tools NAMES``, in that order.

    Raises:
        codechat.tools.ToolError: a file that does not load or declares nothing usable, an unknown
            built-in, or two tools of one name (both sources named: ``file.py:function``,
            ``builtin``).
    """
    from codechat.tools import ToolError, load_executors, tools_by_name
    from codechat.tools.builtins import builtin_tools
    tools = list(load_executors(executors)) if executors else []
    tools += list(builtin_tools(builtins).values()) if builtins else []
    tools_by_name(tools)  # an executor named like a built-in: an error naming both sources
    if not tools:
        raise ToolError("no tools: give --executors FILE and/or --tools python,calculator")
    return tools


def run_session(engine: Engine, tok: Tokenizer, tools: Sequence[Tool], cfg: SamplingConfig, *, system: str = "",
                user: str | None = None, max_tool_calls: int = 4, show_trace: bool = False, seed: int = 0,
                tool_choice: str = "auto", strict: bool = False, stdin: TextIO = sys.stdin,
                stdout: TextIO = sys.stdout) -> list[Message]:
    """One answer to ``user``, or an interactive session reading user turns from ``stdin`` until
    EOF or ``/quit``. Replies stream to ``stdout``; with ``show_trace`` every call and function
    response is printed as it happens. ``tool_choice`` and ``strict``: :func:`tool_constraints`
    (``none`` declares no tool). Returns the whole conversation.

    Raises:
        codechat.tools.ToolError: the system turn with the tool schemas leaves no room for a
            conversation in the model's context.
        codechat.engine.grammar.GrammarError, GrammarUnavailable: see :func:`tool_constraints`.
        All are raised before the first turn.
    """
    from codechat.chat.conversation import render_turns
    from codechat.chat.repl import REPLY_SHARE
    from codechat.tools import ToolError
    from codechat.tools.dispatch import Dispatcher
    tools = () if tool_choice == "none" else tuple(tools)
    constraints = tool_constraints(engine, tok, tools, tool_choice, strict)
    schemas = tuple(t.schema() for t in tools)
    declared = len(render_turns(tok, Conversation((Message("system", system), Message("user", "?")), schemas))[0])
    room = int(engine.max_len * (1 - REPLY_SHARE)) - 16
    if declared > room:
        raise ToolError(f"the system turn with its {len(tools)} tool schema(s) takes {declared} tokens, more than the "
                        f"{room} a prompt may use of the model's context of {engine.max_len}: declare fewer tools, "
                        "shorten their docstrings or the system message")

    def write(s: str) -> None:
        stdout.write(s)
        stdout.flush()

    def trace(s: Step) -> None:  # with --show-trace: every turn, parsed (calls are not streamed as raw JSON)
        m = s.message
        if m.function_call is not None:
            write(f"\n[call] {m.function_call['name']}({_args(m.function_call['arguments'])})\n")
        elif m.role == "function_response":
            write(f"[{'response' if s.ok else 'error'}] {m.content[:2000]}\n")
        else:
            write(f"[assistant] {m.content}\n")

    messages: list[Message] = [Message("system", system)] if system else []
    pending = [user] if user is not None else None
    with Dispatcher(tools) as dispatcher:
        while True:
            if pending is not None:
                if not pending:
                    break
                text = pending.pop()
            else:
                write("\nyou> ")
                line = stdin.readline()
                if not line or line.strip() == "/quit":
                    break
                text = line.rstrip("\n")
                if not text.strip():
                    continue
                write("" if show_trace else "assistant> ")
            messages.append(Message("user", text))
            answer(engine, tok, messages, tools, dispatcher, cfg, max_tool_calls=max_tool_calls, seed=seed,
                   on_text=(lambda s: None) if show_trace else write, on_step=trace if show_trace else (lambda s: None),
                   on_notice=lambda s: write(s + "\n"), constraints=constraints)
            if not show_trace:
                write("\n")
    return messages


def _args(arguments: dict) -> str:
    import json
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
