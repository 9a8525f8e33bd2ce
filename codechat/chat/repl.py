"""``codechat chat``: a multi-turn conversation with a model in the terminal, streamed token by token."""
from __future__ import annotations

import sys
from dataclasses import replace
from typing import Callable, TextIO

from codechat.chat.budget import render_for_completion_within
from codechat.chat.calls import ParseError, Reply, parse_reply_ids
from codechat.chat.conversation import Conversation, Message, render_for_completion, reply_message
from codechat.engine import Engine, Request, SamplingConfig
from codechat.engine.grammar import Grammar
from codechat.tokenizer import Tokenizer

COMMANDS_HELP = "commands: /reset starts over, /quit (or Ctrl-D) leaves"


#: Share of the context kept for the reply: a prompt leaving less loses its oldest turns.
REPLY_SHARE = 0.25


def generate_reply(engine: Engine, tok: Tokenizer, conv: Conversation, cfg: SamplingConfig, *, seed: int = 0,
                   on_text: Callable[[str], None] = lambda s: None,
                   on_notice: Callable[[str], None] = lambda s: None, grammar: Grammar | None = None) -> Reply:
    """Generate the assistant's next turn for ``conv``, streaming its text to ``on_text``.

    Generation stops at ``<|end|>`` or after ``cfg.max_new_tokens``. A conversation too long for
    the context beside the reply — one leaving the reply less than ``cfg.max_new_tokens`` and less
    than :data:`REPLY_SHARE` of the context — drops its oldest turns (the system turn kept;
    :func:`codechat.chat.budget.render_for_completion_within`) and says so through ``on_notice``. The
    reply gets what room is left, up to ``cfg.max_new_tokens``. Returns the reply read by
    :func:`codechat.chat.calls.parse_reply_ids`: content, and a function call or why there is none.

    ``grammar`` (:func:`codechat.chat.strict.tool_grammar`): the reply follows it, token by token; it
    then ends when the grammar is complete (a call's JSON closed), with or without ``<|end|>``.
    A call cut by ``cfg.max_new_tokens`` has the error ``length`` (not ``bad_json``).

    Raises:
        RuntimeError: the grammar rejected a sampled token (an engine bug; never a reply).
    """
    new = min(cfg.max_new_tokens, max(1, int(engine.max_len * REPLY_SHARE)))
    prompt = render_for_completion(tok, conv)
    if len(prompt) + new > engine.max_len:
        prompt, counts = render_for_completion_within(tok, conv, engine.max_len - new)
        if counts.turns_dropped or counts.prompt_tokens_cut:
            on_notice(f"[the conversation outgrew the context of {engine.max_len} tokens: "
                      f"{counts.turns_dropped} oldest turn(s) and {counts.prompt_tokens_cut} tokens left out]")
    cfg = replace(cfg, max_new_tokens=min(cfg.max_new_tokens, engine.max_len - len(prompt)))
    ids: list[int] = []
    finish = None
    stream = tok.stream(skip_special=True)
    for ev in engine.stream(Request(prompt, cfg, seed=seed, stop_ids=[tok.end_id], grammar=grammar)):
        t, finish = ev.token, ev.finish
        if finish == "rejected":
            raise RuntimeError("the reply's grammar rejected a token sampled under its own mask: a bug in codechat's "
                               "constrained decoding (please report it)")
        ids.append(t)
        if t == tok.end_id:
            break
        on_text(stream.push(t))
    on_text(stream.flush())
    reply = parse_reply_ids(tok, ids)
    if finish == "length" and reply.error is not None:  # cut inside the call, not malformed
        reply = replace(reply, error=ParseError(
            "length", f"the reply reached its limit of {cfg.max_new_tokens} tokens inside the call",
            len(reply.text), reply.text))
    return reply


def reply(engine: Engine, tok: Tokenizer, conv: Conversation, cfg: SamplingConfig, *, seed: int = 0,
          on_text: Callable[[str], None] = lambda s: None,
          on_notice: Callable[[str], None] = lambda s: None) -> Message:
    """:func:`generate_reply` as the assistant :class:`~codechat.chat.conversation.Message` for the history."""
    return reply_message(generate_reply(engine, tok, conv, cfg, seed=seed, on_text=on_text, on_notice=on_notice))


def repl(engine: Engine, tok: Tokenizer, cfg: SamplingConfig, *, system: str = "", stdin: TextIO = sys.stdin,
         stdout: TextIO = sys.stdout, seed: int = 0) -> None:
    """Read user turns from ``stdin`` until EOF or ``/quit``, answering each with streamed output
    (turn ``i`` is sampled with seed ``seed + i``)."""
    def start() -> list[Message]:
        return [Message("system", system)] if system else []

    messages, turn = start(), 0
    interactive = stdin.isatty()
    if interactive:
        stdout.write(COMMANDS_HELP + "\n")
    while True:
        if interactive:
            stdout.write("\nyou> ")
            stdout.flush()
        line = stdin.readline()
        if not line or line.strip() == "/quit":
            return
        text = line.rstrip("\n")
        if text.strip() == "/reset":
            messages = start()
            continue
        if not text.strip():
            continue
        messages.append(Message("user", text))
        stdout.write("assistant> " if interactive else "")

        def emit(s: str) -> None:
            stdout.write(s)
            stdout.flush()
        answer = reply(engine, tok, Conversation(messages), cfg, seed=seed + turn, on_text=emit,
                       on_notice=lambda s: stdout.write(s + "\n"))
        turn += 1
        if answer.function_call is not None:
            stdout.write(f"\n[function call: {answer.function_call}]")
        stdout.write("\n")
        messages.append(answer)
