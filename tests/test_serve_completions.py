"""``POST /v1/completions`` as a client sees it: a real uvicorn server on 127.0.0.1 (a thread of this
process) over a tiny random model, driven by the official ``openai`` client and by plain HTTP. Every
answer is checked against a reference computed here: the engine alone for the texts, the model's
own logits (one teacher-forced forward pass, ``log_softmax``) for every log-probability — the
prompt's (lm-evaluation-harness's log-likelihood request) and the generated tokens' top-k — and
for ``logit_bias``; a stream joined equals the whole answer; each refused field is a 400 naming it.
The model's special ids have logit 0, below the best of ~2000 random ones: greedy rows never stop
on their own, so texts run to ``max_tokens``."""
from __future__ import annotations


import openai
import pytest
import torch
from conftest import http, serve_in_thread

from codechat.config.stages import ModelConfig
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.engine import scoring
from codechat.model import build_model
from codechat.serve.completions import token_text

PROMPT = "def add(a, b):\n    return"
OTHER = "import os\nclass Path:"


@pytest.fixture(scope="module")
def model(tok):
    torch.manual_seed(0)
    m = build_model(ModelConfig(vocab_size=tok.vocab_size, n_layer=2, n_embd=64, n_head=2, n_kv_head=1,
                                max_seq_len=256, init_std=0.1))
    with torch.no_grad():
        m.lm_head.weight[sorted(tok.special_ids)] = 0.0
    return m.eval()


@pytest.fixture(scope="module")
def server(model, tok):
    """The served URL: 4 slots and 16 waiting rows."""
    with serve_in_thread(model, tok, slots=4, queue_size=16) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(api_key="none", base_url=server + "/v1", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def local(model):
    """The engine alone, in this test's thread: what the texts must be."""
    return Engine(model, EngineConfig(slots=4))


def ids_of(tok, text: str) -> list[int]:
    return [tok.end_id] + tok.encode(text)  # what the server continues: a document after <|end|>


def log_softmax(model, ids: list[int], bias: dict[int, float] | None = None) -> torch.Tensor:
    """(len(ids), V) log-probabilities of the token after each position (the model's own forward pass)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0].float()
    for i, b in (bias or {}).items():
        logits[:, i] += b
    return logits.log_softmax(-1)


def alone(local, tok, ids, sampling, samples, seed=0):
    """The engine's samples of ``ids``, stopping at any special id as the server does."""
    [out] = local.generate([Request(ids, sampling, samples=samples, seed=seed, stop_ids=sorted(tok.special_ids))])
    return out


def text_of(tok, sample) -> str:
    return tok.decode(sample.token_ids, skip_special=True)


def test_a_text_prompt_continues_after_end_as_the_engine_alone(client, tok, local):
    r = client.completions.create(model="codechat", prompt=PROMPT, max_tokens=10, temperature=0)
    [s] = alone(local, tok, ids_of(tok, PROMPT), SamplingConfig(10, 0.0, 0, 1.0), [0])
    [c] = r.choices
    assert c.text == text_of(tok, s) and len(c.text) > 5 and c.finish_reason == "length" and c.logprobs is None
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == "codechat"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids_of(tok, PROMPT)), 10)
    assert client.completions.create(model="codechat", prompt=PROMPT, temperature=0).usage.completion_tokens == 16


def _joined(chunks):
    """``{index: (text, finish, tokens, token_logprobs, top_logprobs, text_offset)}`` of a stream's chunks."""
    out: dict[int, list] = {}
    for ch in chunks:
        for c in ch.choices:
            o = out.setdefault(c.index, ["", None, [], [], [], []])
            o[0] += c.text
            o[1] = c.finish_reason or o[1]
            if c.logprobs is not None:
                for k, key in enumerate(("tokens", "token_logprobs", "top_logprobs", "text_offset")):
                    o[2 + k] += getattr(c.logprobs, key)
    return {i: tuple(o) for i, o in out.items()}


def _whole(r):
    return {c.index: (c.text, c.finish_reason, c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.top_logprobs,
                      c.logprobs.text_offset) for c in r.choices}


