"""Corpus from data files and datasets: JSONL / JSON Lines / Parquet / gzip / hf: records become the shards of
the same texts given as files; bad records, --max-bytes, globs, the CLIs, streaming memory."""
from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from codechat.config.stages import ConfigError
from codechat.data import tokenizer_cli
from codechat.data.corpus import build_corpus, load_index, read_split
from codechat.data.readers import read_rows
from codechat.data.sources import (HubSource, RecordFile, SourceFile, collect_sources, iter_split_texts,
                                   split_documents, split_of)
from codechat.tokenizer import Tokenizer, train_tokenizer

VF = 0.3
#: Texts with two exact duplicates, a whitespace-only text, non-ASCII, and one that spells <|end|>.
TEXTS = ([f"def f{i}(x):\n    return x + {i}\n" for i in range(24)] + ["def f3(x):\n    return x + 3\n", "  \n\t",
         "s = 'héllo wörld ✓'\n", "# <|end|> is only text here\n", "def f7(x):\n    return x + 7\n"])
ROOT = Path(__file__).resolve().parents[1]


def _records(texts: list[str]) -> list[dict]:
    """``content`` first, then ``text``: some records have only ``text``, some both (``content`` wins)."""
    out = []
    for k, t in enumerate(texts):
        rec = {"id": k}
        if k % 3 == 1:
            rec["text"] = t
        else:
            rec.update(content=t, text="ignored: content comes first" if k % 3 == 2 else None)
        out.append(rec)
    return out


