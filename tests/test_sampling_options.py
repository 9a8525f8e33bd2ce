"""OpenAI's sampling options in the engine (``codechat/engine/options.py``): presence and frequency
penalties, ``logit_bias`` and ``top_logprobs``, each checked against a reference computed here from
the model's own logits (one teacher-forced forward pass over the generated tokens), and free rows
beside them unchanged.
"""
from __future__ import annotations

import pytest
import torch

from codechat.config.stages import preset
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.engine.sampling import MAX_LOGIT_BIAS
from codechat.model import GPT, build_model

V = 512
N = 24


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return build_model(preset("tiny", vocab_size=V, max_seq_len=256, init_std=0.2)).eval()


@pytest.fixture(scope="module")
def engine(model: GPT) -> Engine:
    return Engine(model, EngineConfig(slots=8))


PROMPT = [5, 17, 200, 3, 99, 42, 7]


def forced_logits(model: GPT, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """(len(generated), V) float32 logits before each generated token (one forward pass)."""
    with torch.no_grad():
        return model(torch.tensor([prompt + generated]))[0, len(prompt) - 1:-1].float()


def penalized(logits: torch.Tensor, generated: list[int], presence: float, frequency: float) -> torch.Tensor:
    """OpenAI's formula at each position over the tokens generated before it (written out per position)."""
    out = logits.clone()
    for i in range(len(generated)):
        counts = torch.bincount(torch.tensor(generated[:i], dtype=torch.long), minlength=V).float()
        out[i] -= counts * frequency + (counts > 0).float() * presence
    return out


def run(engine: Engine, cfg: SamplingConfig, seed: int = 0):
    return engine.generate([Request(PROMPT, cfg, seed=seed)])[0][0]


@pytest.mark.parametrize("presence, frequency", [(2.0, 0.0), (0.0, 1.5), (2.0, -0.5)])
def test_penalties_follow_openais_formula_over_the_tokens_generated_so_far(model, engine, presence, frequency):
    s = run(engine, SamplingConfig(N, temperature=0.0, presence_penalty=presence, frequency_penalty=frequency))
    ref = penalized(forced_logits(model, PROMPT, s.token_ids), s.token_ids, presence, frequency)
    assert s.token_ids == ref.argmax(-1).tolist()
    at = torch.arange(N)
    assert s.logprobs_t1 == pytest.approx(ref.log_softmax(-1)[at, torch.tensor(s.token_ids)].tolist(), abs=1e-4)
    plain = run(engine, SamplingConfig(N, temperature=0.0)).token_ids
    assert s.token_ids != plain  # the penalty changed what was generated: the check has teeth
    if presence > 0 and frequency >= 0:
        assert len(set(s.token_ids)) > len(set(plain))


def test_penalties_under_sampling_match_the_reference_distribution(model, engine):
    cfg = SamplingConfig(N, temperature=0.9, top_p=1.0, presence_penalty=0.7, frequency_penalty=0.4)
    s = run(engine, cfg, seed=5)
    ref = penalized(forced_logits(model, PROMPT, s.token_ids), s.token_ids, 0.7, 0.4)
    at, ids = torch.arange(N), torch.tensor(s.token_ids)
    assert s.logprobs == pytest.approx((ref / 0.9).log_softmax(-1)[at, ids].tolist(), abs=1e-4)


def test_logit_bias_adds_to_each_named_logit(model, engine):
    plain = run(engine, SamplingConfig(N, temperature=0.0))
    banned = plain.token_ids[0]
    bias = {banned: -100.0, 11: 3.5, 300: 100.0}
    s = run(engine, SamplingConfig(N, temperature=0.0, logit_bias=bias))
    ref = forced_logits(model, PROMPT, s.token_ids)
    for i, b in bias.items():
        ref[:, i] += b
    assert s.token_ids == ref.argmax(-1).tolist() == [300] * N  # +100 makes it all but certain
    only_ban = run(engine, SamplingConfig(N, temperature=0.0, logit_bias={banned: -100.0}))
    assert banned not in only_ban.token_ids
    ref = forced_logits(model, PROMPT, only_ban.token_ids)
    ref[:, banned] -= 100
    assert only_ban.token_ids == ref.argmax(-1).tolist()


def test_top_logprobs_are_the_plain_softmaxs_best_at_each_position(model, engine):
    s = run(engine, SamplingConfig(N, temperature=1.0, top_p=1.0, top_logprobs=5, logit_bias={7: 2.0}), seed=3)
    ref = forced_logits(model, PROMPT, s.token_ids)
    ref[:, 7] += 2.0
    lp, ids = ref.log_softmax(-1).topk(5)
    assert len(s.top_logprobs) == N
    for i, top in enumerate(s.top_logprobs):
        assert [t for t, _ in top] == ids[i].tolist()
        assert [x for _, x in top] == pytest.approx(lp[i].tolist(), abs=1e-4)
        assert top[0][1] >= s.logprobs_t1[i] - 1e-5  # the drawn token is no likelier than the best


def test_free_rows_beside_rows_with_options_draw_what_they_draw_alone(engine):
    free = SamplingConfig(N, temperature=1.0, top_p=1.0)
    alone = run(engine, free, seed=9).token_ids
    busy = engine.generate([Request(PROMPT, SamplingConfig(N, temperature=1.0, presence_penalty=2.0, top_logprobs=3,
                                                           logit_bias={1: 5.0}), seed=1),
                            Request(PROMPT, free, seed=9)])
    assert busy[1][0].token_ids == alone and busy[1][0].top_logprobs == []
    assert len(busy[0][0].top_logprobs[0]) == 3


def test_bad_options_are_errors_that_say_what_to_change(engine):
    with pytest.raises(ValueError, match="presence_penalty must be in"):
        SamplingConfig(presence_penalty=2.5)
    with pytest.raises(ValueError, match="biases in"):
        SamplingConfig(logit_bias={3: 101})
    with pytest.raises(ValueError, match=f"at most {MAX_LOGIT_BIAS}"):
        SamplingConfig(logit_bias={i: 1.0 for i in range(MAX_LOGIT_BIAS + 1)})
    with pytest.raises(ValueError, match="top_logprobs must be in"):
        SamplingConfig(top_logprobs=21)
    with pytest.raises(ValueError, match=f"past the model's vocabulary of {V} ids"):
        engine.add(Request(PROMPT, SamplingConfig(logit_bias={V: 1.0})))
