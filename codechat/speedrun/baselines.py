"""Compression baselines of a run's validation split: what a model's bits per byte must beat."""
from __future__ import annotations

import gzip
import lzma
from pathlib import Path
from typing import Sequence

from codechat.data.corpus import read_split
from codechat.tokenizer import Tokenizer


def compression_baselines(docs: Sequence[bytes]) -> dict[str, float]:
    """Bits per byte of classic compressors on the validation documents.

    ``gzip_bpb``: ``gzip -9`` on each document on its own, total compressed bits over total
    bytes — the fair comparison for a model that starts fresh at every document.
    ``gzip_concat_bpb`` / ``xz_concat_bpb``: the whole split compressed as one stream.
    (Headers are counted, as a file on disk would count them.)
    """
    total = sum(len(d) for d in docs)
    if total == 0:
        raise ValueError("no validation bytes to compress")
    per_doc = sum(len(gzip.compress(d, compresslevel=9, mtime=0)) for d in docs)
    joined = b"".join(docs)
    return {"gzip_bpb": 8 * per_doc / total,
            "gzip_concat_bpb": 8 * len(gzip.compress(joined, compresslevel=9, mtime=0)) / total,
            "xz_concat_bpb": 8 * len(lzma.compress(joined, preset=9)) / total,
            "val_bytes": total, "val_documents": len(docs)}


def validation_baselines(run: Path) -> dict[str, float]:
    """:func:`compression_baselines` of run directory ``run``'s validation documents."""
    return compression_baselines(_val_documents(Tokenizer.load(run / "tokenizer"), run / "data"))


def _val_documents(tok: Tokenizer, data_dir: Path) -> list[bytes]:
    """The validation documents as UTF-8 bytes, decoded back from the shards (split on ``<|end|>``)."""
    docs: list[bytes] = []
    for shard in read_split(data_dir, "val"):
        ids = shard.tolist()
        start = 0
        for i, t in enumerate(ids):
            if t == tok.end_id:
                docs.append(tok.decode(ids[start:i]).encode("utf-8"))
                start = i + 1
    return docs
