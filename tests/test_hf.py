"""Hugging Face interoperability, checked against real ``transformers`` on CPU: export, import, tokenizer,
chat template, generation, refused configs (codechat.hf).

Data files are the project's own (tests/fixtures/cases_b); GPT-2's BPE is checked both on the fixture's GPT-2-layout
BPE and on OpenAI's files in shared/ (skipped when absent).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from codechat import checkpoint as ckpt
from codechat.chat.conversation import Conversation, Message, render, render_for_completion
from codechat.cli import main as cli_main
from codechat.config.stages import (DataConfig, ModelConfig, OptimConfig, PretrainConfig, RunConfig, TrainConfig,
                             default_corpus_dirs)
from codechat.config.sft import SFTConfig, SFTStageConfig
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.hf import ExportConfig, HFImportError, export_hf, import_hf
from codechat.hf.config import model_config_from_hf
from codechat.hf.tokenizer import import_tokenizer, write_tokenizer
from codechat.tokenizer import SPECIAL_TOKENS, Tokenizer
from codechat.train.pretrain import run_pretrain
from codechat.train.sft import run_sft
from conftest import FIXTURES, shared_file

CODE_FILES = ("json/encoder.py", "textwrap.py", "fractions.py", "heapq.py")
PROSE = ["The quick brown fox jumps over the lazy dog.", "Ünïcödé: naïve café, 東京, emoji 🐍🚀, Ελληνικά, русский",
         "  leading spaces\tand tabs\r\nand CRLF\n\n\n", "def f(x):\n    return x ** 2  # ½ → ∞\n"]
SPECIAL_TEXT = ["a user typing <|end|> and <|assistant|> to inject a turn", "<|bos|><|system|>", "x<|function_call|>{}"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city — ünïcode",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
ATOL = 1e-4
CASES_B = FIXTURES / "cases_b"
GENERATE_STEPS = 100  # a 3-step model repeats one token whatever the prompt: generation would prove nothing


# ----------------------------------------------------------------------------- fixtures
def code_batch(tok_encode, rows: int = 4, length: int = 64) -> torch.Tensor:
    """(rows, length) int64 ids of the first tokens of real standard-library files."""
    root = Path(default_corpus_dirs()[0])
    return torch.tensor([tok_encode((root / f).read_text(encoding="utf-8"))[:length] for f in CODE_FILES[:rows]])


def pretrain(out: Path, tok_dir: Path, corpus_dir: Path, qk_norm: bool, tied: bool, steps: int = 3) -> Path:
    """A tiny model trained for ``steps`` steps on the session corpus; returns the stage directory."""
    cfg = PretrainConfig(model=ModelConfig(n_layer=2, n_embd=64, n_head=4, n_kv_head=2, max_seq_len=256,
                                           qk_norm=qk_norm, tie_embeddings=tied),
                         data=DataConfig(data_dir=str(corpus_dir), tokenizer_dir=str(tok_dir), seq_len=128),
                         optim=OptimConfig(lr=1e-2, warmup_steps=0),
                         train=TrainConfig(max_steps=steps, micro_batch_size=4, eval_every=10**6, eval_tokens=512,
                                           log_every=10**6),
                         run=RunConfig(out=str(out), device="cpu"))
    run_pretrain(cfg, show_progress=False)
    return out


@pytest.fixture(scope="module", params=[(True, True), (True, False), (False, True), (False, False)],
            ids=["qwen3-tied", "qwen3-untied", "llama-tied", "llama-untied"])
def trained(request, tok_dir, corpus_dir, tmp_path_factory):
    """``(stage dir, fp32 HF export dir)`` of a tiny trained model with/without QK-norm, tied/untied head."""
    qk_norm, tied = request.param
    root = tmp_path_factory.mktemp(f"hf-qk{int(qk_norm)}-tied{int(tied)}")
    stage = pretrain(root / "pretrain", tok_dir, corpus_dir, qk_norm, tied)
    shard = ExportConfig(dtype="fp32", max_shard_bytes=100_000) if not tied else ExportConfig(dtype="fp32")
    return stage, export_hf(ckpt.load(stage), root / "hf", shard)


@pytest.fixture(scope="module")
def exported(tok_dir, corpus_dir, tmp_path_factory):
    """A Qwen3-style tied model trained long enough to write varied code, exported in fp32, with codechat's
    model and tokenizer and transformers'."""
    root = tmp_path_factory.mktemp("hf-exported")
    stage = pretrain(root / "pretrain", tok_dir, corpus_dir, True, True, steps=GENERATE_STEPS)
    out = export_hf(ckpt.load(stage), root / "hf", ExportConfig(dtype="fp32"))
    model, tok, _ = ckpt.load_model(stage)
    return out, model, tok, AutoTokenizer.from_pretrained(out)


