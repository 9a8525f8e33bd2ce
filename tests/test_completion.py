"""Code completion: where a completion ends, mean log-prob scoring, and the best of n samples."""
from __future__ import annotations

import pytest
import torch

from codechat.config.stages import ModelConfig
from codechat.engine import Engine, EngineConfig, SamplingConfig
from codechat.engine.completion import Completion, best_completion, end_of_block, mean_logprob, sample_completions
from codechat.model import build_model
from codechat.speedrun.report import parses_after_dropping_last_line


def test_completions_end_with_the_function_the_prompt_is_in():
    method = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    body = "        self.items.append(item)\n\n"
    assert end_of_block(method, body + "    def pop(self):\n        return 1\n") == body
    loop = "def count_words(text):\n    counts = {}\n    for word in text.split():\n"
    rest = "        counts[word] = 1\n    return counts\n\n"
    assert end_of_block(loop, rest + "print(count_words('a'))\n") == rest  # a dedent inside the function is kept
    assert end_of_block("import os\n\n\ndef main():\n", "x = 1\n") == ""  # leaves at once: nothing
    assert end_of_block("def f():\n", "    return 1") == "    return 1"  # still inside: all of it
    assert parses_after_dropping_last_line(method + body) and not parses_after_dropping_last_line(method)


def test_mean_logprob_is_the_average_log_softmax_of_the_completion_tokens():
    torch.manual_seed(0)
    m = build_model(ModelConfig(vocab_size=97, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, max_seq_len=64,
                                init_std=0.1)).eval()
    prompt, comp = [5, 6, 7], [8, 9, 10, 11]
    with torch.no_grad():
        logp = m(torch.tensor([prompt + comp]))[0].log_softmax(-1)
    want = sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(comp)) / len(comp)
    m = Engine(m, EngineConfig(slots=1))
    assert mean_logprob(m, prompt, comp) == pytest.approx(want, abs=1e-5)
    assert mean_logprob(m, prompt, comp) != pytest.approx(mean_logprob(m, prompt, comp[::-1]), abs=1e-4)
    with pytest.raises(ValueError, match="non-empty"):
        mean_logprob(m, prompt, [])


def test_best_completion_prefers_a_finished_sample_over_a_likelier_cut_off_loop():
    loop = Completion("    return x\n" * 40, finished=False, mean_logprob=-0.1)
    done = Completion("    return 1\n", finished=True, mean_logprob=-1.5)
    likelier_done = Completion("    return 0\n", finished=True, mean_logprob=-0.9)
    assert best_completion([loop, done]) is done
    assert best_completion([done, loop, likelier_done]) is likelier_done
    assert best_completion([loop, Completion("    x", False, -2.0)]) is loop  # none finished: likeliest
    with pytest.raises(ValueError):
        best_completion([])


def test_sample_completions_finish_when_the_function_ends_and_not_when_the_budget_cuts(tok):
    torch.manual_seed(0)
    m = build_model(ModelConfig(vocab_size=tok.vocab_size, n_layer=2, n_embd=32, n_head=2, n_kv_head=2,
                                max_seq_len=96))
    doc = "def f(x):\n    y = x + 1\n    return y\n\n\ndef g(a):\n    return a\n"
    ids = torch.tensor([[tok.end_id] + tok.encode(doc) + [tok.end_id]])
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(150):  # memorise one document
        opt.zero_grad()
        m(ids[:, :-1], ids[:, 1:]).backward()
        opt.step()
    m = Engine(m.eval(), EngineConfig(slots=3))
    prompt = "def f(x):\n"
    cfg = SamplingConfig(max_new_tokens=40, temperature=0.3, top_p=1.0)
    got = sample_completions(m, tok, prompt, cfg, n=3, seed=3)
    assert got == sample_completions(m, tok, prompt, cfg, n=3, seed=3)
    assert [c.text for c in got] == ["    y = x + 1\n    return y\n\n\n"] * 3 and all(c.finished for c in got)
    prompt_ids = [tok.end_id] + tok.encode(prompt)
    assert got[0].mean_logprob == pytest.approx(mean_logprob(m, prompt_ids, tok.encode(got[0].text)), abs=1e-5)
    assert got[0].mean_logprob > -0.5  # memorised: likely
    cut = sample_completions(m, tok, prompt, SamplingConfig(max_new_tokens=3, temperature=0.3), n=2, seed=3)
    assert all(not c.finished and c.text and "    y = x + 1\n".startswith(c.text) for c in cut)
    early = sample_completions(m, tok, "def g(a):\n    return a\n", cfg, n=1)[0]
    assert early == Completion("", False, early.mean_logprob)  # ends at once: wrote nothing, not finished
    with pytest.raises(ValueError, match="at least one sample"):
        sample_completions(m, tok, prompt, cfg, n=0)