def _write(path: Path, records: list[dict]) -> Path:
    """``records`` as JSON Lines (``.jsonl``, ``.json``, optionally ``.gz``) or Parquet, by the name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        lines = "".join(json.dumps(r) + "\n" for r in records).encode()
        path.write_bytes(gzip.compress(lines) if path.name.endswith(".gz") else lines)
    return path


def _as_files(root: Path, ids_and_texts: list[tuple[str, str]]) -> Path:
    """The same texts as ``.py`` files whose names sort in record order and hash to the split of the record's id
    (the order matters across splits too: of two copies of a text, the first one read is kept)."""
    root.mkdir(parents=True)
    for n, (doc_id, text) in enumerate(ids_and_texts):
        k = 0
        while split_of(name := f"{n:04d}_{k}.py", VF) != split_of(doc_id, VF):
            k += 1
        (root / name).write_text(text, encoding="utf-8")
    return root


def _build(src: str | Path, tok_dir: Path, out: Path, **kw) -> dict:
    return build_corpus([src], tok_dir, out, val_fraction=VF, workers=kw.pop("workers", 1), shard_tokens=100,
                        show_progress=False, **kw)


def _assert_same_corpus(a: Path, b: Path) -> None:
    ia, ib = load_index(a), load_index(b)
    assert ia["splits"] == ib["splits"] and ia["skipped"] == ib["skipped"]
    assert ia["splits"]["train"]["documents"] + ia["splits"]["val"]["documents"] == 26  # 29 less 2 copies, 1 blank
    assert ia["skipped"] == {"unreadable": 0, "non_utf8": 0, "duplicate": 2, "empty": 1, "bad_record": 0,
                             "contaminated": 0}
    assert len(ia["splits"]["train"]["shards"]) > 1
    for split in ("train", "val"):
        for name in ia["splits"][split]["shards"]:
            assert (a / name).read_bytes() == (b / name).read_bytes()


# ----------------------------------------------------------------------------- same shards as files
@pytest.mark.parametrize("name", ["data.jsonl", "data.jsonl.gz", "data.json", "data.parquet"])
def test_record_files_give_the_shards_of_the_same_texts_as_files(name: str, tok_dir: Path, tok: Tokenizer,
                                                                  tmp_path: Path) -> None:
    path = _write(tmp_path / "in" / name, _records(TEXTS))
    files = _as_files(tmp_path / "files", [(f"{name}:{k}", t) for k, t in enumerate(TEXTS, 1)])
    index = _build(path, tok_dir, tmp_path / "records")
    _build(files, tok_dir, tmp_path / "from_files")
    _assert_same_corpus(tmp_path / "records", tmp_path / "from_files")
    assert (index["files_seen"], index["records_read"]) == (1, len(TEXTS))


def test_hf_dataset_streams_through_datasets_into_the_same_shards(tok_dir: Path, tmp_path: Path, monkeypatch) -> None:
    import datasets
    calls, real = [], datasets.load_dataset

    def load_dataset(path, config=None, **kw):  # the real loader, on a local directory instead of the Hub
        calls.append((path, config, kw))
        return real(path, config, **kw)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    _write(tmp_path / "hub" / "data" / "train.jsonl", _records(TEXTS))
    name = f"hf:{tmp_path / 'hub'}@train"
    files = _as_files(tmp_path / "files", [(f"{name}:{k}", t) for k, t in enumerate(TEXTS, 1)])
    index = _build(name, tok_dir, tmp_path / "hf")
    _build(files, tok_dir, tmp_path / "from_files")
    assert calls == [(str(tmp_path / "hub"), None, {"split": "train", "streaming": True})]
    _assert_same_corpus(tmp_path / "hf", tmp_path / "from_files")
    assert (index["files_seen"], index["records_read"], index["sources"]) == (0, len(TEXTS), [name])


def test_output_is_identical_for_one_and_two_workers_from_records(tok_dir: Path, tmp_path: Path) -> None:
    path = _write(tmp_path / "data.jsonl", _records(TEXTS * 3))  # duplicates across the copies too
    for workers in (1, 2):
        _build(path, tok_dir, tmp_path / f"w{workers}", workers=workers)
    index = load_index(tmp_path / "w1")
    assert index == load_index(tmp_path / "w2") and index["skipped"]["duplicate"] == 3 * 29 - 26 - 3
    for name in index["splits"]["train"]["shards"] + index["splits"]["val"]["shards"]:
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes()


def test_tokenizer_texts_are_the_corpus_documents_of_the_split(tok_dir: Path, tok: Tokenizer, tmp_path: Path) -> None:
    path = _write(tmp_path / "data.parquet", _records(TEXTS))
    _build(path, tok_dir, tmp_path / "out")
    for split in ("train", "val"):
        ids = np.concatenate(read_split(tmp_path / "out", split)).tolist()
        texts = list(iter_split_texts([path], split, val_fraction=VF))
        assert tok.encode_batch(texts) and ids == [i for t in texts for i in tok.encode(t) + [tok.end_id]]


# ----------------------------------------------------------------------------- bad records
def test_a_record_without_the_text_field_names_file_line_and_fields(tok_dir: Path, tmp_path: Path) -> None:
    recs = [{"content": "a = 1\n"}, {"content": "b = 2\n"}, {"body": "c = 3\n", "id": 3}]
    path = _write(tmp_path / "data.jsonl", recs)
    with pytest.raises(ConfigError, match=r"data.jsonl:3: pretraining record has no field 'content' or 'text' "
                                          r"\(fields present: body, id\); --text-field NAME reads another field, "
                                          r"--skip-bad skips"):
        _build(path, tok_dir, tmp_path / "out")
    with pytest.raises(ConfigError, match=r"data.parquet:1: pretraining record has no field 'body'"):
        _build(_write(tmp_path / "data.parquet", recs[:2]), tok_dir, tmp_path / "out", text_fields=("body",))
    with pytest.raises(ConfigError, match=r"data.jsonl:1: field 'content' of a pretraining record must be str or "
                                          r"bytes, got int"):
        _build(_write(tmp_path / "data.jsonl", [{"content": 7}]), tok_dir, tmp_path / "out")


def test_skip_bad_counts_bad_records_by_reason(tok_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    good = [json.dumps({"content": t}) for t in TEXTS[:20]]
    path.write_text("\n".join(good[:5] + ['{"body": "x"}', "{not json", "[1, 2]", '{"content": "\\ud800"}']
                              + good[5:]) + "\n")
    index = _build(path, tok_dir, tmp_path / "out", skip_bad=True)
    assert index["skipped"] == {"unreadable": 0, "non_utf8": 1, "duplicate": 0, "empty": 0, "bad_record": 3,
                                "contaminated": 0}
    assert index["bad_records"]["reasons"] == {"missing_field": 1, "bad_json": 1, "invalid": 1}
    assert index["bad_records"]["examples"][0].endswith("data.jsonl:6: pretraining record has no field 'content' "
                                                        "or 'text' (fields present: body)")
    assert index["records_read"] == 21  # 20 good + the lone surrogate, which is a record but not UTF-8 text
    assert index["splits"]["train"]["documents"] + index["splits"]["val"]["documents"] == 20
    by_field = _build(path, tok_dir, tmp_path / "body", skip_bad=True, text_fields=("body", "content"))
    assert by_field["skipped"]["bad_record"] == 2 and by_field["records_read"] == 22


# ----------------------------------------------------------------------------- --max-bytes
def test_max_bytes_stops_reading_once_the_cap_is_reached(tok_dir: Path, tmp_path: Path) -> None:
    texts = [f"x_{i:04d} = {'#' * 90}\n" for i in range(200)]  # 100 bytes each
    assert {len(t.encode()) for t in texts} == {100}
    path = _write(tmp_path / "data.jsonl", [{"content": t} for t in texts])
    index = _build(path, tok_dir, tmp_path / "out", max_bytes=3050)
    assert index["max_bytes"] == 3050 and index["records_read"] == 31  # the 31st reaches the cap; none read after
    assert index["splits"]["train"]["bytes"] + index["splits"]["val"]["bytes"] == 3100
    for split in ("train", "val"):
        assert index["splits"][split]["documents"] == sum(split_of(f"data.jsonl:{k}", VF) == split
                                                          for k in range(1, 32))
    train = list(iter_split_texts([path], "train", val_fraction=VF, max_bytes=1000))  # the tokenizer's sample
    assert train == [t for k, t in enumerate(texts, 1) if split_of(f"data.jsonl:{k}", VF) == "train"][:10]


# ----------------------------------------------------------------------------- which sources
def test_sources_are_files_record_files_globs_and_datasets(tmp_path: Path) -> None:
    _write(tmp_path / "shards" / "a" / "x.jsonl.gz", [{"content": "a"}])
    _write(tmp_path / "shards" / "b" / "x.parquet", [{"content": "b"}])
    (tmp_path / "repo" / "pkg").mkdir(parents=True)
    (tmp_path / "repo" / "pkg" / "m.py").write_text("m = 1\n")
    _write(tmp_path / "repo" / "package.json", [{"name": "not a record source: the directory has .py files"}])
    found = collect_sources([tmp_path / "shards", f"{tmp_path}/shards/**/*.parquet", tmp_path / "repo",
                             tmp_path / "repo" / "package.json", "hf:org/name:python@train"])
    assert [(type(s), getattr(s, "relpath", getattr(s, "name", None))) for s in found] == [
        (RecordFile, "a/x.jsonl.gz"), (RecordFile, "b/x.parquet"),  # the glob's match was listed already
        (SourceFile, "pkg/m.py"), (RecordFile, "package.json"), (HubSource, "hf:org/name:python@train")]
    assert [s.relpath for s in collect_sources([f"{tmp_path}/shards/*/x.*"])] == ["a/x.jsonl.gz", "b/x.parquet"]
    assert [type(s) for s in collect_sources([tmp_path / "repo" / "package.json"], extensions=(".json",))] == [SourceFile]
    assert len(collect_sources([tmp_path / "shards", tmp_path / "repo"], max_files=2)) == 2


def test_source_errors_say_what_to_fix(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(ConfigError, match=r"'.*/nothing\*.jsonl' matches no file; fix the pattern"):
        collect_sources([f"{tmp_path}/nothing*.jsonl"])
    with pytest.raises(ConfigError, match=r"'hf:org/name@': expected hf:ORG/NAME\[:CONFIG\]\[@SPLIT\]"):
        collect_sources(["hf:org/name@"])
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ConfigError, match=r"'hf:org/name' needs the `datasets` package, which is not installed: "
                                          r"pip install 'codechat\[data\]'"):
        collect_sources(["hf:org/name"])
    _write(tmp_path / "x.parquet", [{"content": "a"}])
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ConfigError, match=r"x.parquet: reading a .parquet file needs the `pyarrow` package"):
        collect_sources([tmp_path / "x.parquet"])  # before any work, not when the file is reached


def test_json_files_are_json_lines_or_one_array_and_parquet_rows_count_across_batches(tmp_path: Path) -> None:
    _write(tmp_path / "lines.json", [{"content": "a"}, {"content": "b"}])
    (tmp_path / "array.json").write_text(json.dumps([{"content": "a"}, {"content": "b"}], indent=1))
    (tmp_path / "one.json").write_text(json.dumps({"content": "a"}) + "\n")
    assert list(read_rows(tmp_path / "lines.json")) == list(read_rows(tmp_path / "array.json"))
    assert list(read_rows(tmp_path / "one.json")) == [(1, {"content": "a"})]
    rows = list(read_rows(_write(tmp_path / "big.parquet", [{"content": str(k)} for k in range(2500)])))
    assert rows[0] == (1, {"content": "0"}) and rows[-1] == (2500, {"content": "2499"}) and len(rows) == 2500


# ----------------------------------------------------------------------------- memory
@pytest.mark.parametrize("name", ["big.jsonl.gz", "big.parquet"])
def test_reading_holds_one_record_or_batch_not_the_file(name: str, tmp_path: Path) -> None:
    records = [{"content": f"# document {k}\n" + "x = 1  # filler filler filler\n" * 32, "meta": k}
               for k in range(15000)]  # ~15 MB of text
    path = _write(tmp_path / name, records)
    del records
    tracemalloc.start()
    n_bytes = sum(n for _, _, _, n in split_documents(collect_sources([path]), VF))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n_bytes > 14_000_000
    assert peak < 5_000_000, f"reading {n_bytes} bytes of text peaked at {peak} bytes of Python memory"


# ----------------------------------------------------------------------------- CLIs
def test_cli_builds_a_corpus_from_a_glob_of_gzipped_jsonl(tok_dir: Path, tmp_path: Path) -> None:
    for part in (0, 1):
        _write(tmp_path / "shards" / f"part{part}.jsonl.gz",
               [{"body": t} for t in TEXTS[part::2]] + [{"id": "no body"}])
    cmd = [sys.executable, "-m", "codechat", "data", "corpus", "--src", f"{tmp_path}/shards/*.jsonl.gz",
           "--text-field", "body", "--skip-bad", "--tokenizer", str(tok_dir), "--out", str(tmp_path / "out"),
           "--val-fraction", str(VF), "--workers", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    index = load_index(tmp_path / "out")
    assert (index["files_seen"], index["records_read"], index["skipped"]["bad_record"]) == (2, len(TEXTS), 2)
    assert f"files seen: 2, records read: {len(TEXTS)}, skipped: " in proc.stdout
    assert "skipped: " + str(tmp_path / "shards" / "part0.jsonl.gz") + ":16: pretraining record has no field 'body'" \
        in proc.stdout


def test_tokenizer_train_reads_the_same_sources(tmp_path: Path) -> None:
    lines = Path(json.__file__).with_name("decoder.py").read_text().splitlines(keepends=True)
    texts = ["".join(lines[k:k + 4]) for k in range(0, len(lines), 4)]
    path = _write(tmp_path / "data.parquet", [{"text": t} for t in texts])
    parser = argparse.ArgumentParser()
    tokenizer_cli.add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["tokenizer", "train", "--src", str(path), "--vocab-size", "320", "--max-bytes", "2000",
                              "--val-fraction", str(VF), "--out", str(tmp_path / "tok")])
    assert (args.src, args.text_fields, args.max_bytes) == ([str(path)], ["content", "text"], 2000)
    assert args.func(args) == 0
    sample = list(iter_split_texts([path], "train", val_fraction=VF, max_bytes=2000))
    assert 2000 <= sum(len(t.encode()) for t in sample) < 2000 + max(len(t.encode()) for t in sample)
    assert sample == [t for k, t in enumerate(texts, 1) if split_of(f"data.parquet:{k}", VF) == "train"][:len(sample)]
    expected = train_tokenizer(sample, 320, show_progress=False)
    trained = Tokenizer.load(tmp_path / "tok")
    assert trained.vocab_size == expected.vocab_size == 320
    assert [trained.token_bytes(i) for i in range(320)] == [expected.token_bytes(i) for i in range(320)]
    legacy = parser.parse_args(["tokenizer", "stats", "--tokenizer", str(tmp_path / "tok"), "--corpus", str(path)])
    assert legacy.src == [str(path)]


def test_data_commands_do_not_load_torch_and_checkpoint_errors_stay_one_line(tok_dir: Path, tmp_path: Path,
                                                                             capsys) -> None:
    check = ("import sys; from codechat.cli import main; rc = main(sys.argv[1:]); "
             "print(rc, 'torch' in sys.modules, 'datasets' in sys.modules, 'pyarrow' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", check, "tokenizer", "encode", "--tokenizer", str(tok_dir), "x = 1"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.stdout.splitlines()[-1] == "0 False False False", run.stdout + run.stderr
    from codechat.cli import main
    assert main(["sample", "--model", str(tmp_path), "--prompt", "x"]) == 2  # a CheckpointError, still caught
    assert capsys.readouterr().err.strip().splitlines() == [
        f"codechat sample: error: {tmp_path}: holds no checkpoint (expected {tmp_path}/checkpoints/step_NNNNNN/)"]
