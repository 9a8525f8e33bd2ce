"""Pretraining sources: ``--src`` items -> one stream of unique documents, each with an id that fixes its split.

A source (:func:`collect_sources`) is

- a directory: every file under it (recursively, skipping ``site-packages``, ``__pycache__`` and
  hidden directories) with one of ``extensions`` is one document. A directory holding no such
  file but data files (``.jsonl`` / ``.json`` / ``.parquet``, each optionally ``.gz``) is read
  as those data files instead;
- a file: a data file (by its name, unless the name ends with one of ``extensions``) is read as
  records; any other file is one document, whatever its extension;
- a glob (``'data/*.parquet'``, ``'shards/**/*.jsonl.gz'``; quoted, so that the shell leaves it):
  each match as above, sorted;
- ``hf:ORG/NAME[:CONFIG][@SPLIT]``: a Hugging Face dataset streamed through ``datasets``
  (split default ``train``), nothing downloaded ahead or cached.

A record's text is its first field of ``text_fields`` (default ``content`` then ``text``) that is
present and not null: a string, or bytes read as UTF-8 like a file's. A record without one, a
field of another type, or a line that is not JSON raises a :class:`~codechat.config.stages.ConfigError`
``FILE:LINE: ...`` naming the fields looked for and those present - or, with ``skip_bad``, is
counted by reason and left out.

Document ids: a file's path relative to the directory (or glob prefix) it was found under, its
name when given directly; a record's ``RELPATH:LINE`` (the 1-based line of a JSON Lines file, row
of a Parquet file, index in a JSON array); a dataset row's ``hf:...:ROW``. :func:`split_of`
hashes the id into train or val.

:func:`read_documents` reads every source once, in order, holding one document (one Parquet batch,
one JSON line) at a time. It skips and counts (:class:`Skipped`) unreadable files, text that is
not UTF-8, empty or whitespace-only text and exact duplicates of an earlier document (of either
split: the first one read is kept), keeping only a 32-byte sha256 per document seen.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codechat.config.stages import ConfigError, DataConfig, default_corpus_dirs
from codechat.data.readers import (EXTENSIONS, HUB_PREFIX, BadRecordError, FormatError, LoadCounts, checked_rows,
                                   hub_rows, is_data_file, is_parquet, parse_hub_name, read_rows, record_field, require)

SPLITS = ("train", "val")
SKIP_DIRS = frozenset({"site-packages", "__pycache__"})  # besides hidden (".name") directories
#: Split hashes are read as a fraction of this many buckets (the first 8 bytes of sha256).
HASH_BUCKETS = 2 ** 64
#: Appended to a bad record's error: the commands that read these sources and take the two flags.
BAD_RECORD_HINT = ("--text-field NAME reads another field, --skip-bad skips and counts such records "
                   "(codechat data corpus, codechat tokenizer train / stats)")


@dataclass(frozen=True)
class SourceFile:
    """A file that is one document: ``root`` is the source it was found under, ``relpath`` is POSIX-style."""

    root: Path
    relpath: str
    path: Path


@dataclass(frozen=True)
class RecordFile:
    """A data file whose records each hold one document; ``root`` and ``relpath`` as in :class:`SourceFile`."""

    root: Path
    relpath: str
    path: Path


@dataclass(frozen=True)
class HubSource:
    """``hf:ORG/NAME[:CONFIG][@SPLIT]``, streamed through ``datasets``."""

    name: str


Source = SourceFile | RecordFile | HubSource


def collect_sources(srcs: Sequence[str | os.PathLike], extensions: Sequence[str] = (".py",),
                    max_files: int = 0) -> list[Source]:
    """The sources of ``srcs`` (see the module docstring), in order: per source, files sorted by relative path.

    A file reached twice is listed once; ``max_files`` > 0 keeps the first ``max_files`` files
    (``hf:`` datasets are not files and always kept).

    Raises:
        ConfigError: a source does not exist, a glob matches nothing, an ``hf:`` name is malformed,
            a Parquet file or dataset needs a package that is not installed, or no file was found.
    """
    ext = tuple(extensions)
    found: list[Source] = []
    seen: set[Path] = set()
    n_files = 0
    try:
        for src in srcs:
            if str(src).startswith(HUB_PREFIX):
                parse_hub_name(str(src))
                require("datasets", f"data source {str(src)!r}")
                found.append(HubSource(str(src)))
                continue
            for root, path in _expand(str(src)):
                for f in _files_of(root, path, ext):
                    if f.path not in seen and not (max_files and n_files >= max_files):
                        seen.add(f.path)
                        found.append(f)
                        n_files += 1
                        if isinstance(f, RecordFile) and is_parquet(f.path):
                            require("pyarrow.parquet", f"{f.path}: reading a .parquet file")
    except FormatError as e:
        raise ConfigError(str(e)) from None
    if not found:
        raise ConfigError(f"no files with extensions {list(ext)} under {[str(s) for s in srcs]} (nor data files: "
                          f"{'/'.join(EXTENSIONS)}, optionally .gz); point --src at source code or data files, "
                          "or change --ext")
    return found


def collect_files(srcs: Sequence[str | os.PathLike], extensions: Sequence[str] = (".py",),
                  max_files: int = 0) -> list[SourceFile]:
    """The files of :func:`collect_sources` that are documents themselves (not data files, not datasets).

    Raises:
        ConfigError: as :func:`collect_sources`.
    """
    return [s for s in collect_sources(srcs, extensions, max_files) if isinstance(s, SourceFile)]


def _expand(src: str) -> list[tuple[Path, Path]]:
    """``(root, path)`` of each path ``src`` names: itself, or the sorted matches of a glob (root: its fixed prefix)."""
    path = Path(src).expanduser()
    if path.exists():
        path = path.resolve()
        return [(path if path.is_dir() else path.parent, path)]
    if not glob.has_magic(src):
        raise ConfigError(f"corpus source {src!r} does not exist; fix the path (--src / --corpus)")
    matches = sorted(glob.glob(os.path.expanduser(src), recursive=True))
    if not matches:
        raise ConfigError(f"corpus source {src!r} matches no file; fix the pattern (--src / --corpus)")
    parts = Path(os.path.expanduser(src)).parts
    prefix = Path(*parts[:next(k for k, part in enumerate(parts) if glob.has_magic(part))] or ["."])
    return [(prefix.resolve(), Path(m).resolve()) for m in matches]


def _files_of(root: Path, path: Path, ext: tuple[str, ...]) -> list[SourceFile | RecordFile]:
    if path.is_file():
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) and path != root else path.name
        kind = RecordFile if is_data_file(path) and not path.name.endswith(ext) else SourceFile
        return [kind(root, rel, path)]
    docs = [SourceFile(root, p.relative_to(root).as_posix(), p) for p in _walk(path, lambda name: name.endswith(ext))]
    if not docs:
        docs = [RecordFile(root, p.relative_to(root).as_posix(), p)
                for p in _walk(path, lambda name: is_data_file(Path(name)))]
    return sorted(docs, key=lambda f: f.relpath)


def _walk(root: Path, keep: Callable[[str], bool]) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
        yield from (Path(dirpath, name) for name in filenames if keep(name))


def split_of(doc_id: str, val_fraction: float) -> str:
    """``"val"`` or ``"train"`` for a document, from sha256 of its id (stable everywhere).

    A document in val at some ``val_fraction`` stays in val at any larger fraction.
    """
    bucket = int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big")
    return "val" if bucket < val_fraction * HASH_BUCKETS else "train"


def check_split(split: str) -> None:
    """Raises ConfigError unless ``split`` is one of :data:`SPLITS`."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; choose one of {SPLITS}")


