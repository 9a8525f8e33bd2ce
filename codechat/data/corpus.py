"""Pretraining corpus: source files -> documents -> token shards on disk.

``build_corpus`` reads source files (by default the running Python's standard library),
splits them into train/val by a fixed hash of their relative path, drops unreadable,
non-UTF-8, empty and duplicate files (counted), tokenises in worker processes and writes
flat binary shards plus ``index.json``::

    out/train_000.bin  train_001.bin ...  val_000.bin   # np.uint16 (uint32 above 65536 ids)
    out/index.json                                      # counts, dtype, special ids, shard names

Each document's tokens are followed by exactly one ``<|end|>`` id, inserted by this
pipeline only (text that spells ``<|end|>`` encodes as ordinary tokens). Shards hold whole
documents, in file order, identical for any number of workers.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tqdm import tqdm

from codechat.atomic import write_text
from codechat.config import ConfigError, DataConfig, default_corpus_dirs
from codechat.tokenizer import Tokenizer

SPLITS = ("train", "val")
SKIP_DIRS = frozenset({"site-packages", "__pycache__"})  # besides hidden (".name") directories
INDEX_FILE = "index.json"
INDEX_VERSION = 1
#: Split hashes are read as a fraction of this many buckets (the first 8 bytes of sha256).
HASH_BUCKETS = 2 ** 64
#: Documents go to a worker in batches of about this many UTF-8 bytes.
BATCH_BYTES = 1 << 18
#: At most this many batches per worker are read ahead of the writer (bounds memory).
IN_FLIGHT_PER_WORKER = 4
#: "spawn" workers start clean: forking a parent that already ran tokenizer or torch
#: threads can deadlock.
MP_START_METHOD = "spawn"


@dataclass(frozen=True)
class SourceFile:
    """A file of a corpus: ``root`` is the source it was found under, ``relpath`` is POSIX-style."""

    root: Path
    relpath: str
    path: Path


def collect_files(srcs: Sequence[str | os.PathLike], extensions: Sequence[str] = (".py",),
                  max_files: int = 0) -> list[SourceFile]:
    """Files with one of ``extensions`` under each source, sorted by source then relative path.

    A source is a directory (searched recursively, skipping ``site-packages``, ``__pycache__``
    and hidden directories) or a single file (taken whatever its extension). A file reached
    twice is listed once. ``max_files`` > 0 keeps the first ``max_files``.

    Raises:
        ConfigError: a source does not exist, or no file was found.
    """
    found: list[SourceFile] = []
    seen: set[Path] = set()
    for src in srcs:
        root = Path(src).expanduser().resolve()
        if not root.exists():
            raise ConfigError(f"corpus source {str(src)!r} does not exist; fix the path (--src / --corpus)")
        if root.is_file():
            candidates = [SourceFile(root.parent, root.name, root)]
        else:
            candidates = sorted((SourceFile(root, p.relative_to(root).as_posix(), p)
                                 for p in _walk(root, tuple(extensions))), key=lambda f: f.relpath)
        for f in candidates:
            if f.path not in seen:
                seen.add(f.path)
                found.append(f)
    if not found:
        raise ConfigError(f"no files with extensions {list(extensions)} under {[str(s) for s in srcs]}; "
                          "point --src at source code or change --ext")
    return found[:max_files] if max_files > 0 else found


def _walk(root: Path, extensions: tuple[str, ...]) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
        yield from (Path(dirpath, name) for name in filenames if name.endswith(extensions))


def split_of(relpath: str, val_fraction: float) -> str:
    """``"val"`` or ``"train"`` for a file, from sha256 of its relative path (stable everywhere).

    A file in val at some ``val_fraction`` stays in val at any larger fraction.
    """
    bucket = int.from_bytes(hashlib.sha256(relpath.encode("utf-8")).digest()[:8], "big")
    return "val" if bucket < val_fraction * HASH_BUCKETS else "train"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; choose one of {SPLITS}")


@dataclass
class Skipped:
    """Files left out of a corpus, by reason; ``seen`` holds content hashes for de-duplication."""

    unreadable: int = 0
    non_utf8: int = 0
    duplicate: int = 0
    empty: int = 0  # no bytes, or whitespace only
    seen: set[bytes] = field(default_factory=set, repr=False)

    def as_dict(self) -> dict[str, int]:
        return {"unreadable": self.unreadable, "non_utf8": self.non_utf8, "duplicate": self.duplicate,
                "empty": self.empty}


def read_documents(files: Iterable[SourceFile], skipped: Skipped | None = None) -> Iterator[str]:
    """The text of each readable, UTF-8, non-empty file whose bytes were not seen before.

    Skipped files are counted in ``skipped`` (pass one ``Skipped`` to several calls to
    de-duplicate across them); a bad file is never fatal.
    """
    skipped = skipped if skipped is not None else Skipped()
    for f in files:
        try:
            raw = f.path.read_bytes()
        except OSError:
            skipped.unreadable += 1
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped.non_utf8 += 1
            continue
        if not text.strip():
            skipped.empty += 1
            continue
        digest = hashlib.sha256(raw).digest()
        if digest in skipped.seen:
            skipped.duplicate += 1
            continue
        skipped.seen.add(digest)
        yield text


def iter_split_texts(srcs: Sequence[str | os.PathLike], split: str, *, extensions: Sequence[str] = (".py",),
                     val_fraction: float = DataConfig.val_fraction, max_files: int = 0,
                     max_bytes: int = 0) -> Iterator[str]:
    """Documents of one split of the sources, stopping once ``max_bytes`` UTF-8 bytes were given (0: all).

    The same documents, in the same order, as :func:`build_corpus` writes for that split
    (a val file repeating a train file is dropped). Used to train a tokenizer on the train
    split only and to measure it on val.
    """
    _check_split(split)
    files = collect_files(srcs, extensions, max_files)
    skipped = Skipped()
    for earlier in SPLITS[:SPLITS.index(split)]:  # earlier splits claim duplicates first, as in build_corpus
        deque(read_documents((f for f in files if split_of(f.relpath, val_fraction) == earlier), skipped), maxlen=0)
    total = 0
    for text in read_documents((f for f in files if split_of(f.relpath, val_fraction) == split), skipped):
        if max_bytes and total >= max_bytes:
            return
        total += len(text.encode("utf-8"))
        yield text


# ----------------------------------------------------------------------------- tokenising workers
_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_dir: str, dtype: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    tok = Tokenizer.load(tokenizer_dir)
    _WORKER.update(tok=tok, end=np.array([tok.end_id], dtype=dtype), dtype=dtype)


def _encode_batch(texts: list[str]) -> list[np.ndarray]:
    """Each text's ids followed by one ``<|end|>`` id."""
    tok, end, dtype = _WORKER["tok"], _WORKER["end"], _WORKER["dtype"]
    return [np.concatenate([np.asarray(ids, dtype=dtype), end]) for ids in tok.encode_batch(texts)]


