"""The generation engine (``codechat/engine/``) against references computed without it.

Greedy generation equals the argmax of a plain ``GPT.forward`` over the growing sequence (no
cache), alone, in mixed-length batches and for requests that join a running batch; a seeded
sample is the same in a batch as alone; returned log-probs equal a teacher-forced forward under
the distribution actually sampled from; :func:`codechat.engine.sampling.sample` draws from the
right distribution (chi-square tests); stop ids, ``max_new_tokens``, the context limit,
cancellation, streaming and weight reloads behave as documented.

Everything runs on the CPU in fp32 with a random ``tiny`` model whose ``init_std`` (0.1) spreads
the logits enough that greedy paths vary and argmax margins stay far above float noise.
"""
from __future__ import annotations

import math

import pytest
import torch

from codechat.config.stages import preset
from codechat.engine import Engine, EngineConfig, Request, Sample, SamplingConfig
from codechat.engine.completion import mean_logprob
from codechat.engine.sampling import RowParams, row_seed, sample
from codechat.model import GPT, build_model

VOCAB = 256
MAX_LEN = 128
PROMPT_LENS = (1, 7, 33, 60)
#: Upper 0.001 quantiles of the chi-square distribution by degrees of freedom (standard tables):
#: a correct sampler fails one of these tests with probability 0.001 for a given seed, and the
#: seeds are fixed, so the tests are deterministic.
CHI2_CRIT_P001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322, 15: 37.697}
#: Unsorted on purpose, so that a filter must map sorted ranks back to vocabulary ids. Its
#: softmax sorted: ids 1, 5, 3, 0, 7, 4, 2, 6 with probabilities .402 .243 .148 .081 .060 .040 .018 .008.
LOGITS8 = torch.tensor([0.3, 1.9, -1.2, 0.9, -0.4, 1.4, -2.0, 0.0])
N_DRAWS = 20_000

pytestmark = pytest.mark.timeout(60)  # an engine that never finishes a row fails instead of hanging


def greedy_cfg(max_new_tokens: int) -> SamplingConfig:
    return SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0)


