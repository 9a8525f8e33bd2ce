"""The NanoGPT-speedrun architecture options of ModelConfig (issue 32): ReLU² MLP, zero-initialised output
projections, logit soft-capping, the embedding mixed into every block (x0_mix) and U-net skips between
blocks. Each is off by default and then computes exactly today's model; each on computes what a
written-out reference computes; the engine and the pipeline stage honour them (a pipeline of several
stages refuses the skips); the HF export refuses the ones Llama / Qwen3 cannot express."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import saved_for_backward

from codechat import checkpoint as ckpt
from codechat.config.stages import (ConfigError, DataConfig, ModelConfig, OptimConfig, PretrainConfig, RunConfig,
                                    TrainConfig, build, load, preset, to_dict)
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.engine.runner import InferenceModel
from codechat.hf import HFExportError, export_hf
from codechat.hf.config import NOT_EXPORTABLE, hf_config
from codechat.model import GPT, IGNORE_INDEX, KVCache, build_model
from codechat.parallel.pipeline import Stage
from codechat.parallel.world import World
from codechat.parallel.wrapper import Parallel
from codechat.train.optim import build_optimizer, hidden_matrix_names
from codechat.train.trainer import Trainer, same_model

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

    h = x0 = m.embed_tokens.weight[x]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    L, kept = c.n_layer, []
    for i, b in enumerate(m.layers):
        if c.x0_mix:
            h = m.x_scale[i] * h + m.x0_scale[i] * x0
        if c.unet_skips and i >= L - L // 2:  # block L-1-j reads block j's output
            h = h + m.unet_scale[L - 1 - i] * kept[L - 1 - i]
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
        if c.unet_skips and i < L // 2:
            kept.append(h)
    logits = rms(h, m.norm.weight) @ m.lm_head.weight.T
    return c.logit_softcap * torch.tanh(logits / c.logit_softcap) if c.logit_softcap else logits


def causal_attend(layer, q, k, v):
    """The engine's ``attend`` for one sequence given whole: plain causal attention, token-major."""
    t = [u.transpose(0, 1).unsqueeze(0) for u in (q, k, v)]
    return F.scaled_dot_product_attention(*t, is_causal=True, enable_gqa=True)[0].transpose(0, 1)


# ----------------------------------------------------------------------------- config
def test_options_are_off_by_default_and_an_old_checkpoint_config_builds_unchanged():
    cfg = build(ModelConfig, OLD_META)
    assert (cfg.mlp_act, cfg.zero_init_proj, cfg.logit_softcap, cfg.x0_mix, cfg.unet_skips) == (
        "swiglu", False, 0.0, False, False)
    assert cfg == small()  # the same model as one configured today
    assert same_model(OLD_META, to_dict(cfg))  # so its run resumes
    assert not same_model(OLD_META, to_dict(small(mlp_act="relu2")))
    assert not same_model(OLD_META, to_dict(small(x0_mix=True)))
    assert not same_model(OLD_META, to_dict(small(unet_skips=True)))


def test_bad_option_values_are_refused_by_name():
    with pytest.raises(ConfigError, match="model.mlp_act"):
        small(mlp_act="gelu")
    with pytest.raises(ConfigError, match="model.logit_softcap"):
        small(logit_softcap=-1.0)
    with pytest.raises(ConfigError, match="model.unet_skips.*n_layer >= 2"):
        small(unet_skips=True, n_layer=1)


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
    assert set(m.state_dict()) == names  # no scalars of x0_mix / unet_skips: an old checkpoint loads as it is
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
    stage = Stage(m, range(m.cfg.n_layer), first=True, last=True)
    with torch.no_grad():
        ref = m(x)[0]
        torch.testing.assert_close(im.logits(im.forward(x[0], torch.arange(12), causal_attend)), ref, rtol=1e-5,
                                   atol=1e-5)
        torch.testing.assert_close(stage(x)[0], ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- HF export
def test_export_refuses_each_option_llama_and_qwen3_cannot_express(tmp_path):
    assert set(NOT_EXPORTABLE) == {"mlp_act", "logit_softcap", "x0_mix", "unet_skips"}
    assert hf_config(small(zero_init_proj=True), dtype="float32", bos_id=1, eos_id=2)["hidden_act"] == "silu"
    for kw, field in ((dict(mlp_act="relu2"), "model.mlp_act='relu2'"), (dict(logit_softcap=30.0),
                                                                        "model.logit_softcap=30.0"),
                      (dict(x0_mix=True), "model.x0_mix=True"), (dict(unet_skips=True), "model.unet_skips=True")):
        with pytest.raises(HFExportError, match=field.replace(".", r"\.")):
            hf_config(small(**kw), dtype="float32", bos_id=1, eos_id=2)
    # end to end: refused before any file is written
    src = tmp_path / "step_000001"
    (src / "tokenizer").mkdir(parents=True)
    for kw, match in ((dict(mlp_act="relu2", logit_softcap=15.0), "mlp_act.*logit_softcap"),
                      (dict(x0_mix=True, unet_skips=True), "x0_mix.*unet_skips")):
        saved = {"dir": src, "state": {"meta": {"model": to_dict(small(**kw))}}, "model": {}}
        with pytest.raises(HFExportError, match=match):
            export_hf(saved, tmp_path / "hf")
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".tmp*"))