@dataclass
class Skipped:
    """Documents left out, by reason; ``records`` counts records read and bad ones skipped (``skip_bad``);
    ``seen`` holds the content hashes of the documents kept, for de-duplication."""

    unreadable: int = 0
    non_utf8: int = 0
    duplicate: int = 0
    empty: int = 0  # no bytes, or whitespace only
    records: LoadCounts = field(default_factory=LoadCounts)
    seen: set[bytes] = field(default_factory=set, repr=False)

    def as_dict(self) -> dict[str, int]:
        """The counts by reason; ``bad_record``: records skipped with ``skip_bad`` (reasons in ``records``)."""
        return {"unreadable": self.unreadable, "non_utf8": self.non_utf8, "duplicate": self.duplicate,
                "empty": self.empty, "bad_record": self.records.n_skipped}


def _raw_documents(sources: Iterable[Source], text_fields: Sequence[str], skip_bad: bool,
                   counts: LoadCounts) -> Iterator[tuple[str, str | bytes | None]]:
    """``(doc_id, text or raw bytes)`` of every candidate document; ``None`` for an unreadable file."""
    def text_of(rec: Any) -> str | bytes:
        return record_field(rec, "pretraining record", *text_fields, kind=(str, bytes))

    for s in sources:
        if isinstance(s, SourceFile):
            try:
                yield s.relpath, s.path.read_bytes()
            except OSError:
                yield s.relpath, None
            continue
        name, prefix = (s.name, s.name) if isinstance(s, HubSource) else (str(s.path), s.relpath)
        rows = hub_rows(s.name, streaming=True) if isinstance(s, HubSource) else read_rows(s.path)
        try:
            for line, _, text in checked_rows(rows, name, text_of, skip_bad=skip_bad, counts=counts):
                yield f"{prefix}:{line}", text
        except BadRecordError as e:
            raise ConfigError(f"{e}; {BAD_RECORD_HINT}") from None
        except FormatError as e:  # a .json file that is not JSON, a dataset datasets cannot open
            raise ConfigError(str(e)) from None
        except (OSError, EOFError) as e:
            raise ConfigError(f"{name} cannot be read ({e}); fix or remove it") from None


