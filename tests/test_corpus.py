"""Corpus: file discovery, fixed splits, skipping bad files, shards that decode back to the documents."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from codechat.config.stages import ConfigError, default_corpus_dirs
from codechat.data.corpus import _token_dtype, add_cli, build_corpus, load_index, read_split
from codechat.data.sources import SourceFile, Skipped, collect_files, iter_split_texts, read_documents, split_of
from codechat.tokenizer import Tokenizer

from conftest import FIXTURES, N_FILES, VAL_FRACTION

MINI_MBPP = FIXTURES / "cases_a" / "mbpp_mini.jsonl"  # MBPP-shaped: test problems 11-14 and 510


def _split_docs(ids: list[int], end_id: int) -> list[list[int]]:
    docs, start = [], 0
    for pos, i in enumerate(ids):
        if i == end_id:
            docs.append(ids[start:pos])
            start = pos + 1
    assert start == len(ids), "the last document must end with the end id"
    return docs


def _files(root: Path, contents: dict[str, bytes]) -> Path:
    for rel, data in contents.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


# ----------------------------------------------------------------------------- discovery and splits
def test_collect_files_sorts_and_skips_hidden_cache_and_site_packages(tmp_path: Path) -> None:
    root = _files(tmp_path / "src", {"b.py": b"b", "a/z.py": b"z", "a/y.txt": b"y", ".git/h.py": b"h",
                                     "__pycache__/c.py": b"c", "lib/site-packages/d.py": b"d", "lib/e.py": b"e"})
    single = _files(tmp_path, {"one.txt": b"x"}) / "one.txt"
    files = collect_files([root, single, root / "b.py"])
    assert [f.relpath for f in files] == ["a/z.py", "b.py", "lib/e.py", "one.txt"]
    assert files[0] == SourceFile(root.resolve(), "a/z.py", (root / "a/z.py").resolve())
    assert [f.relpath for f in collect_files([root], max_files=2)] == ["a/z.py", "b.py"]


def test_collect_files_errors_name_the_missing_source_and_the_search(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'.*nowhere' does not exist"):
        collect_files([tmp_path / "nowhere"])
    _files(tmp_path, {"notes.txt": b"x"})
    with pytest.raises(ConfigError, match=r"no files with extensions \['.py'\] under \[.*" + tmp_path.name):
        collect_files([tmp_path])


def test_split_of_is_a_fixed_hash_of_the_relative_path() -> None:
    assert split_of("email/__init__.py", 0.05) == "val"  # its sha256 bucket is ~0.0129
    assert split_of("email/__init__.py", 0.01) == "train"
    assert split_of("json/decoder.py", 0.2) == "train"  # ~0.231
    assert split_of("json/decoder.py", 0.25) == "val"
    paths = [f"pkg/mod_{i}.py" for i in range(4000)]
    val = [p for p in paths if split_of(p, 0.1) == "val"]
    assert 0.08 < len(val) / len(paths) < 0.12
    assert all(split_of(p, 0.2) == "val" for p in val)  # a larger fraction only adds to val


# ----------------------------------------------------------------------------- reading
def test_read_documents_skips_and_counts_bad_files_and_duplicates(tmp_path: Path) -> None:
    root = _files(tmp_path, {"a.py": b"x = 1\n", "b.py": b"x = 1\n", "bad.py": b"s = '\xff\xfe'\n", "empty.py": b"",
                             "blank.py": b"  \n\n", "c.py": "s = 'é'\n".encode()})
    (root / "dangling.py").symlink_to(root / "gone.py")
    skipped = Skipped()
    docs = list(read_documents(collect_files([root]), skipped))
    assert docs == [("a.py", "x = 1\n", 6), ("c.py", "s = 'é'\n", 9)]
    assert skipped.as_dict() == {"unreadable": 1, "non_utf8": 1, "duplicate": 1, "empty": 2, "bad_record": 0}
    assert list(read_documents([SourceFile(root, "a.py", root / "a.py")], skipped)) == []  # seen before
    assert skipped.duplicate == 2


# ----------------------------------------------------------------------------- shards
def test_corpus_shards_decode_to_the_documents_in_file_order(corpus_dir: Path, tok: Tokenizer) -> None:
    index = load_index(corpus_dir)
    assert (index["dtype"], index["vocab_size"], index["end_id"]) == ("uint16", tok.vocab_size, tok.end_id)
    assert index["files_seen"] == N_FILES
    files = collect_files(default_corpus_dirs(), max_files=N_FILES)
    skipped = Skipped()
    read = list(read_documents(files, skipped))  # one pass: a duplicate loses to the first copy, of either split
    for split in ("train", "val"):
        info = index["splits"][split]
        shards = read_split(corpus_dir, split)
        assert all(s.dtype == np.uint16 for s in shards)
        ids = np.concatenate(shards).tolist()
        expected = [t for doc_id, t, _ in read if split_of(doc_id, VAL_FRACTION) == split]
        docs = _split_docs(ids, tok.end_id)
        assert len(docs) == info["documents"] == len(expected)
        assert len(ids) == info["tokens"]
        assert info["bytes"] == sum(len(t.encode("utf-8")) for t in expected)
        assert [tok.decode(d) for d in docs] == expected
        assert list(iter_split_texts(default_corpus_dirs(), split, val_fraction=VAL_FRACTION,
                                     max_files=N_FILES)) == expected
        assert not {i for d in docs for i in d} & tok.special_ids
    assert index["skipped"] == {**skipped.as_dict(), "contaminated": 0} and index["decontamination"] is None


def test_output_is_identical_for_one_and_two_workers(tok_dir: Path, tmp_path: Path) -> None:
    outs = {}
    for workers in (1, 2):
        outs[workers] = tmp_path / f"w{workers}"
        build_corpus(default_corpus_dirs(), tok_dir, outs[workers], val_fraction=0.2, max_files=60, workers=workers,
                     shard_tokens=20_000, show_progress=False)
    index = load_index(outs[1])
    assert index == load_index(outs[2])
    names = index["splits"]["train"]["shards"] + index["splits"]["val"]["shards"]
    assert len(index["splits"]["train"]["shards"]) > 1
    for name in names:
        assert (outs[1] / name).read_bytes() == (outs[2] / name).read_bytes()
    assert all(shard[-1] == index["end_id"] for shard in read_split(outs[1], "train"))  # whole documents per shard


def test_rebuild_removes_shards_the_new_index_does_not_list(tok_dir: Path, tmp_path: Path, write_corpus) -> None:
    src = write_corpus(tmp_path / "src", {"train": ["a = 1\n", "b = 2\n", "c = 3\n"], "val": ["d = 4\n"]}, 0.5)
    build_corpus([src], tok_dir, tmp_path / "out", val_fraction=0.5, workers=1, shard_tokens=1, show_progress=False)
    assert sorted(p.name for p in (tmp_path / "out").glob("train_*.bin")) == [f"train_00{i}.bin" for i in range(3)]
    build_corpus([src], tok_dir, tmp_path / "out", val_fraction=0.5, workers=1, show_progress=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["index.json", "train_000.bin", "val_000.bin"]


def test_token_dtype_widens_past_65536_ids() -> None:
    assert (_token_dtype(65536), _token_dtype(65537)) == ("uint16", "uint32")


# ----------------------------------------------------------------------------- errors
def test_empty_corpus_and_missing_source_fail_before_any_work(tok_dir: Path, tmp_path: Path) -> None:
    _files(tmp_path / "src", {"readme.md": b"hi"})
    with pytest.raises(ConfigError, match="no files with extensions"):
        build_corpus([tmp_path / "src"], tok_dir, tmp_path / "out", show_progress=False)
    with pytest.raises(ConfigError, match="nowhere' does not exist"):
        build_corpus([tmp_path / "nowhere"], tok_dir, tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()


def test_a_split_without_files_or_documents_is_an_error(tok_dir: Path, tmp_path: Path, write_corpus) -> None:
    only_train = write_corpus(tmp_path / "a", {"train": ["x = 1\n"]}, 0.05)
    with pytest.raises(ConfigError, match="val split has none of the 1 files.*--val-fraction"):
        build_corpus([only_train], tok_dir, tmp_path / "out", val_fraction=0.05, show_progress=False)
    empty_val = write_corpus(tmp_path / "b", {"train": ["x = 1\n"], "val": ["   \n"]}, 0.5)
    with pytest.raises(ConfigError, match="val split has no readable, non-empty, unique documents"):
        build_corpus([empty_val], tok_dir, tmp_path / "out", val_fraction=0.5, workers=1, show_progress=False)


def test_bad_settings_name_the_option(tok_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--val-fraction must be in"):
        build_corpus([tmp_path], tok_dir, tmp_path / "out", val_fraction=1.0)


def test_index_and_shard_problems_are_clear_errors(corpus_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="index.json not found.*codechat data corpus"):
        load_index(tmp_path)
    (tmp_path / "index.json").write_text("{oops")
    with pytest.raises(ConfigError, match="index.json is corrupt"):
        load_index(tmp_path)
    with pytest.raises(ConfigError, match="unknown split 'test'"):
        read_split(corpus_dir, "test")
    copy = tmp_path / "copy"
    copy.mkdir()
    index = load_index(corpus_dir)
    (copy / "index.json").write_text(json.dumps(index))
    for name in index["splits"]["val"]["shards"]:
        (copy / name).write_bytes((corpus_dir / name).read_bytes()[:-2])
    with pytest.raises(ConfigError, match="val shards .* hold .* tokens but index.json says"):
        read_split(copy, "val")
    with pytest.raises(ConfigError, match="train_000.bin listed in index.json is missing"):
        read_split(copy, "train")


# ----------------------------------------------------------------------------- CLI
def test_cli_data_corpus_builds_shards_and_leaves_room_for_more_commands(tok_dir: Path, tmp_path: Path,
                                                                        write_corpus) -> None:
    src = write_corpus(tmp_path / "src", {"train": ["a = 1\n", "b = 2\n"], "val": ["c = 3\n"]}, 0.3)
    parser = argparse.ArgumentParser()
    data_sub = add_cli(parser.add_subparsers(dest="command", required=True))
    data_sub.add_parser("other")
    args = parser.parse_args(["data", "corpus", "--src", str(src), "--tokenizer", str(tok_dir), "--out",
                              str(tmp_path / "out"), "--val-fraction", "0.3", "--workers", "1"])
    assert args.func(args) == 0
    counts = {s: load_index(tmp_path / "out")["splits"][s]["documents"] for s in ("train", "val")}
    assert counts == {"train": 2, "val": 1}
    assert parser.parse_args(["data", "other"]).data_command == "other"


def check_benchmark_documents_left_out(mbpp_file: Path, n_mbpp_test: int, tok_dir: Path, tmp_path: Path,
                                       write_corpus) -> None:
    """A vendored HumanEval solution and a copy of MBPP test asserts are excluded, whichever split they are in;
    a file that only shares a function name is kept; the shards equal a build of the clean files alone."""
    import gzip
    from codechat.data.corpus import benchmark_decontaminator
    from codechat.data.decontam import humaneval_file
    with gzip.open(humaneval_file(), "rt") as f:
        he0 = json.loads(f.readline())
    mbpp = {r["task_id"]: r for r in map(json.loads, mbpp_file.read_text().splitlines())}
    vendored = "# benchmark copy\nimport math\n\n" + he0["prompt"] + he0["canonical_solution"] + "\n\nprint(1)\n"
    asserts = "def test_it():\n    " + "\n    ".join(mbpp[11]["test_list"]) + "\n"
    clean = ["a = 1\n", "def has_close_elements(xs):\n    return len(set(xs)) < len(xs)\n", "b = [2, 3]\n"]
    src = write_corpus(tmp_path / "src", {"train": [clean[0], vendored, clean[1]], "val": [asserts, clean[2]]}, 0.5)
    ref = write_corpus(tmp_path / "ref", {"train": clean[:2], "val": clean[2:]}, 0.5)
    decon = benchmark_decontaminator(mbpp_file)
    index = build_corpus([src], tok_dir, tmp_path / "out", val_fraction=0.5, workers=2, show_progress=False,
                         decontaminator=decon)
    excluded = [(e["problem"], e["part"], e["share"]) for e in index["decontamination"]["excluded"]]
    assert excluded == [("HumanEval/0", "prompt", 1.0), ("MBPP/11", "tests", 1.0)]  # in source order
    assert [e["document"].split("_")[0] for e in index["decontamination"]["excluded"]] == ["train0001", "val0000"]
    assert index["skipped"]["contaminated"] == 2
    assert index["decontamination"]["problems"] == {"HumanEval": 164, "MBPP": n_mbpp_test}
    plain = build_corpus([ref], tok_dir, tmp_path / "plain", val_fraction=0.5, workers=1, show_progress=False)
    for split in ("train", "val"):
        assert index["splits"][split]["documents"] == plain["splits"][split]["documents"]
        assert index["splits"][split]["bytes"] == plain["splits"][split]["bytes"]
        assert np.concatenate(read_split(tmp_path / "out", split)).tolist() == \
            np.concatenate(read_split(tmp_path / "plain", split)).tolist()


def test_documents_holding_a_benchmark_problem_are_left_out_and_listed(tok_dir: Path, tmp_path: Path, write_corpus,
                                                                       shared_dir: Path) -> None:
    check_benchmark_documents_left_out(shared_dir / "data/mbpp/mbpp.jsonl", 500, tok_dir, tmp_path, write_corpus)


def test_documents_holding_a_mini_mbpp_problem_are_left_out_and_listed(tok_dir: Path, tmp_path: Path,
                                                                        write_corpus) -> None:
    """The same on the project's MBPP-shaped file: its test problem 11's asserts are found in a document."""
    check_benchmark_documents_left_out(MINI_MBPP, 5, tok_dir, tmp_path, write_corpus)


WORKER_START_SCRIPT = """
import sys, time
if __name__ == "__mp_main__":  # a spawned worker importing its parent's script: slow, as a torch script's imports
    with open(sys.argv[1], "a") as f:
        print(time.time(), file=f)
    time.sleep({slow_s})