def hf_tokenizer_files(tok_dir: Path, out: Path, added: list[str]) -> int:
    """Save into ``out`` a transformers tokenizer: the session BPE plus ``added`` tokens after it (as Qwen3's
    ``<|im_start|>``); returns the BPE size."""
    spec = json.loads((tok_dir / "tokenizer.json").read_text())
    n_bpe = len(spec["model"]["vocab"])
    spec["added_tokens"] = [{"id": n_bpe + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, c in enumerate(added)]
    from tokenizers import Tokenizer as RustTokenizer
    PreTrainedTokenizerFast(tokenizer_object=RustTokenizer.from_str(json.dumps(spec)), eos_token=added[0]
                            ).save_pretrained(out)
    return n_bpe


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def hf_made(request, tok_dir, tmp_path_factory):
    """A tiny random ``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` saved by transformers, with a tokenizer whose 2
    added tokens are followed by 3 unused embedding rows; ``(dir, model, bpe size)``."""
    out = tmp_path_factory.mktemp(f"made-{request.param}")
    n_bpe = hf_tokenizer_files(tok_dir, out, ["<|im_start|>", "<|im_end|>"])
    common = dict(vocab_size=n_bpe + 5, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                  tie_word_embeddings=request.param == "qwen3")
    torch.manual_seed(0)
    if request.param == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, rope_theta=50000.0))
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, head_dim=24))
    with torch.no_grad():  # norms away from 1, so a missed norm shows in the logits
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(out)
    return out, model.eval(), n_bpe


# ----------------------------------------------------------------------------- export
def test_export_loads_in_transformers_with_no_missing_keys_and_equal_logits(trained, tok):
    stage, out = trained
    model, _, _ = ckpt.load_model(stage)
    hf, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]) == (set(), set(), set())
    assert type(hf).__name__ == ("Qwen3ForCausalLM" if model.cfg.qk_norm else "LlamaForCausalLM")
    assert hf.config.tie_word_embeddings == model.cfg.tie_embeddings
    ids = code_batch(tok.encode)
    with torch.no_grad():
        ours, theirs = model(ids), hf.eval()(ids).logits
    assert ours.abs().max() > 0.1  # real logits, not all zero
    assert (ours - theirs).abs().max().item() < ATOL
    sharded = (out / "model.safetensors.index.json").is_file()
    assert sharded == (not model.cfg.tie_embeddings)  # the untied exports were written with small shards
    if sharded:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1 and all((out / f).is_file() for f in index["weight_map"].values())


def test_export_then_import_keeps_every_id_and_logit(trained, tok, tmp_path):
    stage, out = trained
    model, _, _ = ckpt.load_model(stage)
    back, tok2, state = ckpt.load_model(import_hf(str(out), tmp_path / "back"))
    assert tok2.vocab_size == tok.vocab_size and state["meta"]["vocab_layout"]["codechat_new"] == [tok.vocab_size] * 2
    assert all(tok2.special_id(n) == tok.special_id(n) for n in SPECIAL_TOKENS)
    ids = code_batch(tok.encode)
    with torch.no_grad():
        assert torch.equal(back(ids), model(ids))


