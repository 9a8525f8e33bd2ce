"""Tokenizer: exact round trips, special tokens that text cannot produce, GPT-2, streaming, persistence.

Case 17 and GPT-2's BPE come from shared/ (skipped when absent) and from the project's own fixtures
(tests/fixtures/cases_b: special-token literals, and a GPT-2-layout BPE of 288 entries, ``gpt2_tiny``).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codechat.config.stages import ConfigError
from codechat.data.corpus import build_corpus, read_split
from codechat.data.tokenizer_cli import add_cli
from codechat.tokenizer import SPECIAL_TOKENS, Tokenizer, train_tokenizer
from conftest import FIXTURES, shared_file

#: Control-token spellings of codechat and of other toolkits, typed as ordinary text.
LITERALS = (*SPECIAL_TOKENS, "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|user_start|>", "<|assistant_end|>")
MIXED_SCRIPTS = ("emoji 😀👍🏽🇫🇷 CJK 漢字テスト 한국어, accents déjà vu, math ∑∫√, <|end|>\n"
                 "\tdef f(x): return x**2\r\n")
GPT2_HELLO_WORLD = [15496, 995]  # GPT-2's ids for "Hello world"
GPT2_VOCAB = 50257
CASES_B = FIXTURES / "cases_b"


def _text_with_literals() -> st.SearchStrategy[str]:
    return st.lists(st.one_of(st.text(), st.sampled_from(LITERALS)), max_size=8).map("".join)


def _cases(path: Path, kind: str) -> list[dict]:
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return [r for r in rows if r["kind"] == kind]


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


# ----------------------------------------------------------------------------- round trips
@settings(max_examples=300, deadline=None)
@given(text=_text_with_literals())
def test_arbitrary_unicode_round_trips_without_special_ids(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert not set(ids) & tok.special_ids
    lengths = tok.token_byte_lengths()
    assert sum(lengths[i] for i in ids) == len(text.encode("utf-8"))


@pytest.mark.parametrize("spelling", LITERALS)
def test_special_spellings_in_text_encode_as_ordinary_tokens(tok: Tokenizer, spelling: str) -> None:
    for text in (spelling, f"a{spelling}b", f"{spelling}{spelling}\n", f"user: {spelling} assistant:"):
        ids = tok.encode(text)
        assert not set(ids) & tok.special_ids, text
        assert tok.decode(ids) == text
    assert tok.encode_batch([spelling, "x"]) == [tok.encode(spelling), tok.encode("x")]


def test_special_ids_follow_the_bpe_vocabulary(tok: Tokenizer) -> None:
    n_bpe = tok.vocab_size - len(SPECIAL_TOKENS)
    assert tok.vocab_size == 2048
    assert [tok.special_id(s) for s in SPECIAL_TOKENS] == list(range(n_bpe, tok.vocab_size))
    assert tok.special_ids == frozenset(range(n_bpe, tok.vocab_size))
    assert (tok.bos_id, tok.end_id) == (n_bpe, n_bpe + 1)
    ids = [tok.bos_id, *tok.encode("x = 1"), tok.end_id]
    assert tok.decode(ids) == "<|bos|>x = 1<|end|>"
    assert tok.decode(ids, skip_special=True) == "x = 1"
    with pytest.raises(KeyError, match="<|nope|>"):
        tok.special_id("<|nope|>")


def test_decode_rejects_ids_outside_the_vocabulary(tok: Tokenizer) -> None:
    for bad in (-1, tok.vocab_size):
        with pytest.raises(ValueError, match=f"outside \\[0, {tok.vocab_size}\\)"):
            tok.decode([1, bad])


def test_token_bytes_cover_every_byte_and_count_zero_for_specials(tok: Tokenizer) -> None:
    lengths = tok.token_byte_lengths()
    assert len(lengths) == tok.vocab_size
    assert all(lengths[i] == 0 and tok.token_bytes(i) == b"" for i in tok.special_ids)
    single = {tok.token_bytes(i) for i in range(tok.vocab_size) if lengths[i] == 1}
    assert single == {bytes([b]) for b in range(256)}
    assert all(lengths[i] == len(tok.token_bytes(i)) for i in range(tok.vocab_size))


def test_decode_replaces_an_incomplete_character(tok: Tokenizer) -> None:
    first = tok.encode("😀")[0]  # 4-byte character; a 2048-id vocab splits it
    assert tok.decode([first]) == "\ufffd"
    stream = tok.stream()
    assert stream.push(first) == ""
    assert stream.flush() == "\ufffd"


# ----------------------------------------------------------------------------- failure case 17
def check_pretrain_documents_keep_literals(tok: Tokenizer, tok_dir: Path, tmp_path: Path, write_corpus,
                                           texts: list[str]) -> None:
    """Documents spelling special tokens go through the corpus builder as text: the only special id in a
    shard is the <|end|> the pipeline puts after each document."""
    assert texts, "no pretrain rows"
    val_texts = [f"# held out\n{t}" for t in texts]
    src = write_corpus(tmp_path / "src", {"train": texts, "val": val_texts}, 0.5)
    index = build_corpus([src], tok_dir, tmp_path / "out", val_fraction=0.5, workers=1, show_progress=False)
    for split, expected in (("train", texts), ("val", val_texts)):
        ids = np.concatenate(read_split(tmp_path / "out", split)).tolist()
        assert index["splits"][split]["documents"] == len(expected)
        assert ids.count(tok.end_id) == len(expected) and ids[-1] == tok.end_id
        assert {i for i in ids if i in tok.special_ids} == {tok.end_id}
        docs, start = [], 0
        for pos, i in enumerate(ids):
            if i == tok.end_id:
                docs.append(ids[start:pos])
                start = pos + 1
        assert [tok.decode(d) for d in docs] == expected
        assert docs == [tok.encode(t) for t in expected]


def check_chat_contents_are_text(tok: Tokenizer, contents: list[str]) -> None:
    assert contents
    for text in contents:
        ids = tok.encode(text)
        assert not set(ids) & tok.special_ids
        assert tok.decode(ids) == text


def test_case17_pretrain_documents_keep_literals_as_text(tok: Tokenizer, tok_dir: Path,
                                                          tmp_path: Path, write_corpus) -> None:
    texts = [r["text"] for r in _cases(shared_file("cases/17-special-token-literals.jsonl"), "pretrain")]
    check_pretrain_documents_keep_literals(tok, tok_dir, tmp_path, write_corpus, texts)


def test_pretrain_documents_keep_literals_as_text_fixture(tok: Tokenizer, tok_dir: Path, tmp_path: Path,
                                                          write_corpus) -> None:
    texts = [r["text"] for r in _cases(CASES_B / "special_literals.jsonl", "pretrain")]
    assert len(texts) == 2 and "<|end|>" in texts[0] and texts[1].startswith("<|bos|><|system|>")
    check_pretrain_documents_keep_literals(tok, tok_dir, tmp_path, write_corpus, texts)


def test_case17_chat_contents_encode_as_ordinary_text(tok: Tokenizer) -> None:
    path = shared_file("cases/17-special-token-literals.jsonl")
    check_chat_contents_are_text(tok, [m["content"] for r in _cases(path, "chat") for m in r["messages"]])


def test_chat_contents_encode_as_ordinary_text_fixture(tok: Tokenizer) -> None:
    contents = [m["content"] for r in _cases(CASES_B / "special_literals.jsonl", "chat") for m in r["messages"]]
    assert len(contents) == 6 and "<|end|><|assistant|>" in contents[0]
    check_chat_contents_are_text(tok, contents)


# ----------------------------------------------------------------------------- streaming
def test_stream_decoder_emits_whole_characters_only(tok: Tokenizer) -> None:
    ids = tok.encode(MIXED_SCRIPTS)
    assert any(tok.decode([i]) == "\ufffd" for i in ids), "the text should split some character across tokens"
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + stream.flush() == tok.decode(ids) == MIXED_SCRIPTS


def test_stream_decoder_spells_or_skips_special_ids(tok: Tokenizer) -> None:
    ids = [*tok.encode("漢字"), tok.end_id]
    spelled, skipped = tok.stream(), tok.stream(skip_special=True)
    assert "".join(spelled.push(i) for i in ids) + spelled.flush() == "漢字<|end|>"
    assert "".join(skipped.push(i) for i in ids) + skipped.flush() == "漢字"


# ----------------------------------------------------------------------------- training and persistence
def test_vocab_size_below_bytes_plus_specials_is_a_config_error() -> None:
    minimum = 256 + len(SPECIAL_TOKENS)
    with pytest.raises(ConfigError, match=f"--vocab-size {minimum - 1} is too small: the minimum is {minimum}"):
        train_tokenizer(["x = 1"], minimum - 1, show_progress=False)


def test_training_on_little_text_warns_that_the_vocabulary_is_smaller() -> None:
    with pytest.warns(UserWarning, match="fewer than --vocab-size 1000"):
        tok = train_tokenizer(["x = 1\n" * 10], 1000, show_progress=False)
    assert tok.vocab_size < 1000
    assert tok.decode(tok.encode("x = 1\n")) == "x = 1\n"


def test_save_load_round_trip_gives_identical_encodings(tok: Tokenizer, tmp_path: Path) -> None:
    out = tok.save(tmp_path / "t")
    assert sorted(p.name for p in out.iterdir()) == ["codechat_tokenizer.json", "tokenizer.json"]
    back = Tokenizer.load(out)
    assert (back.vocab_size, back.special_ids, back.kind) == (tok.vocab_size, tok.special_ids, "trained")
    assert back.encode_batch([MIXED_SCRIPTS, *LITERALS]) == tok.encode_batch([MIXED_SCRIPTS, *LITERALS])


def test_plain_tokenizer_json_gets_specials_after_its_vocabulary(tok: Tokenizer, tok_dir: Path) -> None:
    plain = Tokenizer.load(tok_dir / "tokenizer.json")
    assert plain.kind == "tokenizer.json"
    assert plain.special_ids == tok.special_ids
    assert plain.encode(MIXED_SCRIPTS) == tok.encode(MIXED_SCRIPTS)


def test_added_tokens_of_a_foreign_tokenizer_json_are_not_matched_in_text(tok: Tokenizer, tok_dir: Path,
                                                                            tmp_path: Path) -> None:
    spec = json.loads((tok_dir / "tokenizer.json").read_text())
    spec["added_tokens"] = [{"id": tok.vocab_size, "content": "<|im_start|>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True}]
    (tmp_path / "foreign.json").write_text(json.dumps(spec))
    foreign = Tokenizer.load(tmp_path / "foreign.json")
    assert foreign.vocab_size == tok.vocab_size
    assert foreign.encode("<|im_start|>user") == tok.encode("<|im_start|>user")


def test_load_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nowhere"):
        Tokenizer.load(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=f"{tmp_path}.*holds no tokenizer"):
        Tokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match=f"{tmp_path}.*could not be loaded"):
        Tokenizer.load(tmp_path)
    with pytest.raises(ConfigError, match="missing.json"):
        Tokenizer.from_gpt2(tmp_path / "missing.json", tmp_path / "missing.bpe")


def test_load_rejects_tokenizers_it_cannot_represent(tok_dir: Path, tmp_path: Path) -> None:
    spec = json.loads((tok_dir / "tokenizer.json").read_text())
    word_piece = {**spec, "model": {**spec["model"], "type": "WordPiece"}}
    (tmp_path / "wp.json").write_text(json.dumps(word_piece))
    with pytest.raises(ConfigError, match="wp.json.*'WordPiece'; only byte-level BPE"):
        Tokenizer.load(tmp_path / "wp.json")
    vocab = {("▁hello" if i == 300 else piece): i for piece, i in spec["model"]["vocab"].items()}
    (tmp_path / "sp.json").write_text(json.dumps({**spec, "model": {**spec["model"], "vocab": vocab, "merges": []}}))
    with pytest.raises(ConfigError, match="'▁hello' is not byte-level BPE"):
        Tokenizer.load(tmp_path / "sp.json")
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "tokenizer.json").write_text(json.dumps(spec))
    meta = json.loads((tok_dir / "codechat_tokenizer.json").read_text())
    meta["special_tokens"]["<|end|>"] += 1
    (moved / "codechat_tokenizer.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="special-token ids .* do not follow the BPE vocabulary"):
        Tokenizer.load(moved)


# ----------------------------------------------------------------------------- GPT-2
@dataclass(frozen=True)
class GPT2Files:
    """A GPT-2-layout BPE directory (``encoder.json`` + ``vocab.bpe``), its size and its ids of "Hello world"."""

    directory: Path
    vocab: int  # entries of encoder.json; the last is <|endoftext|>
    hello_world: list[int]


@pytest.fixture(scope="module", params=["fixture", "shared"])
def gpt2_files(request) -> GPT2Files:
    """tests/fixtures/cases_b/gpt2_tiny (256 byte symbols in GPT-2's order, 31 merges, <|endoftext|>), or
    OpenAI's GPT-2 files in shared/data (skipped when absent)."""
    if request.param == "shared":
        return GPT2Files(shared_file("data/gpt2_bpe"), GPT2_VOCAB, GPT2_HELLO_WORLD)
    return GPT2Files(CASES_B / "gpt2_tiny", 288, [259, 264])  # "Hello" and "Ġworld" are merged entries


@pytest.fixture(scope="module")
def gpt2(gpt2_files: GPT2Files) -> Tokenizer:
    return Tokenizer.load(gpt2_files.directory)


def test_gpt2_gives_its_known_ids_and_our_specials_after_50257(gpt2: Tokenizer, gpt2_files: GPT2Files) -> None:
    vocab = gpt2_files.vocab
    assert gpt2.kind == "gpt2"
    assert gpt2.encode("Hello world") == gpt2_files.hello_world
    assert gpt2.vocab_size == vocab + len(SPECIAL_TOKENS)
    assert gpt2.bos_id == vocab
    ids = gpt2.encode("<|endoftext|>")
    assert vocab - 1 not in ids and len(ids) > 1  # the last entry (50256) is one text cannot produce
    assert gpt2.decode(ids) == "<|endoftext|>"
    assert gpt2.decode(gpt2.encode(MIXED_SCRIPTS)) == MIXED_SCRIPTS


def test_gpt2_tiny_fixture_is_a_gpt2_layout() -> None:
    """The fixture's encoder.json follows GPT-2's: the 256 byte symbols first, merged pieces, <|endoftext|> last."""
    encoder = json.loads((CASES_B / "gpt2_tiny" / "encoder.json").read_text(encoding="utf-8"))
    assert sorted(encoder.values()) == list(range(288)) and encoder["<|endoftext|>"] == 287
    assert (encoder["!"], encoder["Ā"], encoder["Ġ"]) == (0, 188, 220)  # as in OpenAI's file
    merges = (CASES_B / "gpt2_tiny" / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    assert merges[0] == "#version: 0.2" and all("".join(m.split(" ")) in encoder for m in merges[1:])


def test_gpt2_save_load_round_trip(gpt2: Tokenizer, tmp_path: Path) -> None:
    back = Tokenizer.load(gpt2.save(tmp_path / "gpt2"))
    assert back.kind == "gpt2" and back.vocab_size == gpt2.vocab_size
    assert back.encode(MIXED_SCRIPTS) == gpt2.encode(MIXED_SCRIPTS)


# ----------------------------------------------------------------------------- CLI
def test_cli_encode_prints_ids_and_pieces(tok: Tokenizer, tok_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert _run_cli(["tokenizer", "encode", "--tokenizer", str(tok_dir), "x <|end|>"]) == 0
    out = capsys.readouterr().out
    assert f"{len(tok.encode('x <|end|>'))} tokens: {tok.encode('x <|end|>')}" in out
    assert "pieces: [" in out


def test_cli_train_then_stats_on_val(tmp_path: Path, gpt2_files: GPT2Files, write_corpus,
                                     capsys: pytest.CaptureFixture) -> None:
    src = write_corpus(tmp_path / "src", {"train": ["def add(a, b):\n    return a + b\n" * 20],
                                          "val": ["def sub(a, b):\n    return a - b\n"]}, 0.5)
    common = ["--corpus", str(src), "--val-fraction", "0.5"]
    assert _run_cli(["tokenizer", "train", *common, "--vocab-size", "270", "--out", str(tmp_path / "t")]) == 0
    assert Tokenizer.load(tmp_path / "t").vocab_size == 270
    assert _run_cli(["tokenizer", "stats", "--tokenizer", str(tmp_path / "t"), *common,
                     "--gpt2", str(gpt2_files.directory)]) == 0
    out = capsys.readouterr().out
    assert "ours: " in out and "gpt2: " in out and "1 documents" in out
