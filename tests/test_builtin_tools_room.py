"""The README's built-in tools fit the model the README's main command makes: ``codechat funcall
--tools python,calculator`` on the ``tiny`` preset (context 512) declares both tools and still leaves
room for the question, a call and its response (the speedrun's 4096-id tokenizer needs fewer tokens
than the suite's 2048-id one used here)."""
from __future__ import annotations

import io

import torch

from codechat.chat.conversation import Conversation, Message, render_turns
from codechat.chat.funcall import run_session
from codechat.chat.repl import REPLY_SHARE
from codechat.config.stages import preset
from codechat.engine import Engine, EngineConfig, SamplingConfig
from codechat.model import build_model
from codechat.tools.builtins import builtin_tools

#: Tokens the first exchange needs after the system turn: the question, a call, its response.
EXCHANGE = 60


def test_both_builtin_tools_leave_room_for_an_exchange_in_the_tiny_context(tok):
    cfg = preset("tiny", vocab_size=tok.vocab_size)
    room = int(cfg.max_seq_len * (1 - REPLY_SHARE)) - 16  # what run_session lets a prompt use
    schemas = tuple(t.schema() for t in builtin_tools("python,calculator").values())
    declared = len(render_turns(tok, Conversation((Message("system", ""), Message("user", "?")), schemas))[0])
    assert declared + EXCHANGE <= room, (declared, room)


def test_the_readme_funcall_example_runs_on_a_tiny_model(tok):
    torch.manual_seed(0)
    model = build_model(preset("tiny", vocab_size=tok.vocab_size)).eval()
    tools = list(builtin_tools("python,calculator").values())
    out = io.StringIO()
    conv = run_session(Engine(model, EngineConfig(slots=1)), tok, tools, SamplingConfig(8, 0.0),
                       user="What is 2+3*4?", stdout=out)
    assert [m.role for m in conv[:1]] == ["user"] and conv[0].content == "What is 2+3*4?"
    assert conv[-1].role == "assistant"
