"""``codechat chat``: a multi-turn conversation with a model in the terminal, streamed token by token."""
from __future__ import annotations

import sys
from typing import Callable, TextIO

from .chat import Conversation, Message, parse_assistant, render_for_completion
from .engine import SamplingConfig, generate
from .model import GPT
from .tokenizer import Tokenizer

COMMANDS_HELP = "commands: /reset starts over, /quit (or Ctrl-D) leaves"


def reply(model: GPT, tok: Tokenizer, conv: Conversation, cfg: SamplingConfig, *, seed: int | None = None,
          on_text: Callable[[str], None] = lambda s: None) -> Message:
    """Generate the assistant's next message for ``conv``, streaming its text to ``on_text``.

    Generation stops at ``<|end|>`` or after ``cfg.max_new_tokens``; the reply is parsed into
    content and (optional) function call with :func:`codechat.chat.parse_assistant`.

    Raises:
        ValueError: the prompt does not fit the model's context.
    """
    prompt = render_for_completion(tok, conv)
    ids: list[int] = []
    stream = tok.stream(skip_special=True)
    for step in generate(model, prompt, cfg, stop_ids=[tok.end_id], seed=seed):
        t = int(step[0])
        ids.append(t)
        if t == tok.end_id:
            break
        on_text(stream.push(t))
    on_text(stream.flush())
    content, call = parse_assistant(tok, ids)
    return Message("assistant", content, call)


def repl(model: GPT, tok: Tokenizer, cfg: SamplingConfig, *, system: str = "", stdin: TextIO = sys.stdin,
         stdout: TextIO = sys.stdout, seed: int | None = None) -> None:
    """Read user turns from ``stdin`` until EOF or ``/quit``, answering each with streamed output."""
    def start() -> list[Message]:
        return [Message("system", system)] if system else []

    messages = start()
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
        try:
            answer = reply(model, tok, Conversation(messages), cfg, seed=seed, on_text=emit)
        except ValueError as e:  # the conversation outgrew the context: say so and start over
            stdout.write(f"\n[{e}; starting a new conversation]\n")
            messages = start()
            continue
        if answer.function_call is not None:
            stdout.write(f"\n[function call: {answer.function_call}]")
        stdout.write("\n")
        messages.append(answer)