@pytest.mark.parametrize("skips", [False, True], ids=["", "skips"])
@pytest.mark.parametrize("act", ["swiglu", "relu2"])
def test_the_planner_counts_the_parameters_of_either_mlp(act, skips):
    from codechat.train.plan import param_counts
    cfg = preset("tiny", vocab_size=512, mlp_act=act, x0_mix=skips, unet_skips=skips)
    pc = param_counts(cfg)
    with torch.device("meta"):
        model = GPT(cfg)
    assert pc.embedding + pc.n_layer * pc.block + pc.head == sum(p.numel() for p in model.parameters())
    assert len(pc.block_matrices) == (6 if act == "relu2" else 7)


# ----------------------------------------------------------------------------- x0_mix, unet_skips
SKIPS = [dict(x0_mix=True), dict(unet_skips=True), dict(x0_mix=True, unet_skips=True)]
SKIP_IDS = ["x0_mix", "unet", "both"]


def perturbed(m):
    """``m`` with its x0_mix / unet_skips scalars moved off their initial values, as training moves them."""
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name in ("x_scale", "x0_scale", "unet_scale"):
            if getattr(m, name) is not None:
                getattr(m, name).add_(0.5 * torch.randn(getattr(m, name).shape, generator=g))
    return m


@pytest.mark.parametrize("n_layer", [3, 4])
@pytest.mark.parametrize("kw", SKIPS, ids=SKIP_IDS)
def test_skip_scalars_start_at_their_stated_values_and_the_forward_is_the_written_out_loop(kw, n_layer):
    torch.manual_seed(5)
    m = build_model(small(n_layer=n_layer, **kw))  # on meta, to_empty, init_weights
    expect = {**({"x_scale": torch.ones(n_layer), "x0_scale": torch.zeros(n_layer)} if kw.get("x0_mix") else {}),
              **({"unet_scale": torch.ones(n_layer // 2)} if kw.get("unet_skips") else {})}
    own = {n: p for n, p in m.named_parameters() if "." not in n}
    assert own.keys() == expect.keys() and all(torch.equal(own[n], expect[n]) for n in expect)
    x = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(m(x), reference_logits(m, x), rtol=1e-4, atol=1e-4)
        perturbed(m)
        full = m(x)
        torch.testing.assert_close(full, reference_logits(m, x), rtol=1e-4, atol=1e-4)
        # the model's own KV cache: a prefill then one token at a time gives the same logits
        cache = KVCache.empty(m.cfg, 2, 11, torch.device("cpu"), torch.float32)
        steps = [m(x[:, :8], cache=cache)]
        for t in range(8, 11):
            cache.pos = t
            steps.append(m(x[:, t:t + 1], cache=cache))
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-4)


def test_x0_mix_at_init_computes_exactly_the_model_without_it():
    torch.manual_seed(6)
    base = build_model(small(n_layer=3))
    torch.manual_seed(6)
    mixed = build_model(small(n_layer=3, x0_mix=True))
    for n, p in base.named_parameters():  # the scalars draw no random numbers: the other weights are the same
        assert torch.equal(p, mixed.get_parameter(n)), n
    x = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        assert torch.equal(mixed(x), base(x))  # 1 * x + 0 * x0 is x


@pytest.mark.parametrize("kw", SKIPS, ids=SKIP_IDS)
def test_engine_computes_the_models_logits_and_greedy_tokens_with_skips(kw):
    torch.manual_seed(7)
    m = perturbed(build_model(small(n_layer=3, **kw))).eval()
    x = torch.randint(0, 97, (1, 12))
    im = InferenceModel(m, torch.float32, 64)
    with torch.no_grad():
        torch.testing.assert_close(im.logits(im.forward(x[0], torch.arange(12), causal_attend)), m(x)[0],
                                   rtol=1e-5, atol=1e-5)
    prompts = [torch.randint(0, 97, (n,)).tolist() for n in (1, 5, 9)]
    out = Engine(m, EngineConfig(slots=2, max_len=32)).generate(
        [Request(p, SamplingConfig(max_new_tokens=10, temperature=0.0)) for p in prompts])
    for p, [sample] in zip(prompts, out):
        ids = list(p)
        with torch.no_grad():  # greedy by recomputing the whole sequence with GPT.forward
            for _ in range(10):
                ids.append(int(m(torch.tensor([ids]))[0, -1].argmax()))
        assert sample.token_ids == ids[len(p):]


def test_a_pipeline_of_several_stages_refuses_the_skips_before_step_0():
    for kw, named in ((dict(x0_mix=True), "model.x0_mix"), (dict(unet_skips=True), "model.unet_skips")):
        with pytest.raises(ConfigError, match=f"--pp 2 with {named}"):
            Parallel(build_model(small(**kw)), World(size=2, pp=2), "ddp")
        with pytest.raises(ConfigError, match=f"--pp 2 with {named}"):
            PretrainConfig(model=small(**kw), train=TrainConfig(pp=2, max_steps=1), data=DataConfig(seq_len=64))
    PretrainConfig(model=small(x0_mix=True, unet_skips=True), train=TrainConfig(max_steps=1),
                   data=DataConfig(seq_len=64))  # one process, or data parallel: fine


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_the_scalars_take_adamw_without_weight_decay(name):
    m = build_model(small(n_layer=3, x0_mix=True, unet_skips=True))
    scalars = {"x_scale": m.x_scale, "x0_scale": m.x0_scale, "unet_scale": m.unet_scale}
    assert not hidden_matrix_names(m) & scalars.keys()
    opt = build_optimizer(m, OptimConfig(name=name, weight_decay=0.1), torch.device("cpu"))
    adamw = opt if name == "adamw" else opt.adamw
    group = {id(p): g for g in adamw.param_groups for p in g["params"]}
    assert all(group[id(p)]["weight_decay"] == 0.0 for p in scalars.values())


class OneBatch:
    """The same micro-batch at every step (a loader stand-in)."""

    def __init__(self, batch):
        self.batch, self.i = batch, 0

    def next_batch(self):
        self.i += 1
        return self.batch

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, s):
        self.i = s["i"]


def test_training_with_skips_lowers_the_loss_moves_the_scalars_and_its_checkpoint_keeps_them(tmp_path):
    torch.manual_seed(8)
    cfg = preset("tiny", vocab_size=97, x0_mix=True, unet_skips=True)
    model = build_model(cfg)
    before = {n: getattr(model, n).detach().clone() for n in ("x_scale", "x0_scale", "unet_scale")}
    x = torch.randint(0, 97, (4, 33))
    t = Trainer(model, train=TrainConfig(max_steps=8, log_every=1, eval_every=100),
                optim=OptimConfig(lr=1e-2, warmup_steps=1), batches=OneBatch((x[:, :-1], x[:, 1:])),
                run=RunConfig(out=str(tmp_path)), out_dir=tmp_path, meta={"model": to_dict(cfg)}, show_progress=False)
    t.fit()
    losses = [r["loss"] for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert len(losses) == 8 and losses[-1] < 0.9 * losses[0]
    saved = ckpt.load(tmp_path)
    back = build_model(build(ModelConfig, saved["state"]["meta"]["model"]))
    back.load_state_dict(saved["model"])
    for n, p in before.items():
        assert not torch.equal(getattr(model, n), p), n  # trained
        assert torch.equal(getattr(back, n), getattr(model, n)), n  # and kept


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_planner_counts_what_the_skips_keep_for_the_backward(compiled):
    """Bytes the skips add to what a step saves for its backward (bf16 autocast on fp32 weights, counted per
    storage by conftest.saved_for_backward, as tests/test_plan.py counts them) equal :func:`codechat.train.plan.skip_bytes` eager, and stay
    under it compiled."""
    from codechat.train.plan import skip_bytes
    B, T = 2, 16

    def saved(cfg):
        torch.manual_seed(0)
        model = build_model(cfg)
        step = torch.compile(model) if compiled else model
        x = torch.randint(0, 97, (B, T))
        saved_for_backward(model, step, x, x)  # the first call compiles
        return saved_for_backward(model, step, x, x)

    cases = [(3, SKIPS[2]), (4, SKIPS[1])] if compiled else [(n, kw) for n in (3, 4) for kw in SKIPS]
    for n, kw in cases:
        cfg = small(n_layer=n, **kw)
        added = saved(cfg) - saved(small(n_layer=n))
        assert (0 <= added <= B * T * skip_bytes(cfg, 4)) if compiled else added == B * T * skip_bytes(cfg, 4), (n, kw)