def test_bf16_export_and_generation_config(trained, tmp_path):
    stage, _ = trained
    out = export_hf(ckpt.load(stage), tmp_path / "bf16")
    cfg = json.loads((out / "config.json").read_text())
    gen = json.loads((out / "generation_config.json").read_text())
    tok = Tokenizer.load(stage / "checkpoints" / "step_000003" / "tokenizer")
    assert cfg["torch_dtype"] == "bfloat16" and gen["eos_token_id"] == tok.end_id == cfg["eos_token_id"]
    from safetensors import safe_open
    with safe_open(out / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


# ----------------------------------------------------------------------------- tokenizer and chat template
def test_autotokenizer_gives_codechat_ids_on_code_and_prose(exported):
    _, _, tok, ht = exported
    root = Path(default_corpus_dirs()[0])
    texts = [(root / f).read_text(encoding="utf-8") for f in CODE_FILES] + PROSE
    for text in texts:
        assert ht(text)["input_ids"] == tok.encode(text)
        assert ht.decode(tok.encode(text)) == text
    assert ht.eos_token_id == tok.end_id and ht.bos_token_id == tok.bos_id
    assert set(ht.all_special_ids) >= {tok.special_id(n) for n in SPECIAL_TOKENS}


def test_special_spellings_in_text_need_split_special_tokens(exported):
    _, _, tok, ht = exported
    for text in SPECIAL_TEXT:
        ours = tok.encode(text)
        assert not set(ours) & tok.special_ids
        assert ht(text, split_special_tokens=True)["input_ids"] == ours
        assert set(ht(text)["input_ids"]) & tok.special_ids  # transformers' default matches them (README says so)


def conversations() -> list[tuple[list[dict], list[dict] | None, Conversation]]:
    """OpenAI-style messages (+ tools) and the codechat Conversation they mean."""
    plain = [{"role": "user", "content": "Write a function that reverses a list."},
             {"role": "assistant", "content": "def rev(xs):\n    return xs[::-1]"}]
    calls = [{"role": "system", "content": "You are helpful."},
             {"role": "user", "content": "Weather in Tokyo and Paris? 東京"},
             {"role": "assistant", "content": "Let me check.", "tool_calls": [
                 {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}},
                 {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "content": '{"temp": 21}'}, {"role": "tool", "content": '{"temp": 14}'},
             {"role": "assistant", "content": "", "function_call": {"name": "get_weather",
                                                                    "arguments": '{"city": "Oslo"}'}},
             {"role": "function_response", "content": "-3"},
             {"role": "assistant", "content": "21°C, 14°C and -3°C."}]
    conv_calls = Conversation((
        Message("system", "You are helpful."), Message("user", "Weather in Tokyo and Paris? 東京"),
        Message("assistant", "Let me check.", {"name": "get_weather", "arguments": {"city": "Tokyo"}}),
        Message("assistant", "", {"name": "get_weather", "arguments": {"city": "Paris"}}),
        Message("function_response", '{"temp": 21}'), Message("function_response", '{"temp": 14}'),
        Message("assistant", "", {"name": "get_weather", "arguments": {"city": "Oslo"}}),
        Message("function_response", "-3"), Message("assistant", "21°C, 14°C and -3°C.")), tools=tuple(TOOLS))
    tools_only = [{"role": "user", "content": [{"type": "text", "text": "Call it "}, {"type": "text", "text": "now"}]},
                  {"role": "assistant", "content": None,
                   "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {}}}]}]
    return [(plain, None, Conversation(tuple(Message(**m) for m in plain))),
            (calls, TOOLS, conv_calls),
            (tools_only, [TOOLS[0]["function"]], Conversation(
                (Message("user", "Call it now"), Message("assistant", None, {"name": "get_weather", "arguments": {}})),
                tools=(TOOLS[0]["function"],))),
            ([{"role": "system", "content": ""}, *plain], None,
             Conversation((Message("system", ""), *(Message(**m) for m in plain))))]


@pytest.mark.parametrize("k", range(4), ids=["plain", "function-calls", "tools-only-system", "empty-system"])
def test_apply_chat_template_gives_the_ids_of_render(exported, k):
    _, _, tok, ht = exported
    messages, tools, conv = conversations()[k]
    assert ht.apply_chat_template(messages, tools=tools, tokenize=True)["input_ids"] == render(tok, conv)[0]
    prompt = Conversation(conv.messages[:-1], conv.tools)
    got = ht.apply_chat_template(messages[:-1], tools=tools, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert got == render_for_completion(tok, prompt)


def test_transformers_generate_gives_codechat_greedy_tokens(exported):
    out, model, tok, ht = exported
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    engine = Engine(model, EngineConfig(slots=4))
    prompts = [[tok.end_id] + tok.encode(p) for p in ("def fibonacci(n):", "import os\n", "class Stack:\n    def")]
    prompts.append(ht.apply_chat_template([{"role": "user", "content": "Reverse a list."}], add_generation_prompt=True,
                                          tokenize=True)["input_ids"])
    greedy = SamplingConfig(max_new_tokens=24, temperature=0.0, top_p=1.0)
    ours = [s[0].token_ids for s in engine.generate([Request(p, greedy, stop_ids=[tok.end_id]) for p in prompts])]
    for p, mine in zip(prompts, ours):
        with torch.no_grad():
            g = hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False)[0, len(p):].tolist()
        assert g == mine
    assert len({t for mine in ours for t in mine}) >= 3  # varied output, which a wrong RoPE or norm would change


# ----------------------------------------------------------------------------- import
def test_transformers_made_model_imports_with_equal_logits_and_new_rows_after_the_vocab(hf_made, tmp_path):
    directory, hf, n_bpe = hf_made
    model, tok, state = ckpt.load_model(import_hf(str(directory), tmp_path / "imported"))
    rows = hf.config.vocab_size
    assert model.cfg.qk_norm == (hf.config.model_type == "qwen3") and model.cfg.vocab_size == rows + len(SPECIAL_TOKENS)
    assert [tok.special_id(n) for n in SPECIAL_TOKENS] == list(range(rows, rows + len(SPECIAL_TOKENS)))
    assert tok.special_id("<|im_start|>") == n_bpe and tok.special_id(f"<|reserved_{rows - 1}|>") == rows - 1
    assert tok.encode("<|im_start|>hi<|im_end|>") == hf_tokenizer_ids(directory, "<|im_start|>hi<|im_end|>")
    assert state["meta"]["vocab_layout"]["codechat_new"] == [rows, rows + len(SPECIAL_TOKENS)]
    theirs_emb = hf.get_input_embeddings().weight
    assert torch.equal(model.embed_tokens.weight[:rows], theirs_emb)  # no existing row changed
    assert torch.allclose(model.embed_tokens.weight[rows:], theirs_emb.mean(0).expand(len(SPECIAL_TOKENS), -1))
    assert torch.equal(model.lm_head.weight[:rows], hf.lm_head.weight)
    ids = code_batch(tok.encode)
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert ours.abs().max() > 0.05 and (ours[..., :rows] - theirs).abs().max().item() < ATOL


def hf_tokenizer_ids(directory: Path, text: str) -> list[int]:
    """transformers' ids of ``text`` with added-token spellings split, as codechat encodes text."""
    return AutoTokenizer.from_pretrained(directory)(text, split_special_tokens=True)["input_ids"]


def test_sft_runs_from_an_imported_model_and_exports_back(hf_made, tmp_path):
    directory, hf, _ = hf_made
    # the fixture's Alpaca records under a Code Alpaca name: the card's licence comes from the source's name
    data = tmp_path / "code_alpaca_2k.json"
    shutil.copy(CASES_B / "alpaca" / "instructions.json", data)
    cfg = SFTStageConfig(init=f"hf:{directory}", sft=SFTConfig(data=str(data), max_examples=16, max_length=128),
                         train=TrainConfig(max_steps=2, micro_batch_size=2, log_every=10**6, eval_every=10**6),
                         run=RunConfig(out=str(tmp_path / "sft"), device="cpu"))
    result = run_sft(cfg, show_progress=False)
    assert result["step"] == 2 and (tmp_path / "sft" / "hf_init" / "state.json").is_file()
    assert cli_main(["export", "--model", str(tmp_path / "sft"), "--out", str(tmp_path / "hf"), "--format", "hf",
                     "--dtype", "fp32"]) == 0
    back, info = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert back.config.vocab_size == hf.config.vocab_size + len(SPECIAL_TOKENS)
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "non-commercial" in card and "code_alpaca_2k.json" in card and "CC BY-NC 4.0" in card
    assert f"hf:{directory}" in card and "| sft | 2 |" in card
    model, tok, _ = ckpt.load_model(tmp_path / "sft")
    ids = code_batch(tok.encode, rows=2, length=32)
    with torch.no_grad():
        assert (model(ids) - back(ids).logits).abs().max().item() < ATOL


def test_pretrain_continues_an_imported_model(hf_made, tmp_path):
    directory, hf, _ = hf_made
    cfg = PretrainConfig(init=f"hf:{directory}", data=DataConfig(max_files=30, val_fraction=0.2, seq_len=64, workers=1),
                         train=TrainConfig(max_steps=1, micro_batch_size=2, eval_every=10**6, eval_tokens=256),
                         run=RunConfig(out=str(tmp_path / "pre"), device="cpu"))
    assert run_pretrain(cfg, show_progress=False)["step"] == 1
    _, _, state = ckpt.load_model(tmp_path / "pre")
    assert state["meta"]["model"]["vocab_size"] == hf.config.vocab_size + len(SPECIAL_TOKENS)
    assert state["meta"]["init"] == str(tmp_path / "pre" / "hf_init")


BASE = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=160,
            max_position_embeddings=256, rope_theta=10000.0)


@pytest.mark.parametrize("field,value", [
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}), ("rope_scaling", {"type": "linear", "factor": 2.0}),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6}), ("use_sliding_window", True),
    ("attention_bias", True), ("mlp_bias", True), ("num_experts", 8), ("num_local_experts", 4),
    ("hidden_act", "gelu"), ("layer_types", ["sliding_attention", "full_attention"]), ("model_type", "mistral"),
    ("quantization_config", {"quant_method": "gptq"})])