def _batches(docs: Iterable[str], batch_bytes: int) -> Iterator[tuple[list[str], int]]:
    """Consecutive documents grouped to about ``batch_bytes``, with their UTF-8 byte count."""
    batch: list[str] = []
    size = 0
    for text in docs:
        batch.append(text)
        size += len(text.encode("utf-8"))
        if size >= batch_bytes:
            yield batch, size
            batch, size = [], 0
    if batch:
        yield batch, size


class _ShardWriter:
    """Appends documents to ``{split}_000.bin, ...``, starting a new shard once one holds ``shard_tokens``."""

    def __init__(self, out_dir: Path, split: str, shard_tokens: int) -> None:
        self.out_dir, self.split, self.shard_tokens = out_dir, split, shard_tokens
        self.shards: list[str] = []
        self.documents = self.tokens = self.bytes = 0
        self._file: BinaryIO | None = None
        self._in_shard = 0

    def write_batch(self, docs: list[np.ndarray], n_bytes: int) -> None:
        """Append ``docs`` (each ending with its end id), which hold ``n_bytes`` bytes of text."""
        for doc in docs:
            self._write(doc)
        self.bytes += n_bytes

    def _write(self, doc: np.ndarray) -> None:
        if self._file is None:
            self.shards.append(f"{self.split}_{len(self.shards):03d}.bin")
            self._file = open(self._tmp(self.shards[-1]), "wb")
            self._in_shard = 0
        self._file.write(doc.tobytes())
        self._in_shard += len(doc)
        self.tokens += len(doc)
        self.documents += 1
        if self._in_shard >= self.shard_tokens:
            self.close()

    def close(self) -> None:
        """Finish the open shard: rename it from its temporary name."""
        if self._file is not None:
            self._file.close()
            os.replace(self._tmp(self.shards[-1]), self.out_dir / self.shards[-1])
            self._file = None

    def _tmp(self, name: str) -> Path:
        return self.out_dir / f"{name}.tmp"

    def summary(self) -> dict[str, Any]:
        return {"shards": self.shards, "documents": self.documents, "tokens": self.tokens, "bytes": self.bytes}


