"""``train.fp8``: FP8 training of the blocks' linears through torchao (codechat.train.fp8).

A CPU has no FP8 tensor cores, so the option is refused there before step 0; the conversion itself
is tested on the CPU, where torch emulates the FP8 matmul (``torch._scaled_mm``): exactly the block
linears are swapped, the weights and checkpoint keys stay, and the loss and gradients follow bf16's.
The speed and the loss over 300 real steps are GPU measurements (benchmarks/RESULTS.md).
"""
from __future__ import annotations

import sys

import pytest
import torch

from codechat.cli import main
from codechat.config.stages import ConfigError, ModelConfig, TrainConfig
from codechat.model import build_model
from codechat.train.fp8 import check_fp8, convert_to_fp8

BLOCK_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj")


def test_fp8_is_refused_before_step_0_where_it_cannot_run(tok_dir, corpus_dir, tmp_path, capsys, monkeypatch):
    base = ["pretrain", "--preset", "tiny", "--max-steps", "2", "--data", str(corpus_dir), "--tokenizer", str(tok_dir),
            "--device", "cpu"]
    for extra, message in (
            (["--train.fp8", "tensorwise"], "train.fp8=tensorwise needs a CUDA GPU with FP8 tensor cores (compute "
                                            "capability >= 8.9: Ada, Hopper or newer); this run is on cpu: use "
                                            "--train.fp8 none"),
            (["--train.fp8", "fp4"], "train.fp8 must be one of none, tensorwise, rowwise, got 'fp4'"),
            (["--train.fp8", "rowwise", "--train.dtype", "fp32"], "FP8 matmuls run inside bf16 autocast")):
        out = tmp_path / extra[1]
        assert main([*base, "--out", str(out), *extra]) == 2
        assert message in capsys.readouterr().err
        assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()
    # a GPU without FP8 tensor cores, and a GPU that has them but no torchao
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ConfigError, match=r"NVIDIA A100-SXM4-80GB is 8\.0: use --train.fp8 none"):
        check_fp8("tensorwise", torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    with pytest.raises(ConfigError, match=r"train.fp8 needs torchao .*pip install 'codechat\[fp8\]'"):
        check_fp8("rowwise", torch.device("cuda"))
    check_fp8("none", torch.device("cpu"))  # bf16, as without the option
    assert TrainConfig(max_steps=1).fp8 == "none"


def _loss_and_grads(model, x, y):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x, y, reduction="mean")
    loss.backward()
    return float(loss.detach()), {n: p.grad.float().flatten() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_convert_swaps_the_block_linears_only_and_trains_like_bf16(recipe):
    pytest.importorskip("torchao.float8", reason="torchao (the fp8 extra, in the test extra) is not installed")
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=512, n_layer=2, n_embd=64, n_head=2, n_kv_head=2, max_seq_len=64)
    plain, fp8 = build_model(cfg, "cpu"), build_model(cfg, "cpu")
    fp8.load_state_dict(plain.state_dict())
    names = convert_to_fp8(fp8, recipe)
    assert names == [f"layers.{i}.{n}" for i in range(2) for n in BLOCK_LINEARS]
    kinds = {n: type(m).__name__ for n, m in fp8.named_modules()}
    assert {kinds[n] for n in names} == {"Float8Linear"} and kinds["lm_head"] == "Linear"
    assert kinds["embed_tokens"] == "Embedding"
    # the same parameters by the same names: optimizers and checkpoints see the model as before
    assert list(fp8.state_dict()) == list(plain.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(fp8.state_dict().values(), plain.state_dict().values()))
    x = torch.randint(0, 512, (4, 32))
    y = torch.roll(x, -1, 1)
    (l_plain, g_plain), (l_fp8, g_fp8) = _loss_and_grads(plain, x, y), _loss_and_grads(fp8, x, y)
    assert l_fp8 != l_plain and l_fp8 == pytest.approx(l_plain, rel=0.01)  # e4m3: ~2 significant digits
    for n in (f"layers.0.{b}.weight" for b in BLOCK_LINEARS):
        assert torch.cosine_similarity(g_fp8[n], g_plain[n], dim=0) > 0.98, n
    # a layer FP8 GEMMs cannot take (features not a multiple of 16) stays bf16
    odd = build_model(ModelConfig(vocab_size=512, n_layer=1, n_embd=64, n_head=2, n_kv_head=2, max_seq_len=64,
                                  intermediate_size=100), "cpu")
    assert convert_to_fp8(odd, recipe) == [f"layers.0.{n}" for n in BLOCK_LINEARS[:4]]
    with pytest.raises(ConfigError, match="recipe must be one of tensorwise, rowwise"):
        convert_to_fp8(odd, "none")