def test_n_prompts_stop_logprobs_and_echo_streamed_or_not_are_the_engines_samples(client, tok, local):
    ask = dict(model="codechat", prompt=[PROMPT, OTHER], n=2, seed=7, temperature=0.9, top_p=1.0, max_tokens=12,
               logprobs=2, echo=True)
    free = client.completions.create(**ask)
    assert [c.index for c in free.choices] == [0, 1, 2, 3]  # prompt-major: choice p * n + i
    gens = {}
    for p, text in enumerate((PROMPT, OTHER)):
        samples = alone(local, tok, ids_of(tok, text), SamplingConfig(12, 0.9, 0, 1.0), [2 * p, 2 * p + 1], seed=7)
        for i, s in zip((2 * p, 2 * p + 1), samples):
            c = free.choices[i]
            gens[i] = text_of(tok, s)
            assert c.text == text + gens[i] and c.finish_reason == s.finish  # echo: the prompt first
            assert len(c.logprobs.tokens) == len(ids_of(tok, text)) + len(s.token_ids)
    assert len(set(gens.values())) == 4  # each choice drew its own noise
    stop = gens[0][len(gens[0]) // 2:][:2]  # met in choice 0 at least
    stopped = client.completions.create(**ask, stop=[stop])
    for c, prompt in zip(stopped.choices, (PROMPT, PROMPT, OTHER, OTHER)):
        g = gens[c.index]
        assert c.text == prompt + (g[:g.find(stop)] if stop in g else g)
        assert c.finish_reason == ("stop" if stop in g else free.choices[c.index].finish_reason)
    chunks = list(client.completions.create(**ask, stop=[stop], stream=True, stream_options={"include_usage": True}))
    assert _joined(chunks) == _whole(stopped)
    assert chunks[-1].choices == [] and chunks[-1].usage == stopped.usage
    assert len([ch for ch in chunks if ch.choices]) > 8  # pieces, not one chunk per choice


def _check_prompt_logprobs(c, tok, model, ids: list[int]) -> list[float]:
    """``c`` (an ``echo``, ``logprobs: 1`` choice) against the reference of ``ids``; its token log-probs."""
    ref = log_softmax(model, ids)
    lp = c.logprobs
    assert lp.tokens[:len(ids)] == [token_text(tok, t) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = [float(ref[j - 1, ids[j]]) for j in range(1, len(ids))]
    assert lp.token_logprobs[1:len(ids)] == pytest.approx(want, abs=1e-3)
    for j in range(1, len(ids)):
        best = int(ref[j - 1].argmax())
        top = lp.top_logprobs[j]
        assert max(top, key=top.get) == token_text(tok, best)
        assert max(top.values()) == pytest.approx(float(ref[j - 1, best]), abs=1e-3)
        assert len(top) == (1 if ids[j] == best else 2)  # the top one, and the prompt's own token
        # lm-eval's is_greedy, token_logprob == max(top_logprobs), holds exactly for the greedy tokens only
        assert (lp.token_logprobs[j] == max(top.values())) == (ids[j] == best)
    return lp.token_logprobs[:len(ids)]


def test_lm_eval_loglikelihood_request_gives_every_prompt_tokens_own_logprob(client, tok, local, model):
    context = ids_of(tok, PROMPT)
    [greedy] = alone(local, tok, context, SamplingConfig(5, 0.0, 0, 1.0), [0])
    ids = context + greedy.token_ids + tok.encode(" x = 1")  # greedy tokens among the others
    text = PROMPT + " x = 1"
    for prompt, used in ((ids, ids), (text, ids_of(tok, text))):  # token ids as given; text after <|end|>
        r = client.completions.create(model="codechat", prompt=prompt, echo=True, logprobs=1, max_tokens=0)
        [c] = r.choices
        assert c.text == tok.decode(used, skip_special=True) and c.finish_reason == "length"
        assert len(c.logprobs.tokens) == len(used) and r.usage.completion_tokens == 0
        assert r.usage.prompt_tokens == len(used)
        _check_prompt_logprobs(c, tok, model, used)
        assert c.logprobs.text_offset[0] == c.logprobs.text_offset[1] == 0
    # what lm-evaluation-harness sends today: a batch of token-id prompts, max_tokens 1, logprobs 1; it
    # reads token_logprobs[ctxlen:-1], so the one generated token must be the last entry
    one = client.completions.create(model="codechat", prompt=[ids, ids[:8]], echo=True, logprobs=1, max_tokens=1,
                                    temperature=0)
    for c, used in zip(one.choices, (ids, ids[:8])):
        assert len(c.logprobs.token_logprobs) == len(used) + 1 and c.finish_reason == "length"
        _check_prompt_logprobs(c, tok, model, used)


def test_generated_tokens_logprobs_and_top3_are_the_teacher_forced_reference(client, tok, model):
    r = client.completions.create(model="codechat", prompt=OTHER, max_tokens=12, temperature=1.0, top_p=1.0, seed=3,
                                  logprobs=3)
    lp = r.choices[0].logprobs
    by_text = {token_text(tok, t): t for t in range(tok.vocab_size)}
    gen = [by_text[t] for t in lp.tokens]
    prompt = ids_of(tok, OTHER)
    ref = log_softmax(model, prompt + gen)[len(prompt) - 1:-1]
    assert lp.token_logprobs == pytest.approx([float(ref[i, t]) for i, t in enumerate(gen)], abs=1e-3)
    outside = 0
    for i, t in enumerate(gen):
        best = ref[i].topk(3)
        want = {token_text(tok, int(b)): float(v) for v, b in zip(best.values, best.indices)}
        want.setdefault(token_text(tok, t), float(ref[i, t]))  # the chosen token too: up to logprobs + 1
        outside += len(want) == 4
        assert lp.top_logprobs[i] == pytest.approx(want, abs=1e-3)
        assert lp.top_logprobs[i][lp.tokens[i]] == lp.token_logprobs[i]  # one number, not two roundings of it
    assert outside > 0  # sampled tokens outside the top 3 were checked too
    decoder, offsets, at = tok.stream(skip_special=True), [], 0
    for t in gen:
        offsets.append(at)
        at += len(decoder.push(t))
    assert lp.text_offset == offsets and r.choices[0].text == tok.decode(gen, skip_special=True)


def test_logit_bias_moves_the_greedy_choice_as_the_reference_says(client, tok, model):
    prompt = ids_of(tok, PROMPT)
    plain = client.completions.create(model="codechat", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=0)
    forced = tok.encode(" yes")[0]
    r = client.completions.create(model="codechat", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=0,
                                  logit_bias={str(forced): 100})
    assert r.choices[0].text == token_text(tok, forced) * 6 != plain.choices[0].text
    ref = log_softmax(model, prompt + [forced] * 6, {forced: 100.0})[len(prompt) - 1:-1]
    assert r.choices[0].logprobs.token_logprobs == pytest.approx(ref[:, forced].tolist(), abs=1e-3)
    ref = log_softmax(model, prompt, {})[-1]
    first = int(ref.argmax())
    assert plain.choices[0].logprobs.tokens[0] == token_text(tok, first)
    banned = client.completions.create(model="codechat", prompt=PROMPT, max_tokens=1, temperature=0,
                                       logit_bias={str(first): -100})
    ref[first] -= 100.0
    assert banned.choices[0].text == token_text(tok, int(ref.argmax())) and int(ref.argmax()) != first


def _ok(**kw):
    return {"model": "codechat", "prompt": "x = ", **kw}


@pytest.mark.parametrize("body, param, code", [
    (_ok(max_tokens=0), "max_tokens", "invalid_value"),
    (_ok(suffix="\nreturn x"), "suffix", "unsupported_parameter"),
    (_ok(logit_bias={"999999": 5}), "logit_bias.999999", "invalid_value"),
    (_ok(logit_bias={"abc": 5}), "logit_bias.abc", "invalid_value"),
    (_ok(logit_bias={"\u00b2": 5}), "logit_bias.\u00b2", "invalid_value"),  # a digit to str.isdigit, not to int()
    (_ok(logit_bias={"5": 101}), "logit_bias.5", "invalid_value"),
    (_ok(logprobs=21), "logprobs", "invalid_value"),
    (_ok(logprobs=True), "logprobs", "invalid_value"),
    (_ok(n=2, best_of=3), "best_of", "unsupported_parameter"),
    (_ok(prompt=[]), "prompt", "invalid_value"),
    (_ok(prompt=[[1, 2], []]), "prompt", "invalid_value"),
    (_ok(prompt=[1, 10**6]), "prompt", "invalid_value"),
    (_ok(prompt=[1, "a"]), "prompt", "invalid_value"),
    (_ok(prompt=[5] * 250, max_tokens=7), "prompt", "context_length_exceeded"),
    (_ok(prompt=[5] * 257, echo=True, max_tokens=0), "prompt", "context_length_exceeded"),
    (_ok(presence_penalty=3), "presence_penalty", "invalid_value"),
    (_ok(stream_options={"include_usage": True}), "stream_options", "invalid_value"),
    (_ok(n=17), "n", "invalid_value"),
    (_ok(prompt=["a"] * 7, n=3), "n", "invalid_value"),  # 21 rows: more than the server's 4 slots + 16 waiting
], ids=lambda v: str(v)[:40] if isinstance(v, dict) else None)
def test_each_refused_field_is_a_400_naming_it(server, body, param, code):
    status, _, out = http("POST", server + "/v1/completions", body)
    assert status == 400, out
    assert (out["error"]["param"], out["error"]["code"]) == (param, code)


def test_prompt_logprobs_over_several_logit_chunks_equal_one_forward_pass(model, tok, local, monkeypatch):
    ids = ids_of(tok, PROMPT + OTHER)
    monkeypatch.setattr(scoring, "LOGITS_CHUNK", 3)  # positions 1..n-1 in chunks of 3, the last one short
    got = scoring.prompt_logprobs(local, ids, 4)
    ref = log_softmax(model, ids)
    assert got.logprobs == pytest.approx([float(ref[j - 1, ids[j]]) for j in range(1, len(ids))], abs=1e-4)
    assert [[i for i, _ in t] for t in got.top] == ref[:-1].topk(4).indices.tolist()
    assert scoring.prompt_logprobs(local, ids[:1], 4).logprobs == []