def read_documents(sources: Iterable[Source], skipped: Skipped | None = None, *,
                   text_fields: Sequence[str] = DataConfig.text_fields, skip_bad: bool = False,
                   progress: Any = None) -> Iterator[tuple[str, str, int]]:
    """``(doc_id, text, UTF-8 bytes)`` of each readable, UTF-8, non-empty document not seen before.

    Skipped documents are counted in ``skipped`` (pass one ``Skipped`` to several calls to
    de-duplicate across them); a bad file is never fatal, a bad record is (see the module
    docstring). ``progress`` (a tqdm bar) advances by one per document read, skipped or not.

    Raises:
        ConfigError: a bad record without ``skip_bad``, a data file that cannot be read, or a dataset
            that ``datasets`` cannot open.
    """
    skipped = skipped if skipped is not None else Skipped()
    for doc_id, raw in _raw_documents(sources, text_fields, skip_bad, skipped.records):
        if progress is not None:
            progress.update()
        if raw is None:
            skipped.unreadable += 1
            continue
        try:
            text, data = (raw.decode("utf-8"), raw) if isinstance(raw, bytes) else (raw, raw.encode("utf-8"))
        except UnicodeError:  # undecodable bytes, or a JSON string with a lone surrogate
            skipped.non_utf8 += 1
            continue
        if not text.strip():
            skipped.empty += 1
            continue
        digest = hashlib.sha256(data).digest()
        if digest in skipped.seen:
            skipped.duplicate += 1
            continue
        skipped.seen.add(digest)
        yield doc_id, text, len(data)