def test_the_planner_counts_the_float8_casts_of_a_block():
    from codechat.config.stages import OptimConfig, pretrain_recipe
    from codechat.train.plan import estimate, format_plan, param_counts, plan_config
    recipe = pretrain_recipe("d20")
    bf16, fp8 = (plan_config(recipe.model, TrainConfig(max_steps=1, micro_batch_size=16, fp8=f), OptimConfig(), 2048)
                 for f in ("none", "tensorwise"))
    assert (bf16.fp8, fp8.fp8) == (False, True)
    block = sum(r * c for r, c in param_counts(recipe.model).block_matrices)  # one byte each
    assert estimate(fp8).buffers - estimate(bf16).buffers == block
    assert estimate(fp8).activations == estimate(bf16).activations  # torchao keeps the bf16 inputs
    assert "compute bf16 (block matmuls fp8)" in format_plan(fp8) and "fp8" not in format_plan(bf16).splitlines()[1]


def test_the_lm_head_goes_fp8_only_when_asked_and_only_untied():
    pytest.importorskip("torchao.float8", reason="torchao (the fp8 extra, in the test extra) is not installed")
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=512, n_layer=1, n_embd=64, n_head=2, n_kv_head=2, max_seq_len=64, logit_softcap=15.0)
    plain, fp8 = build_model(cfg, "cpu"), build_model(cfg, "cpu")
    fp8.load_state_dict(plain.state_dict())
    names = convert_to_fp8(fp8, "tensorwise", head=True)
    assert names[-1] == "lm_head" and type(fp8.lm_head).__name__ == "Float8Linear" and fp8.fp8_head
    assert list(fp8.state_dict()) == list(plain.state_dict())
    x = torch.randint(0, 512, (4, 32))
    y = torch.roll(x, -1, 1)
    (l_plain, g_plain), (l_fp8, g_fp8) = _loss_and_grads(plain, x, y), _loss_and_grads(fp8, x, y)
    assert l_fp8 != l_plain and l_fp8 == pytest.approx(l_plain, rel=0.01)
    assert torch.cosine_similarity(g_fp8["lm_head.weight"], g_plain["lm_head.weight"], dim=0) > 0.98
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # soft-capped fp32 logits, as the plain head's
        logits = fp8(x)
    assert logits.dtype == torch.float32 and float(logits.abs().max()) < 15.0
    tied = build_model(ModelConfig(vocab_size=512, n_layer=1, n_embd=64, n_head=2, n_kv_head=2, max_seq_len=64,
                                   tie_embeddings=True), "cpu")
    with pytest.raises(ConfigError, match="train.fp8_head with model.tie_embeddings"):
        convert_to_fp8(tied, "tensorwise", head=True)
    assert not tied.fp8_head
    with pytest.raises(ConfigError, match="train.fp8_head needs train.fp8 tensorwise or rowwise"):
        TrainConfig(max_steps=1, fp8_head=True)
    with pytest.raises(ConfigError, match="a pipeline's last stage computes the head"):
        TrainConfig(max_steps=1, fp8="tensorwise", fp8_head=True, pp=2)