def _token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size - 1 <= np.iinfo(np.uint16).max else "uint32"


def _empty_split_error(split: str, what: str, val_fraction: float) -> ConfigError:
    return ConfigError(f"the {split} split {what}; add source files (--src) or change --val-fraction "
                       f"(now {val_fraction})")


def build_corpus(srcs: Sequence[str | os.PathLike], tokenizer_dir: str | os.PathLike, out_dir: str | os.PathLike,
                 *, extensions: Sequence[str] = (".py",), val_fraction: float = DataConfig.val_fraction,
                 max_files: int = 0, workers: int = 0, shard_tokens: int = 50_000_000,
                 show_progress: bool = True) -> dict[str, Any]:
    """Tokenise source files into train/val shards under ``out_dir`` and write ``index.json``.

    Workers are spawned processes: a script calling this must do so under
    ``if __name__ == "__main__":``.

    Args:
        srcs: directories or files (see :func:`collect_files`).
        tokenizer_dir: anything :meth:`Tokenizer.load` reads; every worker loads it once.
        val_fraction: share of files, by path hash, that go to val (see :func:`split_of`).
        workers: tokenising processes; 0 means ``os.cpu_count()``.
        shard_tokens: a shard is closed after the document that brings it to this many tokens.

    Returns:
        The index (also written to ``out_dir/index.json``).

    Raises:
        ConfigError: a bad setting, a missing source, no files, or a split with no documents.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    if shard_tokens <= 0 or workers < 0:
        raise ConfigError(f"shard_tokens must be > 0 and --workers >= 0, got {shard_tokens} and {workers}")
    files = collect_files(srcs, extensions, max_files)
    by_split = {s: [f for f in files if split_of(f.relpath, val_fraction) == s] for s in SPLITS}
    for split, split_files in by_split.items():
        if not split_files:
            raise _empty_split_error(split, f"has none of the {len(files)} files", val_fraction)
    tok = Tokenizer.load(tokenizer_dir)  # here first: a Pool whose initializer fails respawns workers forever
    dtype = _token_dtype(tok.vocab_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n_workers = workers or os.cpu_count() or 1
    skipped = Skipped()
    splits: dict[str, dict[str, Any]] = {}
    ctx = mp.get_context(MP_START_METHOD)
    with ctx.Pool(n_workers, initializer=_init_worker, initargs=(str(tokenizer_dir), dtype)) as pool:
        for split, split_files in by_split.items():
            writer = _ShardWriter(out, split, shard_tokens)
            with tqdm(split_files, desc=f"corpus {split}", unit="file", disable=not show_progress) as bar:
                _tokenise(pool, IN_FLIGHT_PER_WORKER * n_workers, read_documents(bar, skipped), writer)
            if not writer.documents:
                raise _empty_split_error(split, "has no readable, non-empty, unique documents", val_fraction)
            splits[split] = writer.summary()
    index = {"version": INDEX_VERSION, "tokenizer": str(Path(tokenizer_dir).resolve()), "vocab_size": tok.vocab_size,
             "dtype": dtype, "end_id": tok.end_id, "bos_id": tok.bos_id,
             "sources": [str(Path(s).expanduser().resolve()) for s in srcs], "extensions": list(extensions),
             "val_fraction": val_fraction, "files_seen": len(files), "skipped": skipped.as_dict(), "splits": splits}
    write_text(out / INDEX_FILE, json.dumps(index, indent=2))
    _remove_stale_shards(out, splits)
    return index


def _tokenise(pool: Any, max_in_flight: int, docs: Iterable[str], writer: _ShardWriter) -> None:
    """Encode ``docs`` on ``pool`` and write them in their input order, at most ``max_in_flight`` batches ahead."""
    pending: deque[tuple[AsyncResult, int]] = deque()
    for batch, n_bytes in _batches(docs, BATCH_BYTES):
        pending.append((pool.apply_async(_encode_batch, (batch,)), n_bytes))
        while pending and (len(pending) >= max_in_flight or pending[0][0].ready()):
            result, done_bytes = pending.popleft()
            writer.write_batch(result.get(), done_bytes)
    for result, done_bytes in pending:
        writer.write_batch(result.get(), done_bytes)
    writer.close()


def _remove_stale_shards(out: Path, splits: dict[str, dict[str, Any]]) -> None:
    """Delete shards of an earlier, larger build in the same directory, which the index no longer lists."""
    for split, info in splits.items():
        for path in out.glob(f"{split}_[0-9][0-9][0-9].bin"):
            if path.name not in info["shards"]:
                path.unlink()


# ----------------------------------------------------------------------------- reading back
def load_index(data_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``index.json`` of a corpus directory.

    Raises:
        ConfigError: the index is missing, not JSON, or not a version this code reads.
    """
    path = Path(data_dir) / INDEX_FILE
    fix = f"build it with `codechat data corpus --out {data_dir}`"
    if not path.is_file():
        raise ConfigError(f"{path} not found: {data_dir} is not a corpus directory; {fix}")
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is corrupt ({e}); {fix}") from None
    if not isinstance(index, dict) or index.get("version") != INDEX_VERSION \
            or set(SPLITS) - set(index.get("splits", {})):
        raise ConfigError(f"{path} is not a version-{INDEX_VERSION} corpus index with splits {SPLITS}; {fix}")
    return index


