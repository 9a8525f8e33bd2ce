"""A conversation that outgrows the context drops its oldest turns (system kept) and goes on."""
from __future__ import annotations

import io

import torch

from codechat.chat.budget import render_for_completion_within
from codechat.chat.conversation import ROLE_TOKENS, Conversation, Message, render_for_completion
from codechat.chat.repl import repl, reply
from codechat.config.stages import ModelConfig
from codechat.engine import Engine, EngineConfig, SamplingConfig
from codechat.model import build_model


def long_conversation(n: int) -> Conversation:
    msgs = [Message("system", "You are terse.")]
    for i in range(n):
        msgs += [Message("user", f"question {i}: " + "word " * 20), Message("assistant", f"answer {i}")]
    return Conversation(tuple(msgs + [Message("user", "the newest question")]))


def test_a_long_conversation_keeps_the_system_turn_and_the_newest_turns(tok):
    conv = long_conversation(8)
    full = render_for_completion(tok, conv)
    ids, counts = render_for_completion_within(tok, conv, 120)
    assert len(full) > 120 >= len(ids) and counts.turns_dropped > 0
    assert ids[0] == tok.bos_id and ids[1] == tok.special_id(ROLE_TOKENS["system"])
    assert ids[-1] == tok.special_id(ROLE_TOKENS["assistant"])
    assert tok.decode(ids).endswith(tok.decode(full[-40:]))  # the newest turns are whole
    assert "You are terse." in tok.decode(ids) and "question 0" not in tok.decode(ids)
    same, none = render_for_completion_within(tok, conv, len(full))
    assert same == full and none.turns_dropped == 0


def test_chat_goes_on_past_the_context_and_says_so(tok):
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, n_layer=1, n_embd=32, n_head=2, n_kv_head=1,
                                    max_seq_len=96)).eval()
    engine = Engine(model, EngineConfig(slots=1))
    cfg = SamplingConfig(max_new_tokens=40, temperature=0.0)
    notices = []
    answer = reply(engine, tok, long_conversation(8), cfg, on_notice=notices.append)
    assert answer.role == "assistant" and len(notices) == 1 and "oldest turn" in notices[0]
    out = io.StringIO()
    repl(engine, tok, cfg, system="Be brief.", stdin=io.StringIO(("tell me more " * 15 + "\n") * 6), stdout=out)
    assert "outgrew the context" in out.getvalue() and "starting a new conversation" not in out.getvalue()