if __name__ == "__main__":
    from codechat.data.corpus import benchmark_decontaminator, build_corpus
    build_corpus([sys.argv[2]], sys.argv[3], sys.argv[4], val_fraction=0.5, workers={workers}, show_progress=False,
                 decontaminator=benchmark_decontaminator(unchecked=()))
"""


def test_workers_start_together_when_the_script_imports_slowly(tok_dir: Path, tmp_path: Path, write_corpus) -> None:
    """Spawned workers re-import the calling script; with a decontaminator (megabytes of n-grams) they must still
    start at once, not one after the other (pretrain_ablation.py: n_workers x its torch imports, minutes)."""
    slow_s, workers = 4.0, 3  # one after the other they would start >= 2 * slow_s apart; margin for a loaded CI
    script = tmp_path / "slow_main.py"
    script.write_text(WORKER_START_SCRIPT.format(slow_s=slow_s, workers=workers))
    src = write_corpus(tmp_path / "src", {"train": ["a = 1\n", "b = 2\n"], "val": ["c = 3\n"]}, 0.5)
    starts = tmp_path / "starts.txt"
    proc = subprocess.run([sys.executable, str(script), str(starts), str(src), str(tok_dir), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert proc.returncode == 0, proc.stderr
    times = [float(t) for t in starts.read_text().split()]
    assert len(times) == workers and load_index(tmp_path / "out")["decontamination"]["problems"] == {"HumanEval": 164}
    assert max(times) - min(times) < slow_s, f"the workers started {max(times) - min(times):.1f} s apart"