def split_documents(sources: Iterable[Source], val_fraction: float, *, splits: Sequence[str] = SPLITS,
                    max_bytes: int = 0, skipped: Skipped | None = None,
                    **read: Any) -> Iterator[tuple[str, str, str, int]]:
    """``(split, doc_id, text, UTF-8 bytes)`` of the documents of ``splits``, in source order.

    Reading stops once the documents given hold ``max_bytes`` bytes (0: no limit; the last one
    may cross it). ``read`` goes to :func:`read_documents` (``text_fields``, ``skip_bad``, ``progress``).
    """
    total = 0
    for doc_id, text, n_bytes in read_documents(sources, skipped, **read):
        split = split_of(doc_id, val_fraction)
        if split in splits:
            total += n_bytes
            yield split, doc_id, text, n_bytes
            if max_bytes and total >= max_bytes:
                return


def iter_split_texts(srcs: Sequence[str | os.PathLike], split: str, *, extensions: Sequence[str] = (".py",),
                     val_fraction: float = DataConfig.val_fraction, max_files: int = 0, max_bytes: int = 0,
                     text_fields: Sequence[str] = DataConfig.text_fields, skip_bad: bool = False) -> Iterator[str]:
    """Documents of one split of the sources, stopping once ``max_bytes`` UTF-8 bytes were given (0: all).

    The same documents, in the same order, as :func:`codechat.data.corpus.build_corpus` writes
    for that split. Used to train a tokenizer on the train split only and to measure it on val.

    Raises:
        ConfigError: see :func:`collect_sources` and :func:`read_documents`.
    """
    check_split(split)
    sources = collect_sources(srcs, extensions, max_files)
    for _, _, text, _ in split_documents(sources, val_fraction, splits=(split,), max_bytes=max_bytes,
                                      text_fields=text_fields, skip_bad=skip_bad):
        yield text


# ----------------------------------------------------------------------------- CLI options
#: ``--src`` help of ``codechat data corpus`` and ``codechat tokenizer``.
SRC_HELP = ("sources: directories of source files (--ext), files, quoted globs ('data/*.parquet'), data files of "
            "records (.jsonl, .json, .parquet, each optionally .gz; a directory with no --ext file but such files "
            "is read as them) or hf:ORG/NAME[:CONFIG][@SPLIT] datasets, streamed; Parquet and hf: need "
            "pip install 'codechat[data]' (default: this Python's standard library)")


def add_source_args(p: argparse.ArgumentParser, *, src_flags: Sequence[str]) -> None:
    """The source options of ``data corpus`` and ``tokenizer``: ``--src``, ``--ext``, ``--text-field``,
    ``--skip-bad``, ``--val-fraction``, ``--max-files``, ``--max-bytes``."""
    p.add_argument(*src_flags, dest="src", nargs="+", default=list(default_corpus_dirs()), metavar="SRC",
                   help=SRC_HELP)
    p.add_argument("--ext", nargs="+", default=list(DataConfig.extensions), metavar="EXT",
                   help="extensions of the source files read in directories (default: %(default)s)")
    p.add_argument("--text-field", dest="text_fields", nargs="+", default=list(DataConfig.text_fields),
                   metavar="NAME", help="a record's text is the first of these fields it has (default: %(default)s)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip and count records without a text field, or not JSON, instead of stopping at the first")
    p.add_argument("--val-fraction", type=float, default=DataConfig.val_fraction, metavar="F",
                   help="share of documents (by a hash of their path, or file and line) held out for validation; "
                        "the same for `codechat tokenizer` and `codechat data corpus` (default: %(default)s)")
    p.add_argument("--max-files", type=int, default=0, metavar="N", help="read at most N files (0: all)")
    p.add_argument("--max-bytes", type=int, default=0, metavar="N",
                   help="stop reading once the documents taken hold N bytes of text (`tokenizer`: of the split it "
                        "reads; 0: no limit)")


__all__ = ["SPLITS", "BAD_RECORD_HINT", "SourceFile", "RecordFile", "HubSource", "Source", "collect_sources",
           "collect_files", "split_of", "check_split", "Skipped", "read_documents", "split_documents",
           "iter_split_texts", "SRC_HELP", "add_source_args"]
