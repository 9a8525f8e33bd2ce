"""The ``codechat tokenizer`` command: train the BPE on a corpus's train split, encode a text,
and measure bytes per token on the val split.

It joins :mod:`codechat.tokenizer`, which takes texts only, and :mod:`codechat.data.sources`,
which reads the same sources as ``codechat data corpus`` (source files, data files of records,
``hf:`` datasets) into texts, with the same train/val split.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Iterable
from typing import Any

from codechat.config.stages import DataConfig
from codechat.data.sources import add_source_args, iter_split_texts
from codechat.tokenizer import Tokenizer, bytes_per_token, train_tokenizer


def _split_texts(args: argparse.Namespace, split: str) -> Iterable[str]:
    return iter_split_texts(args.src, split, extensions=tuple(args.ext), val_fraction=args.val_fraction,
                            max_files=args.max_files, max_bytes=args.max_bytes, text_fields=tuple(args.text_fields),
                            skip_bad=args.skip_bad)


def _cmd_train(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    tok = train_tokenizer(_split_texts(args, "train"), args.vocab_size, min_frequency=args.min_frequency)
    out = tok.save(args.out)
    print(f"trained {tok!r} on the train split in {time.perf_counter() - start:.1f} s -> {out}")
    return 0


def _cmd_encode(args: argparse.Namespace) -> int:
    tok = Tokenizer.load(args.tokenizer)
    ids = tok.encode(args.text)
    print(f"{len(ids)} tokens: {ids}")
    print("pieces:", [tok.token_bytes(i).decode("utf-8", errors="replace") for i in ids])
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    texts = list(_split_texts(args, "val"))
    candidates = [("ours", args.tokenizer)] + ([("gpt2", args.gpt2)] if args.gpt2 else [])
    for name, path in candidates:
        tok = Tokenizer.load(path)
        bpt, n_tokens, n_bytes = bytes_per_token(tok, texts)
        print(f"{name}: {bpt:.3f} bytes/token on the val split ({n_tokens} tokens, {n_bytes} bytes, "
              f"{len(texts)} documents, vocab {tok.vocab_size})")
    return 0


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``tokenizer {train,encode,stats}`` on ``subparsers`` (from ``add_subparsers()``)."""
    parser = subparsers.add_parser("tokenizer", help="train, inspect and measure the BPE tokenizer",
                                   description="Train, inspect and measure the byte-level BPE tokenizer.")
    sub = parser.add_subparsers(dest="tokenizer_command", required=True)

    p = sub.add_parser("train", help="train a BPE on the train split of a source corpus",
                       description="Train a byte-level BPE (GPT-4 regex, 256 byte symbols) on the train split "
                                   "only, so `tokenizer stats` on the val split is honest. --max-bytes trains on "
                                   "the first N bytes of it: a sample of a dataset too large to read whole.")
    add_source_args(p, src_flags=("--corpus", "--src"))
    p.add_argument("--vocab-size", type=int, default=DataConfig.vocab_size, metavar="N",
                   help="ids in total, special tokens included (default: %(default)s)")
    p.add_argument("--min-frequency", type=int, default=2, metavar="N",
                   help="merge only pairs seen at least N times (default: %(default)s)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write the tokenizer to")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("encode", help="print the ids and pieces of a text",
                       description="Encode TEXT as ordinary text and print its ids and the piece of each.")
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="tokenizer directory or tokenizer.json")
    p.add_argument("text", metavar="TEXT", help="text to encode")
    p.set_defaults(func=_cmd_encode)

    p = sub.add_parser("stats", help="bytes per token on the held-out split",
                       description="Print UTF-8 bytes per token on the val split of a corpus, for our tokenizer "
                                   "and, with --gpt2, for GPT-2's in the same run.")
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="tokenizer directory or tokenizer.json")
    p.add_argument("--gpt2", metavar="DIR", help="GPT-2 directory (encoder.json + vocab.bpe) to compare with")
    add_source_args(p, src_flags=("--corpus", "--src"))
    p.set_defaults(func=_cmd_stats)
    return parser


__all__ = ["add_cli"]
