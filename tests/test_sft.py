"""SFT through the real loader, trainer and CLI: budgets, packing, pad == eos, resume, preflight.

Cases 01/02 and the MBPP / Code Alpaca data come from shared/ (skipped when absent); the same behaviours run on the
project's own inputs in tests/fixtures/cases_b.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from codechat import checkpoint as ckpt
from codechat.chat.budget import RenderedExample, render_with_budget
from codechat.chat.conversation import Conversation, Message, render_for_completion
from codechat.config.sft import SFTConfig
from codechat.config.stages import ModelConfig, to_dict
from codechat.data.mixture import Mixture
from codechat.data.sft import SFTLoader, collate, pack_best_fit
from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
from codechat.model import IGNORE_INDEX, build_model
from conftest import shared_file

FIXTURES = Path(__file__).parent / "fixtures" / "sft"
CASES_B = Path(__file__).parent / "fixtures" / "cases_b"


@pytest.fixture(params=["fixtures", "shared"])
def mbpp_file(request) -> Path:
    """An MBPP-layout JSON-lines file: tests/fixtures/cases_b/mbpp/mbpp.jsonl (11 tasks) or shared/'s (974; skipped
    when absent)."""
    return shared_file("data/mbpp/mbpp.jsonl") if request.param == "shared" else CASES_B / "mbpp/mbpp.jsonl"


@pytest.fixture(params=["fixtures", "shared"])
def alpaca_file(request) -> Path:
    """An Alpaca JSON array: tests/fixtures/cases_b/alpaca/instructions.json (7) or Code Alpaca 2k (skipped when
    shared/ is absent)."""
    if request.param == "shared":
        return shared_file("data/code_alpaca/code_alpaca_2k.json")
    return CASES_B / "alpaca/instructions.json"


def tiny_model(tok, **kw):
    torch.manual_seed(0)
    return build_model(ModelConfig(**{**dict(vocab_size=tok.vocab_size, n_layer=2, n_embd=64, n_head=2, n_kv_head=1,
                                             max_seq_len=256), **kw}))


def mixture(path, cfg):
    return Mixture.from_spec(str(path), cfg)


def one_epoch(path, tok, cfg, mbs=2):
    """All micro-batches of one chunk that covers the whole (small) file once."""
    n = mixture(path, cfg).epoch_size
    cfg = SFTConfig(**{**to_dict(cfg), "chunk_examples": n, "mix_mode": "epoch"})
    loader = SFTLoader(mixture(path, cfg), tok, cfg, mbs)
    first = loader.next_batch()
    return loader, [first] + [loader.next_batch() for _ in range(len(loader._batches) - 1)]


def check_prompt_budget_batches(tok, path: Path) -> None:
    """Three rows, two with a prompt over its 48-token budget: every batch is supervised, the loss finite and > 0."""
    cfg = SFTConfig(max_length=64, max_prompt_length=48, decontaminate=False)
    loader, batches = one_epoch(path, tok, cfg)
    assert loader.counts.kept == 3 and loader.counts.prompt_truncated == 2
    model = tiny_model(tok)
    for b in batches:
        assert b.inputs.size(1) <= 64 and int((b.labels != IGNORE_INDEX).sum()) >= 1
        loss = model(b.inputs, b.labels, reduction="sum") / (b.labels != IGNORE_INDEX).sum()
        assert torch.isfinite(loss) and loss > 0


def test_case01_every_batch_is_supervised_and_the_loss_finite(tok, tmp_path):
    check_prompt_budget_batches(tok, shared_file("cases/01-prompt-exceeds-max-len.jsonl"))


def test_prompt_over_budget_every_batch_is_supervised_and_the_loss_finite_fixture(tok):
    check_prompt_budget_batches(tok, CASES_B / "budget_prompts.jsonl")


def check_packing_oversized(tok, path: Path) -> tuple[int, int]:
    """Packing rows of 32 tokens, micro-batch 2: rows longer than a row are cut or dropped and counted, every batch
    is supervised, an epoch ends in bounded steps; returns (records, completion-truncated)."""
    cfg = SFTConfig(max_length=32, max_prompt_length=16, packing=True, decontaminate=False, pad_to_multiple=1)
    n_records = len(path.read_text().splitlines())
    loader, batches = one_epoch(path, tok, cfg)
    c = loader.counts
    assert c.seen == n_records and c.kept + c.n_dropped == n_records
    assert c.completion_truncated + c.n_dropped >= 1  # the long rows were cropped or dropped, and counted
    assert len(batches) <= n_records  # an epoch ends in bounded steps
    for b in batches:
        assert b.inputs.size(1) <= 32 and b.inputs.size(0) <= 2
        assert int((b.labels != IGNORE_INDEX).sum()) >= 1
    return n_records, c.completion_truncated


def test_case02_packing_oversized_rows_are_cut_and_an_epoch_is_bounded(tok):
    check_packing_oversized(tok, shared_file("cases/02-sft-packing-oversized.jsonl"))


def test_packing_oversized_rows_are_cut_and_an_epoch_is_bounded_fixture(tok):
    assert check_packing_oversized(tok, CASES_B / "packing_oversized.jsonl") == (7, 4)  # 4 long rows, 3 short


def test_case04_end_label_survives_when_pad_equals_end(tok):
    conv = lambda a: Conversation([Message("user", "hi"), Message("assistant", a)])  # noqa: E731
    cfg = SFTConfig(max_length=64, max_prompt_length=32, decontaminate=False)
    exs = [render_with_budget(tok, conv(a), cfg) for a in ("ok", "a much longer answer than the other")]
    b = collate([[e] for e in exs], pad_id=tok.end_id, pad_to_multiple=8, packed=False)
    for r, ex in enumerate(exs):
        assert ex.ids[-1] == tok.end_id
        assert b.labels[r, len(ex) - 2] == tok.end_id  # the closing <|end|> is a target
        assert (b.labels[r, len(ex) - 1:] == IGNORE_INDEX).all()  # padding, found by length
    assert b.n_tokens == sum(len(e) - 1 for e in exs)


def test_a_packed_micro_batch_is_laid_out_token_by_token():
    two = [RenderedExample([1, 2, 3, 4], [0, 0, 1, 1], 2), RenderedExample([5, 6, 7], [0, 1, 1], 1)]
    b = collate([two, [], [RenderedExample([8, 9], [0, 1], 1)]], pad_id=0, pad_to_multiple=8, packed=True)
    X = IGNORE_INDEX
    assert b.inputs.tolist() == [[1, 2, 3, 5, 6, 0, 0, 0], [0] * 8, [8, 0, 0, 0, 0, 0, 0, 0]]
    assert b.labels.tolist() == [[X, 3, 4, 6, 7, X, X, X], [X] * 8, [9, X, X, X, X, X, X, X]]
    assert b.doc_ids.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2], [0] * 8, [0, 1, 1, 1, 1, 1, 1, 1]]
    assert b.n_tokens == 6 and b.inputs.dtype == b.labels.dtype == b.doc_ids.dtype == torch.long


def test_packed_and_padded_batches_give_the_same_loss(tok, mbpp_file):
    cfg = SFTConfig(max_length=512, max_prompt_length=384, decontaminate=False, pad_to_multiple=1)
    mix = Mixture.from_spec(str(mbpp_file), cfg)
    exs = [render_with_budget(tok, next(mix).conversation, cfg) for _ in range(6)]
    model = tiny_model(tok, max_seq_len=512).eval()
    padded = collate([[e] for e in exs], tok.end_id, 1, packed=False)
    bins = pack_best_fit([len(e) - 1 for e in exs], 512)
    assert len(bins) < len(exs)
    packed = collate([[exs[i] for i in b] for b in bins], tok.end_id, 1, packed=True)
    with torch.no_grad():
        a = model(padded.inputs, padded.labels, reduction="sum")
        p = model(packed.inputs, packed.labels, reduction="sum", doc_ids=packed.doc_ids)
    assert abs(a - p) / a < 1e-5
    assert packed.n_tokens == padded.n_tokens


def test_packed_micro_batches_all_have_one_shape_and_lose_no_example(tok, alpaca_file):
    # 7 rows of 3 per micro-batch: the chunk's last micro-batch is filled with empty rows, so a
    # compiled attention kernel (flex attention on CUDA) sees one (B, T) on every step
    cfg = SFTConfig(max_length=128, max_prompt_length=64, packing=True, decontaminate=False, chunk_examples=40,
                    mix_mode="epoch")
    loader = SFTLoader(Mixture.from_spec(str(alpaca_file), cfg), tok, cfg, micro_batch_size=3)
    first = loader.next_batch()
    batches = [first] + [loader.next_batch() for _ in range(len(loader._batches) - 1)]
    kept = [r for b in loader._batches for r in b if r]
    assert len(kept) % 3, "the chunk's rows should not divide into micro-batches evenly for this test"
    assert {tuple(b.inputs.shape) for b in batches} == {(3, 128)}
    assert sum(b.n_tokens for b in batches) == sum(len(ex) - 1 for r in kept for ex in r)
    supervised = sum(int((b.labels != IGNORE_INDEX).sum()) for b in batches)
    assert supervised == sum(sum(ex.mask[1:]) for r in kept for ex in r) > 0


def test_best_fit_packs_tightly():
    bins = pack_best_fit([7, 5, 3, 3, 2], 10)
    assert sorted(sorted(b) for b in bins) == [[0, 2], [1, 3, 4]]
    with pytest.raises(ValueError, match="does not fit"):
        pack_best_fit([11], 10)


def test_loader_resume_continues_the_exact_batches(tok, mbpp_file):
    cfg = SFTConfig(max_length=128, max_prompt_length=96, decontaminate=False, chunk_examples=16, packing=True)
    path = mbpp_file
    a = SFTLoader(mixture(path, cfg), tok, cfg, 2)
    seq = [a.next_batch() for _ in range(9)]
    b = SFTLoader(mixture(path, cfg), tok, cfg, 2)
    for _ in range(5):
        b.next_batch()
    state = json.loads(json.dumps(b.state_dict()))
    c = SFTLoader(mixture(path, cfg), tok, cfg, 2)
    c.load_state_dict(state)
    for want in seq[5:]:
        got = c.next_batch()
        assert torch.equal(got.inputs, want.inputs) and torch.equal(got.labels, want.labels)


def test_the_next_chunk_is_built_ahead_and_the_batches_are_those_built_on_the_spot(tok, mbpp_file):
    cfg = SFTConfig(max_length=128, max_prompt_length=96, decontaminate=False, chunk_examples=16, packing=True)
    a = SFTLoader(mixture(mbpp_file, cfg), tok, cfg, 2)
    seq = [a.next_batch() for _ in range(24)]
    assert a.chunk >= 2  # the batches crossed chunks
    a.settle()  # the chunk after this one is built already: the mixture is past it
    assert a.mixture.state_dict() != a.state_dict()["mixture"]
    # each batch again from a loader resumed at its position: a resume builds its chunk on the spot
    state = SFTLoader(mixture(mbpp_file, cfg), tok, cfg, 2).state_dict()
    for want in seq:
        c = SFTLoader(mixture(mbpp_file, cfg), tok, cfg, 2)
        c.load_state_dict(json.loads(json.dumps(state)))
        got = c.next_batch()
        state = c.state_dict()
        assert torch.equal(got.inputs, want.inputs) and torch.equal(got.labels, want.labels)
        assert torch.equal(got.doc_ids, want.doc_ids)


def test_a_model_sft_on_one_example_stops_by_itself_and_chats(tok, tok_dir, tmp_path, memorise):
    conv = Conversation([Message("user", "Say hello."), Message("assistant", "hello there")])
    model = tiny_model(tok)
    memorise(model, conv, 60, tmp_path, max_length=64, max_prompt_length=32)
    prompt = render_for_completion(tok, Conversation([Message("user", "Say hello.")]))
    [[sample]] = Engine(model.eval(), EngineConfig(slots=1)).generate(
        [Request(prompt, SamplingConfig(max_new_tokens=30, temperature=0.0), stop_ids=[tok.end_id])])
    out = sample.token_ids
    assert out[-1] == tok.end_id and tok.decode(out[:-1]) == "hello there"
    # the same model through `codechat chat`: one answer, then a two-turn REPL session on stdin
    stage = ckpt.save(tmp_path / "sft" / "checkpoints", 60, model=model.state_dict(),
                      state={"step": 60, "meta": {"stage": "sft", "model": to_dict(model.cfg)}},
                      tokenizer_dir=tok_dir).parent.parent
    chat = [sys.executable, "-m", "codechat", "chat", "--model", str(stage), "--temperature", "0", "--device", "cpu"]
    p = subprocess.run([*chat, "--prompt", "Say hello."], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout == "hello there\n", p.stderr
    p = subprocess.run(chat, input="Say hello.\n/reset\nSay hello.\n", capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout == "hello there\nhello there\n", p.stderr


@pytest.fixture
def tiny_ckpt(tok, tok_dir, tmp_path):
    model = tiny_model(tok)
    return ckpt.save(tmp_path / "pretrain" / "checkpoints", 0, model=model.state_dict(),
                     state={"step": 0, "meta": {"stage": "pretrain", "model": to_dict(model.cfg)}},
                     tokenizer_dir=tok_dir).parent.parent


def sft_cli(*args):
    return subprocess.run([sys.executable, "-m", "codechat", "sft", "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=600)


def test_sft_cli_trains_reports_and_resumes(tiny_ckpt, tmp_path):
    out = tmp_path / "sft"
    # the fixture's MBPP-layout file: 11 tasks, of which the 4 test and validation tasks go by task id (and train
    # task 604, a copy of test task 12, by n-gram overlap)
    # no --sft.max_length: the budgets follow the model (max_seq_len 256, prompt 0.75 of it)
    common = ["--init", str(tiny_ckpt), "--data", str(CASES_B / "mbpp/mbpp.jsonl"), "--out", str(out),
              "--train.micro_batch_size", "4", "--train.log_every", "1", "--train.save_every", "3",
              "--optim.lr", "3e-3"]
    p = sft_cli(*common, "--max-steps", "3")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "preflight on" in p.stdout and "supervised tokens" in p.stdout and "max_length 256" in p.stdout
    assert "does not check MBPP" not in p.stderr
    assert "held-out MBPP tasks by task_id 4, by 10-gram overlap 1)" in p.stdout
    assert "realised 0.000" not in p.stdout and p.stdout.index("preflight on") < p.stdout.index("realised 1.000")
    report = json.loads((out / "data_report.json").read_text())
    assert report["preflight"]["kept"] > 0 and 0 < report["supervised_share"] < 1
    assert (report["max_length"], report["max_prompt_length"]) == (256, 192)
    assert report["decontamination"]["by_rule"] == {"task_id": 4, "ngram": 1}  # test + validation tasks, counted
    [src] = report["sources"]
    assert report["realised_at_step"] == 3 and src["drawn"] > 0 and src["share"] == 1.0  # written after training
    p = sft_cli(*common, "--max-steps", "6", "--resume")
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(7))
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    assert len(evals) == 3 and evals[-1] < evals[0]  # step 0, end of the first run, end of the resumed run
    assert json.loads((ckpt.resolve(out) / "state.json").read_text())["meta"]["stage"] == "sft"


def test_sft_refuses_to_start_when_nothing_is_supervised(tiny_ckpt, tmp_path):
    data = tmp_path / "no_answers.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(4)))
    p = sft_cli("--init", str(tiny_ckpt), "--data", str(data), "--out", str(tmp_path / "sft"), "--max-steps", "2",
                "--sft.decontaminate", "false", "--sft.max_length", "128", "--sft.max_prompt_length", "96")
    assert p.returncode == 2 and "nothing to train on" in p.stderr, p.stderr
    p = sft_cli("--init", str(tiny_ckpt), "--data", str(data), "--out", str(tmp_path / "sft"),
                "--sft.max_length", "64", "--sft.max_prompt_length", "64")
    assert p.returncode == 2 and "leaves no tokens for the completion" in p.stderr, p.stderr


def test_missing_inputs_are_reported_before_the_budgets(tiny_ckpt, tmp_path, capsys):
    from codechat.cli import main
    common = ["sft", "--device", "cpu", "--out", str(tmp_path / "sft"), "--max-steps", "1"]
    # an explicit length over the model's 256 would be a budget error; the missing file is reported first
    assert main([*common, "--init", str(tiny_ckpt), "--data", "/nope.jsonl", "--sft.max_length", "1024"]) == 2
    err = capsys.readouterr().err
    assert "data source '/nope.jsonl' does not exist (--data); fix the path" in err and "max_seq_len" not in err
    assert main([*common, "--init", str(tmp_path / "none"), "--data", f"{FIXTURES / 'messages.jsonl'},/nope.jsonl:0.5"]) == 2
    err = capsys.readouterr().err  # every missing input at once
    assert f"--init {tmp_path / 'none'}: no such run directory" in err and "'/nope.jsonl' does not exist" in err


def test_eval_data_gives_a_held_out_loss_and_a_missing_one_is_named(tiny_ckpt, tmp_path, capsys):
    """``--sft.eval_data``: eval_loss over held-out records (not the training data's first examples),
    at step 0, every ``eval_every`` steps and at the end; a missing file is refused before training."""
    from codechat.cli import main
    held = CASES_B / "alpaca/instructions.json"
    common = ["sft", "--device", "cpu", "--init", str(tiny_ckpt), "--data", str(CASES_B / "mbpp/mbpp.jsonl"),
              "--train.micro_batch_size", "4", "--train.log_every", "1", "--optim.lr", "3e-3"]
    curves = {}
    for name, extra in (("train", []), ("held", ["--sft.eval_data", str(held), "--train.eval_every", "2"])):
        assert main([*common, "--out", str(tmp_path / name), "--max-steps", "4", *extra]) == 0
        rows = [json.loads(ln) for ln in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        curves[name] = [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
    assert f"eval_loss on 7 held-out examples of {held}" in capsys.readouterr().out
    assert [s for s, _ in curves["held"]] == [0, 2, 4] and [s for s, _ in curves["train"]] == [0, 4]
    assert abs(curves["held"][0][1] - curves["train"][0][1]) > 1e-3  # another set at the same weights
    assert main([*common, "--out", str(tmp_path / "bad"), "--max-steps", "1", "--sft.eval_data", "/nope.json"]) == 2
    assert "'/nope.json' does not exist (--sft.eval_data)" in capsys.readouterr().err