def read_split(data_dir: str | os.PathLike, split: str) -> list[np.memmap]:
    """Read-only memory maps of each shard of ``split``, in order.

    Raises:
        ConfigError: unknown split, a missing shard, or shards whose length disagrees with the index.
    """
    _check_split(split)
    index = load_index(data_dir)
    info = index["splits"][split]
    shards = []
    for name in info["shards"]:
        path = Path(data_dir) / name
        if not path.is_file():
            raise ConfigError(f"shard {path} listed in {INDEX_FILE} is missing; rebuild the corpus")
        shards.append(np.memmap(path, dtype=index["dtype"], mode="r"))
    if sum(len(s) for s in shards) != info["tokens"]:
        raise ConfigError(f"the {split} shards of {data_dir} hold {sum(len(s) for s in shards)} tokens but "
                          f"{INDEX_FILE} says {info['tokens']}; rebuild the corpus")
    return shards


# ----------------------------------------------------------------------------- CLI
def _cmd_corpus(args: argparse.Namespace) -> int:
    index = build_corpus(args.src, args.tokenizer, args.out, extensions=tuple(args.ext),
                         val_fraction=args.val_fraction, max_files=args.max_files, workers=args.workers)
    for split in SPLITS:
        info = index["splits"][split]
        print(f"{split}: {info['documents']} documents, {info['tokens']} tokens, {info['bytes']} bytes, "
              f"{len(info['shards'])} shards")
    print(f"files seen: {index['files_seen']}, skipped: {index['skipped']} -> {Path(args.out) / INDEX_FILE}")
    return 0


def add_cli(subparsers: Any) -> Any:
    """Register ``data corpus`` on ``subparsers``; returns the ``data`` sub-subparsers for more commands."""
    parser = subparsers.add_parser("data", help="build training data", description="Build training data.")
    sub = parser.add_subparsers(dest="data_command", required=True)
    p = sub.add_parser("corpus", help="tokenise source files into pretraining shards",
                       description="Tokenise source files into train/val token shards plus index.json. Files are "
                                   "split by a hash of their relative path; unreadable, non-UTF-8, empty and "
                                   "duplicate files are skipped and counted.")
    p.add_argument("--src", nargs="+", default=list(default_corpus_dirs()), metavar="DIR",
                   help="source directories or files (default: this Python's standard library)")
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="tokenizer directory (`codechat tokenizer train`)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the shards and index.json")
    p.add_argument("--ext", nargs="+", default=list(DataConfig.extensions), metavar="EXT",
                   help="file extensions to read (default: %(default)s)")
    p.add_argument("--val-fraction", type=float, default=DataConfig.val_fraction, metavar="F",
                   help="share of files held out for validation (default: %(default)s)")
    p.add_argument("--max-files", type=int, default=0, metavar="N", help="read at most N files (0: all)")
    p.add_argument("--workers", type=int, default=DataConfig.workers, metavar="N",
                   help="tokenising processes (0: one per CPU core)")
    p.set_defaults(func=_cmd_corpus)
    return sub


__all__ = ["SourceFile", "Skipped", "collect_files", "split_of", "read_documents", "iter_split_texts",
           "build_corpus", "load_index", "read_split", "add_cli"]