def test_unsupported_config_field_is_refused_by_name(field, value):
    with pytest.raises(HFImportError, match=field):
        model_config_from_hf({**BASE, field: value}, "x/config.json", 100)
    assert model_config_from_hf({**BASE, "rope_scaling": {"rope_type": "default"}}, "x", 100).rope_theta == 10000.0


def test_unsupported_checkpoint_is_refused_end_to_end(hf_made, tmp_path):
    directory, _, _ = hf_made
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in directory.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}))
    with pytest.raises(HFImportError, match=r"config\.json: rope_scaling\.rope_type='llama3'"):
        import_hf(str(bad), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert cli_main(["sft", "--init", "hf:no/such-dir-or-repo/x", "--out", str(tmp_path / "s")]) == 2


# ----------------------------------------------------------------------------- GPT-2's BPE
@pytest.fixture(params=["fixture", "shared"])
def gpt2_dir(request) -> Path:
    """A GPT-2-layout BPE (encoder.json + vocab.bpe): tests/fixtures/cases_b/gpt2_tiny (288 entries) or OpenAI's
    GPT-2 in shared/data (skipped when absent)."""
    return shared_file("data/gpt2_bpe") if request.param == "shared" else CASES_B / "gpt2_tiny"


def test_gpt2_tokenizer_exports_and_reloads_with_identical_ids(gpt2_dir, tmp_path):
    gpt2 = Tokenizer.load(gpt2_dir)
    n_bpe = len(json.loads((gpt2_dir / "encoder.json").read_text(encoding="utf-8")))  # 50257 for GPT-2
    assert gpt2.kind == "gpt2" and gpt2.vocab_size == n_bpe + len(SPECIAL_TOKENS)
    gpt2.save(tmp_path / "tok")
    out = tmp_path / "hf"
    out.mkdir()
    write_tokenizer(tmp_path / "tok", out, 1024)
    ht = AutoTokenizer.from_pretrained(out)
    back, layout = import_tokenizer(out, gpt2.vocab_size)
    root = Path(default_corpus_dirs()[0])
    texts = [(root / f).read_text(encoding="utf-8") for f in CODE_FILES] + PROSE + ["<|endoftext|> is text"]
    for text in texts:
        ids = gpt2.encode(text)
        assert ht(text, split_special_tokens=True)["input_ids"] == ids == back.encode(text)
    assert ht("x<|end|>")["input_ids"] == gpt2.encode("x") + [gpt2.end_id] and gpt2.end_id == n_bpe + 1
    assert back.vocab_size == gpt2.vocab_size and layout["codechat_new"] == [gpt2.vocab_size] * 2
    assert all(back.special_id(n) == gpt2.special_id(n) for n in SPECIAL_TOKENS)