def build(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return build_model(preset("tiny", vocab_size=VOCAB, max_seq_len=MAX_LEN, init_std=0.1)).eval()


def prompt_of(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.no_grad()
def greedy_reference(model: GPT, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens by full recomputation: argmax of ``GPT.forward`` over the whole sequence."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


@torch.no_grad()
def teacher_forced_logits(model: GPT, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """(len(completion), V) float32 logits of one ``GPT.forward`` predicting each completion token."""
    return model(torch.tensor([list(prompt) + list(completion)]))[0, len(prompt) - 1:-1]


def filtered_logprobs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """(V,) float64 log-probs of the distribution sampled from, -inf outside its support.

    Divide the logits by the temperature, keep the ``top_k`` largest (0: all), then of those, by
    decreasing probability, the smallest prefix whose renormalised mass reaches ``top_p`` (at
    least one token), and renormalise.
    """
    z = logits.double() / temperature
    order = z.argsort(descending=True)
    n = len(order) if top_k == 0 else min(top_k, len(order))
    if top_p < 1.0:
        mass_before = z[order[:n]].softmax(0).cumsum(0)
        n = min(n, int((mass_before < top_p).sum()) + 1)
    kept = order[:n]
    out = torch.full_like(z, -math.inf)
    out[kept] = z[kept] - z[kept].logsumexp(0)
    return out


def tokens(out: list[list[Sample]]) -> list[list[list[int]]]:
    return [[s.token_ids for s in samples] for samples in out]


class Greedy:
    """Memoised :func:`greedy_reference` (a longer request extends the stored continuation)."""

    def __init__(self, model: GPT) -> None:
        self.model, self.memo = model, {}

    def __call__(self, prompt: list[int], n: int) -> list[int]:
        key = tuple(prompt)
        have = self.memo.get(key, [])
        if len(have) < n:
            have = have + greedy_reference(self.model, list(key) + have, n - len(have))
            self.memo[key] = have
        return have[:n]


@pytest.fixture(scope="module")
def model() -> GPT:
    return build()


@pytest.fixture(scope="module")
def prompts() -> dict[int, list[int]]:
    return {n: prompt_of(n, seed=n) for n in PROMPT_LENS}


@pytest.fixture(scope="module")
def greedy(model: GPT) -> Greedy:
    return Greedy(model)


# -- 1. greedy == recomputation ---------------------------------------------------------------

def test_greedy_single_prompt_equals_full_recomputation(model, prompts, greedy):
    cfg = SamplingConfig(max_new_tokens=24, temperature=0, top_k=0, top_p=1)  # ints, as users write them
    [[s]] = Engine(model, EngineConfig(slots=4)).generate([Request(prompts[33], cfg)])
    ref = greedy(prompts[33], 24)
    assert len(set(ref)) > 5  # the model does not just repeat one token: the check has teeth
    assert s.token_ids == ref
    assert s.finish == "length"


@pytest.mark.parametrize("steps", [1, 3], ids=["1-step", "3-step-launches"])
def test_greedy_mixed_prompt_lengths_in_one_batch_equal_recomputation_with_slot_reuse(steps, model, prompts, greedy):
    news = {1: 12, 7: 5, 33: 9, 60: 12}  # rows finish at different steps, freeing slots for the waiting ones
    reqs = [Request(prompts[n], greedy_cfg(news[n])) for n in PROMPT_LENS]
    reqs.append(Request(prompts[7], greedy_cfg(10), samples=2))  # one prefill, two slots
    out = Engine(model, EngineConfig(slots=3, decode_steps=steps)).generate(reqs)  # 6 rows, 3 slots
    for n, [s] in zip(PROMPT_LENS, out):
        assert s.token_ids == greedy(prompts[n], news[n]), f"prompt of {n} tokens"
        assert s.finish == "length"
    assert tokens(out)[4] == [greedy(prompts[7], 10)] * 2


def test_step_counters_count_the_prefills_rows_and_tokens_of_a_generate(model, prompts):
    news = {1: 12, 7: 5, 33: 9, 60: 12}
    reqs = [Request(prompts[n], greedy_cfg(news[n])) for n in PROMPT_LENS] + [Request(prompts[7], greedy_cfg(10), samples=2)]
    eng = Engine(model, EngineConfig(slots=6, decode_steps=2))
    out = eng.generate(reqs)
    c = eng.counters
    assert c.prefills == 1 and c.prefill_rows == 6  # every row fits at once: one packed prefill
    # each prompt but its last token (the first launch reads it); the two samples of one prompt share it
    assert c.prefill_tokens == sum(n - 1 for n in PROMPT_LENS) + 7 - 1
    assert c.tokens == sum(len(s.token_ids) for samples in out for s in samples) == sum(news.values()) + 20
    # a launch gives each row two tokens, its first included: a row of m tokens is in ceil(m / 2)
    # launches (12: 6, 5: 3, 9: 5, 10: 5), so the launches hold 6, 6, 6, 5, 5 and 2 rows
    assert c.launches == 6 and c.launch_rows == 30 and c.masked_launches == 0
    assert c.steps >= c.launches and c.wait_s == 0.0  # no device to wait for on a CPU
    assert 0 < c.admit_s < c.step_s and c.fill_s == 0.0
    assert set(c.as_dict()) >= {"steps", "step_s", "prefills", "tokens"}


def test_greedy_requests_joining_a_running_batch_equal_recomputation(model, prompts, greedy):
    eng = Engine(model, EngineConfig(slots=3, max_prefill_tokens=40))  # 40: the 33 and 60 prefill in later steps
    first = eng.add(Request(prompts[33], greedy_cfg(16)))
    for _ in range(4):
        eng.step()
    assert 0 < len(eng.output(first)[0].token_ids) < 16  # really mid-way
    joined = {eng.add(Request(prompts[n], greedy_cfg(m))): (n, m) for n, m in ((1, 10), (60, 8), (7, 12))}
    for _ in range(3):
        eng.step()
    assert not eng.done(first)
    joined[eng.add(Request(prompts[60][:20], greedy_cfg(9)))] = (-20, 9)  # waits for a slot to free
    while eng.has_work():
        eng.step()
    assert eng.pop(first)[0].token_ids == greedy(prompts[33], 16)
    for rid, (n, m) in joined.items():
        prompt = prompts[60][:20] if n == -20 else prompts[n]
        [s] = eng.pop(rid)
        assert (s.token_ids, s.finish) == (greedy(prompt, m), "length"), f"request {rid}"


# -- 2. seeded samples do not depend on the batch ---------------------------------------------

@pytest.mark.parametrize("steps", [1, 3], ids=["1-step", "3-step-launches"])
def test_each_sample_of_a_mixed_batch_equals_that_sample_drawn_alone(steps, model, prompts):
    plain = SamplingConfig(max_new_tokens=10, temperature=1.0, top_k=0, top_p=1.0)
    reqs = [Request(prompts[1], plain, samples=4, seed=11),
            Request(prompts[33], SamplingConfig(max_new_tokens=7, temperature=1.0, top_p=0.9), samples=4, seed=12),
            Request(prompts[60], plain, samples=4, seed=13),
            Request(prompts[7], SamplingConfig(max_new_tokens=10, temperature=1.0, top_k=20, top_p=1.0),
                    samples=4, seed=14)]
    batched = Engine(model, EngineConfig(slots=5, decode_steps=steps)).generate(reqs)  # 16 rows, 5 slots, unfiltered beside filtered
    alone = Engine(model, EngineConfig(slots=1))
    for req, samples in zip(reqs, batched):
        assert len({tuple(s.token_ids) for s in samples}) > 1, "the samples of one request must differ"
        for i, s in enumerate(samples):
            [[a]] = alone.generate([Request(req.prompt, req.sampling, samples=[i], seed=req.seed)])
            assert a.token_ids == s.token_ids, f"seed {req.seed} sample {i}"
            assert a.logprobs == pytest.approx(s.logprobs, abs=1e-5)
            assert a.finish == s.finish == "length"


# -- 3. log-probs -----------------------------------------------------------------------------

def test_logprobs_equal_a_teacher_forced_forward_under_the_sampling_distribution(model, prompts):
    cfgs = [SamplingConfig(max_new_tokens=10, temperature=0.7, top_k=0, top_p=1.0),
            SamplingConfig(max_new_tokens=10, temperature=1.3, top_k=5, top_p=1.0),
            SamplingConfig(max_new_tokens=10, temperature=0.9, top_k=0, top_p=0.8),
            SamplingConfig(max_new_tokens=10, temperature=1.5, top_k=40, top_p=0.7),
            SamplingConfig(max_new_tokens=10, temperature=0.0)]
    reqs = [Request(prompts[n], c, samples=2, seed=k) for k, (n, c) in enumerate(zip((1, 7, 33, 60, 7), cfgs))]
    out = Engine(model, EngineConfig(slots=4)).generate(reqs)
    for req, samples in zip(reqs, out):
        c = req.sampling
        for s in samples:
            tok = torch.tensor(s.token_ids)
            at = torch.arange(len(tok))
            logits = teacher_forced_logits(model, list(req.prompt), s.token_ids)
            t1 = logits.log_softmax(-1)[at, tok]
            assert s.logprobs_t1 == pytest.approx(t1.tolist(), abs=1e-5)
            if c.temperature == 0:
                assert s.logprobs == [0.0] * len(tok)
                assert tok.tolist() == logits.argmax(-1).tolist()
                continue
            ref = torch.stack([filtered_logprobs(row, c.temperature, c.top_k, c.top_p) for row in logits])[at, tok]
            assert torch.isfinite(ref).all(), f"{c}: a token outside the kept set was drawn"
            assert s.logprobs == pytest.approx(ref.tolist(), abs=1e-5)
            assert (ref - t1.double()).abs().max() > 1e-2  # the distribution used is not the plain softmax


def test_score_and_mean_logprob_equal_a_teacher_forced_forward(model, prompts, greedy):
    eng = Engine(model, EngineConfig(slots=2))
    prompt, completion = prompts[33], prompts[7] + prompts[1]
    at = torch.arange(len(completion))
    ref = teacher_forced_logits(model, prompt, completion).log_softmax(-1)[at, torch.tensor(completion)]
    running = eng.add(Request(prompts[60], greedy_cfg(10)))
    for _ in range(3):
        eng.step()
    assert eng.score(prompt, completion) == pytest.approx(ref.tolist(), abs=1e-5)  # in the middle of a generation
    assert mean_logprob(eng, prompt, completion) == pytest.approx(float(ref.mean()), abs=1e-5)
    while eng.has_work():
        eng.step()
    assert eng.pop(running)[0].token_ids == greedy(prompts[60], 10)  # scoring used no slot
    with pytest.raises(ValueError, match="non-empty prompt and completion"):
        eng.score(prompt, [])
    with pytest.raises(ValueError, match="non-empty prompt and completion"):
        mean_logprob(eng, [], completion)
    with pytest.raises(ValueError, match="129 tokens is over the engine's context of 128"):
        eng.score(prompts[60] * 2, prompts[7] + [1, 2])


# -- 4. the sampling distribution -------------------------------------------------------------

def draw(logits: torch.Tensor, n: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
         seeds: torch.Tensor | None = None, stream_seed: int = row_seed(7, 0)
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` draws from ``logits`` (V,) through :func:`sample`: rows of seeds ``seeds`` at counter
    0, or (``seeds`` None) one row's stream ``stream_seed`` at counters 0..n-1."""
    if seeds is None:
        seeds, counters = torch.full((n,), stream_seed), torch.arange(n)
    else:
        counters = torch.zeros(n, dtype=torch.long)
    p = RowParams(torch.full((n,), float(temperature)), torch.full((n,), top_k), torch.full((n,), float(top_p)),
                  seeds, counters, filtered=top_k > 0 or top_p < 1.0, sampled=temperature > 0)
    return sample(logits.expand(n, -1).contiguous(), p)


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic of observed ``counts`` against category probabilities ``probs``."""
    expected = counts.sum() * probs.double()
    return float(((counts.double() - expected) ** 2 / expected).sum())


def test_temperature_draws_follow_the_softmax_of_the_scaled_logits():
    n = N_DRAWS // 2
    seeds = torch.tensor([row_seed(s, 0) for s in range(n)])  # many rows, each its own seed
    tok, lp, lp1 = draw(LOGITS8, n, temperature=0.7, seeds=seeds)
    counts = torch.bincount(tok, minlength=8)
    probs = (LOGITS8.double() / 0.7).softmax(0)
    assert chi2(counts, probs) < CHI2_CRIT_P001[7]
    assert chi2(counts, LOGITS8.double().softmax(0)) > CHI2_CRIT_P001[7]  # temperature 1 would be seen
    assert lp.tolist() == pytest.approx(probs.log()[tok].tolist(), abs=1e-5)
    assert lp1.tolist() == pytest.approx(LOGITS8.log_softmax(0)[tok].tolist(), abs=1e-6)


def test_top_k_never_draws_outside_the_k_most_likely_and_renormalises():
    tok, lp, lp1 = draw(LOGITS8, N_DRAWS, temperature=1.0, top_k=3)  # one row, counters 0..N-1
    counts = torch.bincount(tok, minlength=8)
    top3 = [1, 5, 3]
    assert counts.sum() == counts[top3].sum(), f"tokens outside the top 3 were drawn: {counts.tolist()}"
    probs = LOGITS8[top3].double().softmax(0)
    assert chi2(counts[top3], probs) < CHI2_CRIT_P001[2]
    lp_ref = torch.full((8,), -math.inf, dtype=torch.float64)
    lp_ref[top3] = probs.log()
    assert lp.tolist() == pytest.approx(lp_ref[tok].tolist(), abs=1e-5)
    assert lp1.tolist() == pytest.approx(LOGITS8.log_softmax(0)[tok].tolist(), abs=1e-6)


@pytest.mark.parametrize("temperature,top_k,top_p,kept", [
    (1.0, 0, 0.01, [1]),  # p below the first token's mass: the first token always stays
    (1.0, 0, 0.64, [1, 5]),  # .402 + .243 = .645 reaches .64 ...
    (1.0, 0, 0.65, [1, 5, 3]),  # ... but not .65
    (1.0, 0, 0.80, [1, 5, 3, 0]),
    # temperature first, then top-k, then top-p on the renormalised top k: at T=1.5 the top 5 have
    # renormalised cumulative mass .350 .601 .781 .901 1, so p=.83 keeps 4 (p before temperature
    # would keep 3, p over the whole vocabulary 5)
    (1.5, 5, 0.83, [1, 5, 3, 0]),
])
def test_top_p_keeps_exactly_the_smallest_prefix_reaching_p(temperature, top_k, top_p, kept):
    ref = filtered_logprobs(LOGITS8, temperature, top_k, top_p)
    assert torch.isfinite(ref).nonzero().flatten().tolist() == sorted(kept)  # the table above is right
    tok, lp, _ = draw(LOGITS8, N_DRAWS, temperature, top_k, top_p)
    counts = torch.bincount(tok, minlength=8)
    assert sorted(set(tok.tolist())) == sorted(kept), f"drawn {counts.tolist()}"
    if len(kept) > 1:
        assert chi2(counts[kept], ref[kept].exp()) < CHI2_CRIT_P001[len(kept) - 1]
    assert lp.tolist() == pytest.approx(ref[tok].tolist(), abs=1e-5)


def test_same_seed_reproduces_and_sample_indices_give_independent_streams(model, prompts):
    assert row_seed(5, 3) == row_seed(5, 3)
    assert len({row_seed(5, i) for i in range(1000)}) == 1000
    assert len({row_seed(s, 0) for s in range(1000)}) == 1000
    logits4 = torch.tensor([0.5, 0.0, -0.3, 0.2])
    a, lp_a, _ = draw(logits4, N_DRAWS, stream_seed=row_seed(5, 0))
    again, lp_again, _ = draw(logits4, N_DRAWS, stream_seed=row_seed(5, 0))
    b, _, _ = draw(logits4, N_DRAWS, stream_seed=row_seed(5, 1))
    assert torch.equal(a, again) and torch.equal(lp_a, lp_again)
    # sample 0 and sample 1 at the same counters are independent draws: their joint counts follow
    # the product of the marginals (16 cells, 15 degrees of freedom)
    p = logits4.double().softmax(0)
    joint = torch.bincount(a * 4 + b, minlength=16)
    assert chi2(joint, torch.outer(p, p).flatten()) < CHI2_CRIT_P001[15]
    # through the engine: the same request twice gives the same samples, another seed others
    cfg = SamplingConfig(max_new_tokens=8, temperature=1.0, top_p=1.0)
    eng = Engine(model, EngineConfig(slots=2))
    first, second, other = eng.generate([Request(prompts[7], cfg, samples=2, seed=s) for s in (3, 3, 4)])
    assert [s.token_ids for s in first] == [s.token_ids for s in second]
    assert [s.token_ids for s in first] != [s.token_ids for s in other]


# -- 5. finishing: stop ids, length, the context, empty input, cancel, stream -----------------

@pytest.mark.parametrize("steps", [1, 3], ids=["1-step", "3-step-launches"])
def test_stop_id_finishes_only_its_row_and_is_kept(steps, model, prompts, greedy):
    ref = greedy(prompts[33], 16)
    j = next(j for j in range(2, 16) if ref[j] not in ref[:j])
    stop = ref[j]
    cfg = greedy_cfg(16)
    eng = Engine(model, EngineConfig(slots=4, decode_steps=steps))
    stopped, unstopped, other, at_first = eng.generate([
        Request(prompts[33], cfg, stop_ids=[stop]),
        Request(prompts[33], cfg),  # same prompt, no stop id: emits ``stop`` and goes on
        Request(prompts[60], cfg),
        Request(prompts[33], cfg, stop_ids=[ref[0]]),  # stops on the prefill's token
    ])
    assert (stopped[0].token_ids, stopped[0].finish) == (ref[:j + 1], "stop")
    assert len(stopped[0].logprobs) == len(stopped[0].logprobs_t1) == j + 1
    assert (unstopped[0].token_ids, unstopped[0].finish) == (ref, "length")
    assert (other[0].token_ids, other[0].finish) == (greedy(prompts[60], 16), "length")
    assert (at_first[0].token_ids, at_first[0].finish) == ([ref[0]], "stop")


@pytest.mark.parametrize("steps", [1, 3], ids=["1-step", "3-step-launches"])
def test_max_new_tokens_gives_exactly_that_many_tokens(steps, model, prompts, greedy):
    eng = Engine(model, EngineConfig(slots=2, decode_steps=steps))
    news = (1, 2, 5, 9)
    out = eng.generate([Request(prompts[7], greedy_cfg(m)) for m in news]
                       + [Request(prompts[1], SamplingConfig(max_new_tokens=6, temperature=1.0), samples=3)])
    for m, [s] in zip(news, out):
        assert (s.token_ids, s.finish) == (greedy(prompts[7], m), "length")
        assert len(s.logprobs) == len(s.logprobs_t1) == m
    assert [(len(s.token_ids), s.finish) for s in out[-1]] == [(6, "length")] * 3


def test_context_limit_is_refused_at_add_and_a_request_filling_it_exactly_runs_whole(model, greedy):
    eng = Engine(model, EngineConfig(slots=2))
    assert eng.max_len == MAX_LEN
    with pytest.raises(ValueError, match=f"max_len={MAX_LEN + 1} is over the model's max_seq_len={MAX_LEN}"):
        Engine(model, EngineConfig(slots=1, max_len=MAX_LEN + 1))
    long = prompt_of(MAX_LEN - 8, seed=99)
    with pytest.raises(ValueError, match=r"prompt of 120 tokens \+ max_new_tokens 9 = 129 is over the engine's "
                                         r"context of 128 positions .*shorten the prompt or lower max_new_tokens"):
        eng.add(Request(long, greedy_cfg(9)))
    assert not eng.has_work()  # nothing was queued
    [[s]] = eng.generate([Request(long, greedy_cfg(8))])  # 120 + 8 = 128: the last position is used
    assert (s.token_ids, s.finish) == (greedy(long, 8), "length")
    short = Engine(model, EngineConfig(slots=1, max_len=32))
    with pytest.raises(ValueError, match="= 33 is over the engine's context of 32 positions"):
        short.add(Request(prompt_of(30, seed=1), greedy_cfg(3)))


def test_empty_batch_returns_nothing_and_an_empty_prompt_is_refused(model):
    eng = Engine(model, EngineConfig(slots=2))
    assert eng.generate([]) == []
    assert not eng.has_work() and eng.step() == []
    with pytest.raises(ValueError, match="empty prompt"):
        Request([])


def test_cancel_frees_the_slot_keeps_the_output_and_other_rows_match_greedy(model, prompts, greedy):
    eng = Engine(model, EngineConfig(slots=2))
    a = eng.add(Request(prompts[33], greedy_cfg(16)))
    b = eng.add(Request(prompts[60], greedy_cfg(16)))
    c = eng.add(Request(prompts[7], greedy_cfg(10)))  # waits: both slots are taken
    for _ in range(4):
        eng.step()
    assert eng.output(c)[0].token_ids == []
    n_b = len(eng.output(b)[0].token_ids)
    assert 0 < n_b < 16
    eng.cancel(b)
    assert eng.done(b) and eng.output(b)[0].finish == "cancelled"
    # at once: admitted at the next step, its first token launched at the one after and read back at the third
    assert any(ev.request == c for ev in eng.step() + eng.step() + eng.step()), "c should take b's slot at once"
    d = eng.add(Request(prompts[1], greedy_cfg(5)))  # waits for a slot ...
    eng.cancel(d)  # ... and is cancelled there
    assert eng.done(d) and (eng.output(d)[0].token_ids, eng.output(d)[0].finish) == ([], "cancelled")
    e = eng.add(Request(prompts[1], greedy_cfg(6), samples=2))
    eng.cancel(e, sample=1)  # one waiting row of two
    while eng.has_work():
        eng.step()
    assert (eng.output(a)[0].token_ids, eng.output(a)[0].finish) == (greedy(prompts[33], 16), "length")
    assert eng.output(b)[0].token_ids == greedy(prompts[60], 16)[:n_b]  # what it had, nothing after
    assert (eng.output(c)[0].token_ids, eng.output(c)[0].finish) == (greedy(prompts[7], 10), "length")
    assert eng.output(d)[0].token_ids == []
    e0, e1 = eng.pop(e)
    assert (e0.token_ids, e0.finish) == (greedy(prompts[1], 6), "length")
    assert (e1.token_ids, e1.finish) == ([], "cancelled")


def test_stream_yields_tokens_in_order_and_closing_it_cancels(model, prompts, greedy):
    eng = Engine(model, EngineConfig(slots=2))
    other = eng.add(Request(prompts[60], greedy_cfg(30)))  # runs beside both streams
    events = list(eng.stream(Request(prompts[33], greedy_cfg(12))))
    assert [e.token for e in events] == greedy(prompts[33], 12)
    assert [e.finish for e in events] == [None] * 11 + ["length"]
    assert {(e.sample, e.logprob) for e in events} == {(0, 0.0)}
    it = eng.stream(Request(prompts[7], greedy_cfg(12)))
    head = [next(it) for _ in range(3)]
    assert [e.token for e in head] == greedy(prompts[7], 3)
    assert not eng.done(other)
    it.close()
    rest = list(eng.run())
    assert rest and {e.request for e in rest} == {other}, "the closed stream went on generating"
    assert eng.pop(other)[0].token_ids == greedy(prompts[60], 30)
    assert not eng.has_work()


# -- 6. weight reloads ------------------------------------------------------------------------

def test_load_weights_makes_generation_follow_the_new_weights(prompts):
    m = build(seed=1)
    eng = Engine(m, EngineConfig(slots=2))
    reqs = [Request(prompts[33], greedy_cfg(10)), Request(prompts[7], greedy_cfg(10))]
    before = [[greedy_reference(m, list(r.prompt), 10)] for r in reqs]
    assert tokens(eng.generate(reqs)) == before
    torch.manual_seed(2)
    m.init_weights()  # new values in the same tensors, as an optimizer step writes them
    after = [[greedy_reference(m, list(r.prompt), 10)] for r in reqs]
    assert after != before
    assert tokens(eng.generate(reqs)) == before, "the engine must keep its copy until load_weights"
    eng.load_weights(m)
    assert tokens(eng.generate(reqs)) == after
    other = build(seed=3)
    eng.load_weights(other)  # another GPT of the same shape
    assert tokens(eng.generate(reqs)) == [[greedy_reference(other, list(r.prompt), 10)] for r in reqs]


def test_warm_up_meets_every_batch_bucket_greedy_and_sampled_and_every_prefill_bucket_that_fits(model):
    """What :func:`codechat.engine.warmup.warm_up` runs (on CUDA each first meeting compiles or captures)."""
    from codechat.engine import warmup
    eng = Engine(model, EngineConfig(slots=6, max_len=MAX_LEN, max_prefill_tokens=300))
    launches, prefilled = set(), []
    decode, prefill = eng._decode_steps, eng._prefill_run
    eng._decode_steps = lambda b, kind, max_used=None: launches.add((b, kind.sampled)) or decode(b, kind, max_used)
    eng._prefill_run = lambda prompts, slots: prefilled.append(sum(map(len, prompts))) or prefill(prompts, slots)
    assert warmup.warm_up(eng) > 0
    assert eng.batch_buckets() == [1, 2, 4, 6]
    assert launches == {(b, s) for b in (1, 2, 4, 6) for s in (False, True)}
    assert {128, 256} <= set(prefilled) and max(prefilled) <= 300  # 512 needs more than max_prefill_tokens
    assert not eng.has_work() and eng.counters.steps == 0 and not eng._outputs
    eng.add(Request([1, 2, 3], SamplingConfig(max_new_tokens=2)))
    with pytest.raises(RuntimeError, match="before the first one"):
        warmup.warm_up(eng)
