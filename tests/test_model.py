"""The GPT and the KV-cache engine: shapes, counts, and cache == recomputation."""
from __future__ import annotations

import pytest
import torch

from codechat.config.stages import ModelConfig, preset
from codechat.model import IGNORE_INDEX, build_model


def small(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=97, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, max_seq_len=64), **kw})


def test_presets_have_the_documented_shapes():
    big = preset("8b", vocab_size=50257)
    assert (big.n_layer, big.n_embd, big.n_head) == (40, 4096, 32)
    for name in ("tiny", "d12", "d20", "1b", "2b", "8b"):
        assert preset(name).head_dim * preset(name).n_head == preset(name).n_embd


def test_parameter_count_matches_the_formula_and_tied_head_is_shared():
    cfg = small(tie_embeddings=True)
    m = build_model(cfg)
    assert m.lm_head.weight is m.embed_tokens.weight
    d, f, hd = cfg.n_embd, cfg.intermediate_size, cfg.head_dim
    per_layer = d * hd * (cfg.n_head * 2 + cfg.n_kv_head * 2) + 3 * d * f + 2 * d + 2 * hd
    assert m.num_params() == cfg.vocab_size * d + cfg.n_layer * per_layer + d
    untied = build_model(small(tie_embeddings=False))
    assert untied.num_params() == m.num_params() + cfg.vocab_size * d
    assert untied.flops_per_token(32) == 6 * (untied.num_params() - cfg.vocab_size * d) + 12 * 2 * 4 * 16 * 32


def test_loss_sum_ignores_masked_labels():
    torch.manual_seed(0)
    m = build_model(small())
    x = torch.randint(0, 97, (2, 10))
    y = x.clone()
    y[0, :4] = IGNORE_INDEX
    per_tok = m(x, y, reduction="none")
    assert torch.all(per_tok[0, :4] == 0)
    torch.testing.assert_close(m(x, y, reduction="sum"), per_tok.sum())


def test_sequence_over_the_limit_is_a_clear_error():
    m = build_model(small(max_seq_len=8))
    with pytest.raises(ValueError, match="max_seq_len=8"):
        m(torch.zeros(1, 9, dtype=torch.long))


def test_packed_row_computes_what_each_document_computes_alone():
    torch.manual_seed(2)
    m = build_model(small(init_std=0.1)).eval()
    a, b = torch.randint(0, 97, (1, 5)), torch.randint(0, 97, (1, 9))
    packed = torch.cat([a, b], dim=1)
    doc_ids = torch.tensor([[0] * 5 + [1] * 9])
    with torch.no_grad():
        got = m(packed, doc_ids=doc_ids)
        torch.testing.assert_close(got[:, :5], m(a), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got[:, 5:], m(b), rtol=1e-4, atol=1e-5)
        # without doc_ids the second document would see the first: different logits
        assert not torch.allclose(m(packed)[:, 5:], m(b), atol=1e-3)


def _reference_block_mask(doc_ids: torch.Tensor):
    from torch.nn.attention.flex_attention import create_block_mask
    B, T = doc_ids.shape

    def same_document_causal(b, h, q, kv):
        return (doc_ids[b, q] == doc_ids[b, kv]) & (q >= kv)
    return create_block_mask(same_document_causal, B, None, T, T, device=doc_ids.device)


@pytest.mark.parametrize("docs", [1, 3, 12, 40])
def test_the_document_block_mask_has_the_tiles_create_block_mask_finds(docs):
    """Packed rows (document ids rising along each row, padding last): the same skipped, partial and full tiles
    as ``create_block_mask`` evaluating the mask on every pair, on both the key and the query side."""
    from codechat.model import document_block_mask
    g = torch.Generator().manual_seed(docs)
    doc_ids = torch.sort(torch.randint(0, docs, (3, 1024), generator=g), dim=1).values
    ours, ref = document_block_mask(doc_ids), _reference_block_mask(doc_ids)
    assert ours.shape == ref.shape and ours.BLOCK_SIZE == ref.BLOCK_SIZE
    assert torch.equal(ours.to_dense(), ref.to_dense())
    for side in ("kv", "full_kv", "q", "full_q"):
        n, idx = getattr(ours, f"{side}_num_blocks"), getattr(ours, f"{side}_indices")
        assert torch.equal(n, getattr(ref, f"{side}_num_blocks")), side
        for b, i in ((b, i) for b in range(3) for i in range(n.shape[-1])):
            k = int(n[b, 0, i])
            assert idx[b, 0, i, :k].tolist() == sorted(getattr(ref, f"{side}_indices")[b, 0, i, :k].tolist()), side
    full = int(ours.full_kv_num_blocks.sum())
    assert (full > 0) == (docs < 12)  # long documents fill whole tiles; short ones leave only partial tiles


def test_the_document_block_mask_attends_as_the_dense_mask_for_any_ids():
    """Ids that are not contiguous runs (a tile's range may meet another's without a shared document): the
    attention is still exactly the dense mask's; a length off the tile size falls back to create_block_mask."""
    from torch.nn.attention.flex_attention import flex_attention
    from codechat.model import document_block_mask
    g = torch.Generator().manual_seed(0)
    for T in (512, 320):
        doc_ids = torch.randint(0, 4, (2, T), generator=g)
        doc_ids[0, :128] = torch.arange(128) % 2 * 2  # tile 0 holds ids 0 and 2, tile 1 only id 1: their ranges
        doc_ids[0, 128:256] = 1  # meet, no document is shared (a partial tile whose every pair is masked)
        q, k, v = (torch.randn(2, 2, T, 16, generator=g) for _ in range(3))
        dense = (doc_ids[:, :, None] == doc_ids[:, None, :]) & torch.ones(T, T, dtype=torch.bool).tril()
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense[:, None])
        mask = document_block_mask(doc_ids)
        if T == 512:  # query tile 1 keeps key tile 0 as partial, where create_block_mask finds it empty
            assert mask.kv_num_blocks[0, 0, 1] == _reference_block_mask(doc_ids).kv_num_blocks[0, 0, 1] + 1 == 2
        got = flex_attention(q, k, v, block_mask=mask)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
