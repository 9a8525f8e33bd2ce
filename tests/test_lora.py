"""LoRA (``--peft lora``) on CPU: only the adapters train, merged and PEFT exports compute what the adapted
model computes, resume is exact, the engine samples from the current adapters, and bad settings are
one-line errors before step 0. (Two ranks: tests/test_lora_parallel.py.)

The base is a tiny random model whose norms are moved away from 1 (a norm lost in an export then shows in
the logits); the adapters are trained by ``codechat sft`` on a few conversations, so ``B`` is far from its
zero init and the adapted logits far from the base's.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from codechat import checkpoint as ckpt
from codechat.cli import main
from codechat.config.lora import LoraConfig
from codechat.config.sft import SFTStageConfig
from codechat.config.stages import ConfigError, ModelConfig, OptimConfig, RunConfig, TrainConfig, load, to_dict
from codechat.data.batch import Batch
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.model import build_model
from codechat.peft.lora import LoRALinear, apply_lora, base_forward, merge_lora
from codechat.train.sft import run_sft
from codechat.train.trainer import Trainer

RANK, ALPHA = 4, 8.0
CODE = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n"


def save_base(out: Path, tok, tok_dir: Path, seed: int = 0, **shape) -> Path:
    """A tiny random model (norm scales moved off 1) saved as the stage directory ``out``."""
    torch.manual_seed(seed)
    model = build_model(ModelConfig(**{**dict(vocab_size=tok.vocab_size, n_layer=2, n_embd=64, n_head=4, n_kv_head=2,
                                              max_seq_len=128), **shape}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    ckpt.save(out / "checkpoints", 0, model=model.state_dict(),
              state={"step": 0, "meta": {"stage": "pretrain", "model": to_dict(model.cfg)}}, tokenizer_dir=tok_dir)
    return out


@pytest.fixture(scope="module")
def base(tok, tok_dir, tmp_path_factory) -> Path:
    return save_base(tmp_path_factory.mktemp("lora") / "base", tok, tok_dir)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lora_data") / "chat.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Write f{i}."},
                                                     {"role": "assistant", "content": f"def f{i}():\n    return {i}"}]})
                            + "\n" for i in range(40)))
    return path


def sft_config(base: Path, data: Path, out: Path, **over: object) -> SFTStageConfig:
    settings = {"init": str(base), "sft.data": str(data), "sft.decontaminate": False, "sft.max_length": 64,
                "run.out": str(out), "run.device": "cpu", "train.max_steps": 6, "train.epochs": 0,
                "train.micro_batch_size": 4, "train.log_every": 1, "optim.lr": 1e-2, "optim.warmup_steps": 0,
                "optim.schedule": "constant", "peft": "lora", "lora.rank": RANK, "lora.alpha": ALPHA, **over}
    return load(SFTStageConfig, None, settings)


@pytest.fixture(scope="module")
def adapted(base, data, tmp_path_factory) -> Path:
    """The stage directory of ``codechat sft --peft lora`` on ``base`` (6 steps)."""
    out = tmp_path_factory.mktemp("lora_sft") / "sft"
    run_sft(sft_config(base, data, out), show_progress=False)
    return out


def ids(tok) -> torch.Tensor:
    return torch.tensor([tok.encode(CODE)[:48]])


def losses(out: Path) -> list[float]:
    return [json.loads(ln)["loss"] for ln in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in ln]


def cli(capsys, *args: str) -> tuple[int, str]:
    rc = main(list(args))
    return rc, capsys.readouterr().err


# ----------------------------------------------------------------------------- training
def test_lora_trains_only_the_adapters_and_the_base_stays_bit_identical(base):
    model, _, state = ckpt.load_model(base)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, model.cfg.vocab_size, (2, 32), generator=g), torch.randint(0, 64, (2, 32), generator=g)

    class Same:
        def next_batch(self):
            return Batch(x, y)

        def state_dict(self):
            return {}

    out = base.parent / "trainer"
    trainer = Trainer(model.train(), train=TrainConfig(max_steps=10, micro_batch_size=2, log_every=1),
                      optim=OptimConfig(lr=1e-2, warmup_steps=0, schedule="constant"),
                      run=RunConfig(out=str(out), device="cpu"),
                      batches=Same(), out_dir=out, meta={"init": str(base), "model": state["meta"]["model"]},
                      show_progress=False, lora=LoraConfig(rank=RANK, alpha=ALPHA))
    trainer.fit()
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # every base tensor, bit for bit
    adapters = {k: v for k, v in after.items() if k not in before}
    c = model.cfg  # r (in + out) per projection: q, k, v, o, gate, up, down in each of 2 blocks
    shapes = [(c.n_embd, c.n_head * c.head_dim), *[(c.n_embd, c.n_kv_head * c.head_dim)] * 2,
              (c.n_head * c.head_dim, c.n_embd), *[(c.n_embd, c.intermediate_size)] * 2, (c.intermediate_size, c.n_embd)]
    assert sum(v.numel() for v in adapters.values()) == c.n_layer * RANK * sum(i + o for i, o in shapes)
    trained = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert sum(p.numel() for p in trained) == sum(v.numel() for v in adapters.values())
    assert all(v.abs().max() > 0 for k, v in adapters.items() if "lora_B" in k)  # B left its zero init
    assert losses(out)[-1] < losses(out)[0] - 0.3  # it learned the batch
    saved = torch.load(ckpt.resolve(out) / "model.pt")
    assert set(saved) == set(adapters)  # the checkpoint holds the adapters only


def test_sft_with_lora_names_its_base_and_learns(adapted, base):
    state = json.loads((ckpt.resolve(adapted) / "state.json").read_text())
    peft = state["meta"]["peft"]
    assert peft["base"] == str(ckpt.resolve(base).resolve()) and peft["lora"]["rank"] == RANK
    rows = [json.loads(ln) for ln in (adapted / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    assert len(evals) == 2 and evals[1] < evals[0] - 0.5


def test_resume_with_lora_continues_exactly(base, data, tmp_path):
    # adapter dropout draws from the RNG: the resumed run must restore it to give the same numbers
    straight = sft_config(base, data, tmp_path / "straight", **{"lora.dropout": 0.1})
    run_sft(straight, show_progress=False)
    run_sft(sft_config(base, data, tmp_path / "cut", **{"lora.dropout": 0.1, "train.max_steps": 3}), show_progress=False)
    run_sft(sft_config(base, data, tmp_path / "cut", **{"lora.dropout": 0.1, "run.resume": True}), show_progress=False)
    assert len(losses(tmp_path / "straight")) == 6
    assert losses(tmp_path / "cut") == losses(tmp_path / "straight")
    a = torch.load(ckpt.resolve(tmp_path / "straight") / "model.pt")
    b = torch.load(ckpt.resolve(tmp_path / "cut") / "model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    oa = torch.load(ckpt.resolve(tmp_path / "straight") / "optim.pt")["state"]
    ob = torch.load(ckpt.resolve(tmp_path / "cut") / "optim.pt")["state"]
    assert all(torch.equal(oa[i]["exp_avg_sq"], ob[i]["exp_avg_sq"]) for i in oa)
    with pytest.raises(ckpt.CheckpointError, match=r"meta.peft .* does not match this run's"):  # other adapters
        run_sft(sft_config(base, data, tmp_path / "cut", **{"lora.rank": 2, "train.max_steps": 8, "run.resume": True}),
                show_progress=False)


# ----------------------------------------------------------------------------- loading and exports
def adapted_logits(adapted: Path, tok) -> torch.Tensor:
    """Logits of the adapted model computed unmerged: the base with LoRALinear layers holding the adapters."""
    peft = json.loads((ckpt.resolve(adapted) / "state.json").read_text())["meta"]["peft"]
    model = ckpt.load_model(peft["base"])[0]
    apply_lora(model, LoraConfig(rank=RANK, alpha=ALPHA))
    model.load_state_dict(torch.load(ckpt.resolve(adapted) / "model.pt"), strict=False)
    with torch.no_grad():
        return model.eval()(ids(tok))


def test_every_command_loads_a_lora_checkpoint_and_merged_exports_equal_the_adapter_forward(adapted, base, tok,
                                                                                            tmp_path, capsys):
    ours = adapted_logits(adapted, tok)
    with torch.no_grad():
        base_logits = ckpt.load_model(base)[0](ids(tok))
        loaded = ckpt.load_model(adapted)[0](ids(tok))  # what chat, sample, eval, serve, funcall load
    assert (ours - base_logits).abs().max() > 0.1  # the adapters matter
    assert torch.allclose(loaded, ours, atol=1e-5, rtol=0)
    assert cli(capsys, "export", "--model", str(adapted), "--out", str(tmp_path / "merged"), "--merge")[0] == 0
    merged, _, state = ckpt.load_model(tmp_path / "merged")
    assert "peft" not in state["meta"] and not any("lora" in k for k in merged.state_dict())
    with torch.no_grad():
        assert torch.allclose(merged(ids(tok)), ours, atol=1e-5, rtol=0)
    assert cli(capsys, "export", "--model", str(adapted), "--out", str(tmp_path / "adapters"))[0] == 0
    with torch.no_grad():  # an export without --merge keeps the adapters, naming the base
        assert torch.allclose(ckpt.load_model(tmp_path / "adapters")[0](ids(tok)), ours, atol=1e-5, rtol=0)
    rc, err = cli(capsys, "sample", "--model", str(adapted), "--prompt", "def", "--max-new-tokens", "4",
                  "--device", "cpu")
    assert rc == 0, err


def test_peft_loads_the_adapters_onto_the_hf_export_of_the_base_with_equal_logits(adapted, base, tok, tmp_path,
                                                                                  capsys):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM
    assert cli(capsys, "export", "--model", str(base), "--out", str(tmp_path / "hf"), "--format", "hf",
               "--dtype", "fp32")[0] == 0
    assert cli(capsys, "export", "--model", str(adapted), "--out", str(tmp_path / "peft"), "--format", "peft")[0] == 0
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["r"] == RANK and config["lora_alpha"] == ALPHA
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"}
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        hf_base = hf(ids(tok)).logits
        model = peft.PeftModel.from_pretrained(hf, tmp_path / "peft").eval()
        theirs = model(ids(tok)).logits
    ours = adapted_logits(adapted, tok)
    assert (theirs - hf_base).abs().max() > 0.1  # PEFT applied the adapters (a key it did not match stays zero)
    assert torch.allclose(theirs, ours, atol=1e-4, rtol=0)
    rc, err = cli(capsys, "export", "--model", str(adapted), "--out", str(tmp_path / "hf2"), "--format", "hf",
                  "--merge", "--dtype", "fp32")
    assert rc == 0, err
    with torch.no_grad():
        merged_hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf2").eval()(ids(tok)).logits
    assert torch.allclose(merged_hf, ours, atol=1e-4, rtol=0)


def test_rollouts_see_the_current_adapters_and_the_kl_reference_is_the_base(base, tok):
    model = ckpt.load_model(base)[0]
    apply_lora(model, LoraConfig(rank=RANK, alpha=ALPHA))
    prompt = tok.encode(CODE)[:16]
    greedy = [Request(prompt, SamplingConfig(max_new_tokens=12, temperature=0.0))]
    engine = Engine(model, EngineConfig(slots=1))
    before = engine.generate(greedy)[0][0].token_ids
    with torch.no_grad():  # an "update": the adapters move
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.weight.normal_(0.0, 0.5)
        adapted = model(ids(tok))
        ref = base_forward(model)(ids(tok))
        assert torch.equal(ref, ckpt.load_model(base)[0](ids(tok)))  # adapters off: the base, exactly
        assert (adapted - ref).abs().max() > 0.1
    engine.load_weights(model)  # what the RL loop does before every step's rollouts
    after = engine.generate(greedy)[0][0].token_ids
    merged = Engine(merge_lora(model), EngineConfig(slots=1)).generate(greedy)[0][0].token_ids
    assert after == merged and after != before


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("setting, fragment", [
    (["--lora.rank", "0"], "lora.rank must be > 0, got 0"),
    (["--lora.targets", "q,qq"], "lora.targets: unknown 'qq'"),
    (["--lora.rank", "65"], "lora.rank=65 is larger than layers.0.self_attn.q_proj (64x64) allows"),
    (["--optim.name", "muon"], "--peft lora trains its adapters with AdamW"),
    (["--lora.dropout", "1"], "lora.dropout must be in [0, 1)"),
])
def test_bad_lora_settings_are_one_line_errors_before_step_0(base, data, tmp_path, capsys, setting, fragment):
    rc, err = cli(capsys, "sft", "--init", str(base), "--data", str(data), "--out", str(tmp_path / "sft"),
                  "--device", "cpu", "--max-steps", "2", "--sft.decontaminate", "false", "--peft", "lora", *setting)
    assert rc == 2 and fragment in err and err.strip().count("\n") == 0, err
    assert not (tmp_path / "sft" / "checkpoints").exists()


def test_a_target_no_layer_has_and_lora_without_a_base_are_refused():
    relu2 = build_model(ModelConfig(vocab_size=64, n_layer=1, n_embd=32, n_head=2, n_kv_head=2, mlp_act="relu2"))
    with pytest.raises(ConfigError, match=r"lora.targets: 'gate' \(mlp.gate_proj\) matches no layer"):
        apply_lora(relu2, LoraConfig(targets=("q", "gate")))
    assert not any(isinstance(m, LoRALinear) for m in relu2.modules())  # refused before anything changed
    with pytest.raises(ConfigError, match="--peft lora adapts a trained model: give --init"):
        load(__import__("codechat.config.stages", fromlist=["PretrainConfig"]).PretrainConfig, None,
             {"peft": "lora", "optim.name": "adamw"})


def test_adapters_on_another_base_and_merge_without_adapters_are_one_line_errors(adapted, base, tok, tok_dir,
                                                                                 tmp_path, capsys):
    def moved(to: Path) -> Path:
        copy = tmp_path / f"on-{to.name}"
        shutil.copytree(ckpt.resolve(adapted), copy)
        state = json.loads((copy / "state.json").read_text())
        state["meta"]["peft"]["base"] = str(ckpt.resolve(to))
        (copy / "state.json").write_text(json.dumps(state))
        return copy

    wider = moved(save_base(tmp_path / "wider", tok, tok_dir, n_embd=96))
    rc, err = cli(capsys, "sample", "--model", str(wider), "--prompt", "x", "--device", "cpu")
    assert rc == 2 and "trained on a base of another shape" in err and err.strip().count("\n") == 0, err
    other = moved(save_base(tmp_path / "other", tok, tok_dir, seed=1))
    with pytest.raises(ConfigError, match="holds other weights than the adapters were trained on"):
        ckpt.load_model(other)
    rc, err = cli(capsys, "export", "--model", str(base), "--out", str(tmp_path / "m"), "--merge")
    assert rc == 2 and "has no LoRA adapters" in err and err.strip().count("\n") == 0, err
    rc, err = cli(capsys, "export", "--model", str(adapted), "--out", str(tmp_path / "h"), "--format", "hf")
    assert rc == 2 and "holds LoRA adapters, not whole weights" in err, err
    rc, err = cli(capsys, "export", "--model", str(base), "--out", str(tmp_path / "p"), "--format", "peft")
    assert rc == 2 and "has no LoRA adapters" in err, err
    assert not any((tmp_path / d).exists() for d in ("m", "h", "p"))
