"""The NanoGPT-speedrun architecture options of ModelConfig (issue 32): ReLU² MLP, zero-initialised output
projections, logit soft-capping. Each is off by default and then computes exactly today's model; each on
computes what a written-out reference computes; the engine and the pipeline stage honour them; the HF
export refuses the ones Llama / Qwen3 cannot express."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from codechat.config.stages import ConfigError, ModelConfig, PretrainConfig, build, load, preset, to_dict
from codechat.engine.runner import InferenceModel
from codechat.hf import HFExportError, export_hf
from codechat.hf.config import NOT_EXPORTABLE, hf_config
from codechat.model import GPT, IGNORE_INDEX, build_model
from codechat.parallel.pipeline import Stage
from codechat.train.trainer import same_model

#: The model config as a checkpoint written before the options existed saved it (meta.model).
OLD_META = {"vocab_size": 97, "n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "head_dim": 16,
            "intermediate_size": 192, "max_seq_len": 64, "rope_theta": 10000.0, "norm_eps": 1e-5, "qk_norm": True,
            "tie_embeddings": False, "init_std": 0.2}


def small(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=97, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, max_seq_len=64,
                                 init_std=0.2), **kw})


def reference_logits(m, x: torch.Tensor) -> torch.Tensor:
    """Logits of ``m`` on ``x`` (B, T) written out from Llama's / Qwen3's equations, with the options of
    ``m.cfg``: what ``m(x)`` must give."""
    c = m.cfg
    B, T = x.shape
    D, H, Hkv = c.head_dim, c.n_head, c.n_kv_head

    def rms(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + c.norm_eps) * w

    inv = 1.0 / c.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(t):  # (B, H, T, D)
        return t * cos + torch.cat([-t[..., D // 2:], t[..., :D // 2]], -1) * sin

    h = m.embed_tokens.weight[x]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for b in m.layers:
        a = b.self_attn
        y = rms(h, b.input_layernorm.weight)
        q = (y @ a.q_proj.weight.T).view(B, T, H, D)
        k = (y @ a.k_proj.weight.T).view(B, T, Hkv, D)
        v = (y @ a.v_proj.weight.T).view(B, T, Hkv, D)
        if c.qk_norm:
            q, k = rms(q, a.q_norm.weight), rms(k, a.k_norm.weight)
        q, k, v = rope(q.transpose(1, 2)), rope(k.transpose(1, 2)), v.transpose(1, 2)
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        att = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(~causal, float("-inf")).softmax(-1)
        h = h + (att @ v).transpose(1, 2).reshape(B, T, H * D) @ a.o_proj.weight.T
        y = rms(h, b.post_attention_layernorm.weight)
        mlp = b.mlp
        if c.mlp_act == "relu2":
            inner = torch.relu(y @ mlp.up_proj.weight.T) ** 2
        else:
            inner = F.silu(y @ mlp.gate_proj.weight.T) * (y @ mlp.up_proj.weight.T)
        h = h + inner @ mlp.down_proj.weight.T
    logits = rms(h, m.norm.weight) @ m.lm_head.weight.T
    return c.logit_softcap * torch.tanh(logits / c.logit_softcap) if c.logit_softcap else logits


# ----------------------------------------------------------------------------- config
def test_options_are_off_by_default_and_an_old_checkpoint_config_builds_unchanged():
    cfg = build(ModelConfig, OLD_META)
    assert (cfg.mlp_act, cfg.zero_init_proj, cfg.logit_softcap) == ("swiglu", False, 0.0)
    assert cfg == small()  # the same model as one configured today
    assert same_model(OLD_META, to_dict(cfg))  # so its run resumes
    assert not same_model(OLD_META, to_dict(small(mlp_act="relu2")))


def test_bad_option_values_are_refused_by_name():
    with pytest.raises(ConfigError, match="model.mlp_act"):
        small(mlp_act="gelu")
    with pytest.raises(ConfigError, match="model.logit_softcap"):
        small(logit_softcap=-1.0)


def test_relu2_derives_a_4x_hidden_width_with_swiglus_parameter_count():
    assert small(mlp_act="relu2").intermediate_size == 4 * 64
    d12, d12_relu2 = build_model(preset("d12", vocab_size=512), "meta"), build_model(preset("d12", vocab_size=512,
                                                                                         mlp_act="relu2"), "meta")
    assert d12_relu2.num_params() == d12.num_params()  # 2 x (768 x 3072) == 3 x (768 x 2048)
    # an override of mlp_act derives the width again (as n_embd does), unless the width was set too
    cfg = load(PretrainConfig, None, {"model.mlp_act": "relu2"})
    assert cfg.model.intermediate_size == 4 * cfg.model.n_embd
    cfg = load(PretrainConfig, None, {"model.mlp_act": "relu2", "model.intermediate_size": "128"})
    assert cfg.model.intermediate_size == 128


# ----------------------------------------------------------------------------- forward
def test_default_model_computes_the_written_out_llama_and_its_parameters_are_todays():
    torch.manual_seed(0)
    m = build_model(small())
    names = {n for n, _ in m.named_parameters()}
    assert "layers.0.mlp.gate_proj.weight" in names and len(names) == 3 + 2 * 11  # per block: 2 norms, q k v o, QK-norm, gate up down
    x = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(m(x), reference_logits(m, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw", [dict(mlp_act="relu2"), dict(logit_softcap=3.0),
                                dict(mlp_act="relu2", logit_softcap=3.0, zero_init_proj=True)],
                         ids=["relu2", "softcap", "all"])
def test_each_option_computes_its_written_out_reference(kw):
    torch.manual_seed(1)
    m = build_model(small(**kw))
    if kw.get("mlp_act") == "relu2":
        assert m.layers[0].mlp.gate_proj is None
        assert m.layers[0].mlp.up_proj.weight.shape == (256, 64)
    x = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        logits = m(x)
        torch.testing.assert_close(logits, reference_logits(m, x), rtol=1e-4, atol=1e-4)
    assert logits.shape == (2, 11, 97) and logits.dtype == torch.float32
    if kw.get("logit_softcap"):
        assert logits.abs().max() < 3.0
        # the loss is the cross-entropy of the capped logits, and trains
        y = torch.randint(0, 97, (2, 11))
        y[0, :3] = IGNORE_INDEX
        loss = m(x, y)
        ref = F.cross_entropy(logits.view(-1, 97), y.view(-1), ignore_index=IGNORE_INDEX, reduction="sum")
        torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-4)
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_zero_init_zeroes_only_the_output_projections_and_each_block_starts_as_the_identity():
    torch.manual_seed(2)
    base = build_model(small())
    torch.manual_seed(2)
    zero = build_model(small(zero_init_proj=True))
    for (n, p), (_, q) in zip(base.named_parameters(), zero.named_parameters()):
        if n.endswith(("o_proj.weight", "down_proj.weight")):
            assert q.abs().max() == 0 and p.abs().max() > 0
        else:  # the other weights are drawn as without the option
            assert torch.equal(p, q), n
    x = torch.randint(0, 97, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(zero(x), zero.head(zero.embed_tokens(x), None))
    # and it learns: after one SGD step the projections are no longer zero
    zero(x, x).backward()
    assert zero.layers[0].self_attn.o_proj.weight.grad.abs().max() > 0


# ----------------------------------------------------------------------------- other consumers
@pytest.mark.parametrize("kw", [dict(), dict(mlp_act="relu2", logit_softcap=2.0)], ids=["default", "relu2-softcap"])
def test_engine_and_pipeline_stage_compute_the_models_logits(kw):
    torch.manual_seed(3)
    m = build_model(small(**kw)).eval()
    x = torch.randint(0, 97, (1, 12))
    im = InferenceModel(m, torch.float32, 64)

    def attend(layer, q, k, v):  # plain causal attention over the 12 tokens, token-major
        t = [u.transpose(0, 1).unsqueeze(0) for u in (q, k, v)]
        return F.scaled_dot_product_attention(*t, is_causal=True, enable_gqa=True)[0].transpose(0, 1)

    stage = Stage(m, range(m.cfg.n_layer), first=True, last=True)
    with torch.no_grad():
        ref = m(x)[0]
        torch.testing.assert_close(im.logits(im.forward(x[0], torch.arange(12), attend)), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(stage(x)[0], ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- HF export
def test_export_refuses_each_option_llama_and_qwen3_cannot_express(tmp_path):
    assert set(NOT_EXPORTABLE) == {"mlp_act", "logit_softcap"}
    assert hf_config(small(zero_init_proj=True), dtype="float32", bos_id=1, eos_id=2)["hidden_act"] == "silu"
    for kw, field in ((dict(mlp_act="relu2"), "model.mlp_act='relu2'"), (dict(logit_softcap=30.0),
                                                                        "model.logit_softcap=30.0")):
        with pytest.raises(HFExportError, match=field.replace(".", r"\.")):
            hf_config(small(**kw), dtype="float32", bos_id=1, eos_id=2)
    # end to end: refused before any file is written
    src = tmp_path / "step_000001"
    (src / "tokenizer").mkdir(parents=True)
    ckpt = {"dir": src, "state": {"meta": {"model": to_dict(small(mlp_act="relu2", logit_softcap=15.0))}}, "model": {}}
    with pytest.raises(HFExportError, match="mlp_act.*logit_softcap"):
        export_hf(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".tmp*"))


@pytest.mark.parametrize("act", ["swiglu", "relu2"])
def test_the_planner_counts_the_parameters_of_either_mlp(act):
    from codechat.train.plan import param_counts
    cfg = preset("tiny", vocab_size=512, mlp_act=act)
    pc = param_counts(cfg)
    with torch.device("meta"):
        model = GPT(cfg)
    assert pc.embedding + pc.n_layer * pc.block + pc.head == sum(p.numel() for p in model.parameters())
    assert len(pc.block_matrices) == (6 if act == "relu2" else 7)
