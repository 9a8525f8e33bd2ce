"""Pretraining corpus: sources -> unique documents -> token shards on disk.

``build_corpus`` reads the sources of :mod:`codechat.data.sources` (directories of source files,
by default the running Python's standard library; JSON Lines / JSON / Parquet files of records;
``hf:`` datasets) once, in order, splits the documents into train/val by a fixed hash of their id,
drops unreadable, non-UTF-8, empty and duplicate documents (counted), tokenises in worker
processes and writes flat binary shards plus ``index.json``::

    out/train_000.bin  train_001.bin ...  val_000.bin   # np.uint16 (uint32 above 65536 ids)
    out/index.json                                      # counts, dtype, special ids, shard names

Each document's tokens are followed by exactly one ``<|end|>`` id, inserted by this
pipeline only (text that spells ``<|end|>`` encodes as ordinary tokens). Shards hold whole
documents, in source order, identical for any number of workers and for the same texts
whichever kind of source held them.

Decontamination: given a :class:`codechat.data.decontam.Decontaminator` (HumanEval, optionally MBPP's
test split), each worker checks every document by its n-gram rule before tokenising it; a
document that holds at least the rule's share of some benchmark part's n-grams (its prompt, its
tests or its solution) is left out of both splits, counted as ``contaminated`` and listed in the
index (``decontamination``: document, problem, part and share), the same for any number of workers.

Memory is bounded whatever the input size: the reader holds one document (one Parquet batch)
at a time, at most ``IN_FLIGHT_PER_WORKER`` batches of ``BATCH_BYTES`` per worker are in flight,
and de-duplication keeps a 32-byte hash per document.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import pickle
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tqdm import tqdm

from codechat.config.atomic import write_text
from codechat.config.sft import SFTConfig
from codechat.config.stages import QUALITY_MODES, ConfigError, DataConfig, parse_quality_weights
from codechat.data.quality import QualityReport, copies, score_document
from codechat.data.sources import (SPLITS, HubSource, SourceFile, Skipped, add_source_args, check_split,
                                   collect_sources, split_documents, split_of)
from codechat.tokenizer import Tokenizer

INDEX_FILE = "index.json"
INDEX_VERSION = 1
#: Documents go to a worker in batches of about this many UTF-8 bytes.
BATCH_BYTES = 1 << 18
#: At most this many batches per worker are read ahead of the writer (bounds memory).
IN_FLIGHT_PER_WORKER = 4
#: "spawn" workers start clean: forking a parent that already ran tokenizer or torch
#: threads can deadlock.
MP_START_METHOD = "spawn"


# ----------------------------------------------------------------------------- tokenising workers
_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_dir: str, dtype: str, decontaminator_file: str | None, quality: str = "off",
                 weights: dict[str, float] | None = None) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    tok = Tokenizer.load(tokenizer_dir)
    decon = pickle.loads(Path(decontaminator_file).read_bytes()) if decontaminator_file else None
    _WORKER.update(tok=tok, end=np.array([tok.end_id], dtype=dtype), dtype=dtype, decon=decon,
                   quality=quality, weights=weights or {})


@contextlib.contextmanager
def _pickled(obj: Any) -> Iterator[str | None]:
    """The path of a private temporary file holding ``obj`` pickled (None for None), removed on exit.

    Workers load the decontaminator from it rather than from ``initargs``: a spawned worker reads its
    initargs from a pipe only after importing the parent's ``__main__`` script, so initargs larger than the
    pipe (the decontaminator's n-gram index: 3-6 MB) hold ``Pool()`` until that worker is up, and the workers
    start one after the other (``benchmarks/pretrain_ablation.py``, which imports torch: 189-245 s for a corpus
    the speedrun built in ~18 s on 16 cores)."""
    if obj is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="codechat-corpus-") as tmp:
        path = Path(tmp) / "object.pkl"
        path.write_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        yield str(path)


def _encode_batch(split: str, names: list[str], texts: list[str]
                  ) -> tuple[list[np.ndarray | tuple[str, str, float] | None], list[tuple[str, str, int] | None]]:
    """Each text's ids followed by one ``<|end|>`` id, or, for a text that overlaps a benchmark
    problem, ``(problem, part, share)`` instead (see the module docstring), or None for a train text
    its quality band writes 0 times; beside them each text's ``(band, reason, copies)`` (None with
    ``data.quality`` off or for a contaminated text)."""
    tok, end, dtype, decon = _WORKER["tok"], _WORKER["end"], _WORKER["dtype"], _WORKER["decon"]
    mode, weights = _WORKER["quality"], _WORKER["weights"]
    hits = [decon.overlap(t) if decon is not None else None for t in texts]
    quality: list[tuple[str, str, int] | None] = []
    for name, text, hit in zip(names, texts, hits):
        if mode == "off" or hit is not None:
            quality.append(None)
            continue
        q = score_document(name, text)
        quality.append((q.band, q.reason, copies(weights[q.band], name) if mode == "filter" and split == "train"
                        else 1))
    todo = [t for t, h, q in zip(texts, hits, quality) if h is None and (q is None or q[2] > 0)]
    encoded = iter(tok.encode_batch(todo) if todo else [])
    out: list[np.ndarray | tuple[str, str, float] | None] = []
    for h, q in zip(hits, quality):
        if h is not None:
            out.append((h.problem, h.part, round(h.fraction, 3)))
        elif q is not None and q[2] == 0:
            out.append(None)
        else:
            out.append(np.concatenate([np.asarray(next(encoded), dtype=dtype), end]))
    return out, quality


@dataclass
class _Batch:
    split: str
    names: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # UTF-8 bytes of each text
    total: int = 0  # their sum


def _batches(docs: Iterable[tuple[str, str, str, int]], batch_bytes: int) -> Iterator[_Batch]:
    """Consecutive documents of each split grouped to about ``batch_bytes`` UTF-8 bytes."""
    open_batches: dict[str, _Batch] = {}
    for split, name, text, n_bytes in docs:
        batch = open_batches.setdefault(split, _Batch(split))
        batch.names.append(name)
        batch.texts.append(text)
        batch.sizes.append(n_bytes)
        batch.total += n_bytes
        if batch.total >= batch_bytes:
            yield open_batches.pop(split)
    for batch in open_batches.values():
        if batch.texts:
            yield batch


class _ShardWriter:
    """Appends documents to ``{split}_000.bin, ...``, starting a new shard once one holds ``shard_tokens``."""

    def __init__(self, out_dir: Path, split: str, shard_tokens: int) -> None:
        self.out_dir, self.split, self.shard_tokens = out_dir, split, shard_tokens
        self.shards: list[str] = []
        self.documents = self.tokens = self.bytes = 0
        self._file: BinaryIO | None = None
        self._in_shard = 0

    def write_batch(self, docs: list[np.ndarray], n_bytes: int) -> None:
        """Append ``docs`` (each ending with its end id; a document written twice is in it twice),
        which hold ``n_bytes`` bytes of text."""
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
                 max_files: int = 0, max_bytes: int = 0, text_fields: Sequence[str] = DataConfig.text_fields,
                 skip_bad: bool = False, workers: int = 0, shard_tokens: int = 50_000_000,
                 show_progress: bool = True, decontaminator: Any = None, quality: str = "off",
                 quality_weights: str = DataConfig.quality_weights) -> dict[str, Any]:
    """Tokenise the documents of ``srcs`` into train/val shards under ``out_dir`` and write ``index.json``.

    Workers are spawned processes: a script calling this must do so under
    ``if __name__ == "__main__":``.

    Args:
        srcs: directories, files, globs, data files or ``hf:`` datasets
            (see :func:`codechat.data.sources.collect_sources`).
        tokenizer_dir: anything :meth:`Tokenizer.load` reads; every worker loads it once.
        val_fraction: share of documents, by a hash of their id, that go to val (see :func:`split_of`).
        max_files: read at most this many files (0: all).
        max_bytes: stop reading once the documents taken (both splits) hold this many UTF-8 bytes
            (0: no limit; the last document may cross it).
        text_fields: a record's text is the first of these fields it has.
        skip_bad: count and leave out bad records instead of stopping at the first.
        workers: tokenising processes; 0 means ``os.cpu_count()``.
        shard_tokens: a shard is closed after the document that brings it to this many tokens.
        decontaminator: a :class:`codechat.data.decontam.Decontaminator`; documents overlapping its
            benchmark problems are left out (module docstring). ``None``: no check.
        quality: ``off``, ``report`` or ``filter`` (:mod:`codechat.data.quality`): with ``filter`` each
            train document is written as many times as ``quality_weights`` gives its band (val: once).

    Returns:
        The index (also written to ``out_dir/index.json``): per split its shards, ``documents``,
        ``tokens`` and text ``bytes``; ``files_seen`` (files read, of either kind),
        ``records_read`` (records of data files and datasets), ``skipped`` (documents left out
        by reason: ``unreadable``, ``non_utf8``, ``empty``, ``duplicate``, ``bad_record``,
        ``contaminated``), ``bad_records`` (the reasons and first messages of ``bad_record``),
        ``max_bytes``, ``decontamination`` (``None`` without a check, else the benchmarks and
        problems checked, the rule's ``ngram`` and ``threshold``, and ``excluded``: one
        ``{document, problem, part, share}`` per document left out), ``quality`` (``None`` when off,
        else the mode, the weights and per split and band: ``documents``, ``bytes``, ``written``
        copies, ``written_bytes``, the ``reasons`` counted and the first ``examples``).

    Raises:
        ConfigError: a bad setting, a missing source, no files, a bad record (without
            ``skip_bad``), or a split with no documents.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    if shard_tokens <= 0 or workers < 0 or max_bytes < 0:
        raise ConfigError(f"shard_tokens must be > 0, --workers and --max-bytes >= 0, got {shard_tokens}, {workers} "
                          f"and {max_bytes}")
    if not text_fields:
        raise ConfigError("--text-field must name at least one field")
    if quality not in QUALITY_MODES:
        raise ConfigError(f"quality must be one of {', '.join(QUALITY_MODES)}, got {quality!r}")
    weights = parse_quality_weights(quality_weights)
    sources = collect_sources(srcs, extensions, max_files)
    files_only = all(isinstance(s, SourceFile) for s in sources)
    if files_only:  # known before reading anything
        for split in SPLITS:
            if not any(split_of(s.relpath, val_fraction) == split for s in sources):
                raise _empty_split_error(split, f"has none of the {len(sources)} files", val_fraction)
    tok = Tokenizer.load(tokenizer_dir)  # here first: a Pool whose initializer fails respawns workers forever
    dtype = _token_dtype(tok.vocab_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n_workers = workers or os.cpu_count() or 1
    skipped = Skipped()
    writers = {split: _ShardWriter(out, split, shard_tokens) for split in SPLITS}
    ctx = mp.get_context(MP_START_METHOD)
    excluded: list[dict[str, Any]] = []
    report = QualityReport(quality, weights) if quality != "off" else None
    with _pickled(decontaminator) as decon_file, \
            ctx.Pool(n_workers, initializer=_init_worker,
                     initargs=(str(tokenizer_dir), dtype, decon_file, quality, weights)) as pool, \
            tqdm(total=len(sources) if files_only else None, desc="corpus", unit="doc",
                 disable=not show_progress) as bar:
        docs = split_documents(sources, val_fraction, max_bytes=max_bytes, skipped=skipped, text_fields=text_fields,
                               skip_bad=skip_bad, progress=bar)
        _tokenise(pool, IN_FLIGHT_PER_WORKER * n_workers, docs, writers, excluded, report)
    for split, writer in writers.items():
        if not writer.documents:
            raise _empty_split_error(split, "has no readable, non-empty, unique documents" + (
                f" that data.quality_weights ({quality_weights}) writes" if quality == "filter" else ""), val_fraction)
    splits = {split: writer.summary() for split, writer in writers.items()}
    index = {"version": INDEX_VERSION, "tokenizer": str(Path(tokenizer_dir).resolve()), "vocab_size": tok.vocab_size,
             "dtype": dtype, "end_id": tok.end_id, "bos_id": tok.bos_id, "sources": [_source_name(s) for s in srcs],
             "extensions": list(extensions), "text_fields": list(text_fields), "val_fraction": val_fraction,
             "max_bytes": max_bytes, "files_seen": sum(not isinstance(s, HubSource) for s in sources),
             "records_read": skipped.records.records, "skipped": {**skipped.as_dict(), "contaminated": len(excluded)},
             "bad_records": {"reasons": skipped.records.skipped, "examples": skipped.records.examples},
             "decontamination": None if decontaminator is None else {
                 "problems": dict(decontaminator.benchmarks), "ngram": decontaminator.ngram,
                 "threshold": decontaminator.threshold, "excluded": excluded},
             "quality": report.as_dict() if report is not None else None, "splits": splits}
    write_text(out / INDEX_FILE, json.dumps(index, indent=2))
    _remove_stale_shards(out, splits)
    return index


def _source_name(src: str | os.PathLike) -> str:
    path = Path(src).expanduser()
    return str(path.resolve()) if path.exists() else str(src)  # hf: names and globs as given


def _tokenise(pool: Any, max_in_flight: int, docs: Iterable[tuple[str, str, str, int]],
              writers: dict[str, _ShardWriter], excluded: list[dict[str, Any]],
              report: QualityReport | None = None) -> None:
    """Encode ``(split, doc_id, text, bytes)`` documents on ``pool`` and write each split's in input order, at
    most ``max_in_flight`` batches ahead of the writers; documents a worker found contaminated go to
    ``excluded``, each document's quality band to ``report``."""
    pending: deque[tuple[AsyncResult, _Batch]] = deque()

    def write(result: AsyncResult, batch: _Batch) -> None:
        kept, n_bytes = [], 0
        outs, quality = result.get()
        for out, q, name, size in zip(outs, quality, batch.names, batch.sizes):
            if isinstance(out, tuple):
                excluded.append({"document": name, "problem": out[0], "part": out[1], "share": out[2]})
                continue
            n = 1 if q is None else q[2]
            if report is not None and q is not None:
                report.add(batch.split, name, size, *q)
            kept.extend([out] * n)
            n_bytes += size * n
        writers[batch.split].write_batch(kept, n_bytes)

    for batch in _batches(docs, BATCH_BYTES):
        pending.append((pool.apply_async(_encode_batch, (batch.split, batch.names, batch.texts)), batch))
        while pending and (len(pending) >= max_in_flight or pending[0][0].ready()):
            write(*pending.popleft())
    for item in pending:
        write(*item)
    for writer in writers.values():
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
    check_split(split)
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
def benchmark_decontaminator(mbpp_file: str | os.PathLike | None = None,
                              unchecked: Sequence[str] | None = None) -> Any:
    """The check a corpus gets: HumanEval's 164 problems, plus MBPP's test split from ``mbpp_file``
    (:meth:`codechat.data.decontam.Decontaminator.from_config`, which logs a warning naming the
    ``unchecked`` sources when MBPP is not checked; ``()``: nothing to say, None: a general one)."""
    from codechat.data.decontam import Decontaminator
    return Decontaminator.from_config(SFTConfig(decontam_mbpp=str(mbpp_file or "")), unchecked=unchecked)


def _cmd_corpus(args: argparse.Namespace) -> int:
    decon = benchmark_decontaminator(args.decontam_mbpp, args.src) if args.decontaminate or args.decontam_mbpp else None
    index = build_corpus(args.src, args.tokenizer, args.out, extensions=tuple(args.ext),
                         val_fraction=args.val_fraction, max_files=args.max_files, max_bytes=args.max_bytes,
                         text_fields=tuple(args.text_fields), skip_bad=args.skip_bad, workers=args.workers,
                         decontaminator=decon, quality=args.quality, quality_weights=args.quality_weights)
    for split in SPLITS:
        info = index["splits"][split]
        print(f"{split}: {info['documents']} documents, {info['tokens']} tokens, {info['bytes']} bytes, "
              f"{len(info['shards'])} shards")
    print(f"files seen: {index['files_seen']}, records read: {index['records_read']}, skipped: {index['skipped']} "
          f"-> {Path(args.out) / INDEX_FILE}")
    for example in index["bad_records"]["examples"]:
        print(f"  skipped: {example}")
    for ex in (index["decontamination"] or {}).get("excluded", []):
        print(f"  contaminated: {ex['document']} holds {ex['share']:.0%} of {ex['problem']}'s {ex['part']}")
    for split, q in ((index["quality"] or {}).get("splits") or {}).items():
        print(f"quality ({index['quality']['mode']}), {split}: {q['kept_share']:.1%} of the bytes written; " + "; ".join(
            f"{band} {b['documents']} docs {b['bytes']:,} bytes x{index['quality']['weights'][band]:g}"
            for band, b in q["bands"].items()))
    return 0


def add_cli(subparsers: Any) -> Any:
    """Register ``data corpus`` on ``subparsers``; returns the ``data`` sub-subparsers for more commands."""
    parser = subparsers.add_parser("data", help="build training data", description="Build training data.")
    sub = parser.add_subparsers(dest="data_command", required=True)
    p = sub.add_parser("corpus", help="tokenise source files or datasets into pretraining shards",
                       description="Tokenise source files, JSON Lines / Parquet records or hf: datasets into train/val "
                                   "token shards plus index.json, in one streaming pass with bounded memory. "
                                   "Documents are split by a hash of their path (records: file and line); "
                                   "unreadable, non-UTF-8, empty and duplicate documents are skipped and counted.")
    add_source_args(p, src_flags=("--src",))
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="tokenizer directory (`codechat tokenizer train`)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the shards and index.json")
    p.add_argument("--workers", type=int, default=DataConfig.workers, metavar="N",
                   help="tokenising processes (0: one per CPU core)")
    p.add_argument("--decontaminate", action="store_true",
                   help="leave out documents that overlap a HumanEval problem (its prompt, tests or solution: a share "
                        f"of {SFTConfig.decontam_threshold:g} of its distinct {SFTConfig.decontam_ngram}-grams of "
                        "normalised tokens), listed in index.json")
    p.add_argument("--decontam-mbpp", metavar="PATH",
                   help="MBPP's mbpp.jsonl: check its test split (tasks 11-510) too (implies --decontaminate)")
    p.add_argument("--quality", choices=QUALITY_MODES, default=DataConfig.quality,
                   help="document quality bands (codechat.data.quality): off; report (in index.json); filter (each "
                        "train document written --quality-weights times by its band; val untouched)")
    p.add_argument("--quality-weights", default=DataConfig.quality_weights, metavar="SPEC",
                   help=f"copies per band with --quality filter (default {DataConfig.quality_weights})")
    p.set_defaults(func=_cmd_corpus)
    return sub


__all__ = ["build_corpus", "benchmark_decontaminator", "load_index", "read_split", "add_cli"]
