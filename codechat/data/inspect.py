"""``codechat data inspect``: show exactly what SFT trains on.

Draws the first ``--n`` examples of a data mixture in training order (same seed, budgets and
rendering as SFT), and prints each with its supervised tokens (``mask == 1``) marked: in colour
on a terminal, between ``[[`` and ``]]`` otherwise. Special tokens are spelled out
(``<|assistant|>``...). With ``--json``, one JSON object per line and per example::

    {"source": FILE, "line": N, "format": F, "ids": [...], "mask": [...],
     "supervised_text": ["text of each run of mask 1", ...], "prompt_length": P,
     "prompt_truncated": bool, "completion_truncated": bool, "dropped": null | REASON}

A dropped example (e.g. no assistant turn) is listed with empty ``ids`` and its reason. The
counts of kept, truncated and dropped examples go to stderr with ``--json``, stdout otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from codechat.config.sft import SFT_FORMATS, SFT_MIX_MODES, SFTConfig
from codechat.config.stages import ConfigError

#: ANSI codes around supervised text on a terminal.
COLOR_ON, COLOR_OFF = "\x1b[1;32m", "\x1b[0m"
#: Markers around supervised text when not on a terminal.
MARK_ON, MARK_OFF = "[[", "]]"
#: ``--max-length`` when not given: inspect loads no model whose ``max_seq_len`` it could follow, as SFT does.
DEFAULT_MAX_LENGTH = 1024


def marked_text(tok: Any, ids: list[int], mask: list[int], on: str, off: str) -> str:
    """The decoded ids (special tokens spelled) with every run of ``mask == 1`` between ``on`` and ``off``."""
    from codechat.chat.conversation import supervised_spans
    out, k = [], 0
    for a, b in supervised_spans(mask):
        out += [tok.decode(ids[k:a]), on, tok.decode(ids[a:b]), off]
        k = b
    out.append(tok.decode(ids[k:]))
    return "".join(out)


def inspect_examples(spec: str, tok: Any, cfg: SFTConfig, n: int) -> tuple[list[dict[str, Any]], Any, Any]:
    """The first ``n`` examples of ``spec`` as JSON-ready dicts, the budget counts and the mixture."""
    from codechat.chat.budget import BudgetCounts, render_with_budget
    from codechat.chat.conversation import supervised_spans
    from codechat.data.mixture import Mixture
    mix = Mixture.from_spec(spec, cfg)
    counts = BudgetCounts()
    rows = []
    for _ in range(min(n, mix.epoch_size)):
        rec = next(mix)
        before = dict(counts.dropped)
        ex = render_with_budget(tok, rec.conversation, cfg, counts, source=rec.source, line=rec.line)
        row: dict[str, Any] = {"source": rec.source, "line": rec.line, "format": rec.format}
        if ex is None:
            reason = next(r for r, c in counts.dropped.items() if c != before.get(r, 0))
            row.update(ids=[], mask=[], supervised_text=[], prompt_length=0, prompt_truncated=False,
                       completion_truncated=False, dropped=reason)
        else:
            row.update(ids=ex.ids, mask=ex.mask, supervised_text=[tok.decode(ex.ids[a:b])
                                                                  for a, b in supervised_spans(ex.mask)],
                       prompt_length=ex.prompt_length, prompt_truncated=ex.prompt_truncated,
                       completion_truncated=ex.completion_truncated, dropped=None)
        rows.append(row)
    return rows, counts, mix


def _cmd_inspect(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from codechat.tokenizer import Tokenizer
    out = out or sys.stdout
    if not args.tokenizer:
        raise ConfigError("--tokenizer DIR is required: the tokenizer the model is trained with (e.g. "
                          "runs/NAME/tokenizer), since what is supervised depends on its token ids")
    if args.n < 1:
        raise ConfigError(f"--n must be >= 1, got {args.n}")
    tok = Tokenizer.load(args.tokenizer)
    # without --max-prompt-length, the prompt gets sft.prompt_share of the length (SFTConfig derives it)
    cfg = SFTConfig(data=args.data, format=args.format, mix_mode=args.mode, seed=args.seed, skip_bad=args.skip_bad,
                    max_length=args.max_length or DEFAULT_MAX_LENGTH, max_prompt_length=args.max_prompt_length,
                    decontaminate=False)
    rows, counts, mix = inspect_examples(args.data, tok, cfg, args.n)
    summary = (f"{counts.seen} examples: {counts.kept} kept ({counts.prompt_truncated} prompt-truncated, "
               f"{counts.completion_truncated} completion-truncated), {counts.n_dropped} dropped {counts.dropped}; "
               f"supervised share {counts.supervised_share:.3f} (max_length {cfg.max_length}, max_prompt_length "
               f"{cfg.max_prompt_length})")
    if args.json:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(summary, file=sys.stderr)
        return 0
    color = args.color == "always" or (args.color == "auto" and out.isatty())
    on, off = (COLOR_ON, COLOR_OFF) if color else (MARK_ON, MARK_OFF)
    for k, row in enumerate(rows, 1):
        flags = [f for f in ("prompt_truncated", "completion_truncated") if row[f]]
        head = (f"=== example {k}/{len(rows)}  {row['source']}:{row['line']}  format {row['format']}  "
                f"{len(row['ids'])} tokens, {sum(row['mask'])} supervised")
        out.write(head + (f"  [{', '.join(flags)}]" if flags else "") +
                  (f"  DROPPED: {row['dropped']}" if row["dropped"] else "") + "\n")
        if not row["dropped"]:
            out.write(marked_text(tok, row["ids"], row["mask"], on, off) + "\n")
    out.write(summary + "\n")
    return 0


def add_cli(data_subparsers: Any) -> argparse.ArgumentParser:
    """Register ``inspect`` on the ``data`` command's sub-subparsers (from :func:`codechat.data.corpus.add_cli`)."""
    p = data_subparsers.add_parser(
        "inspect", help="show SFT examples with the supervised tokens marked",
        description="Render the first --n examples of an SFT data mixture exactly as SFT trains on them and mark "
                    "the supervised tokens (loss mask 1): colour on a terminal, [[...]] otherwise; --json prints one "
                    "object per example with ids, mask and the supervised text spans.")
    p.add_argument("--data", required=True, metavar="SPEC", help="mixture spec SOURCE[#FORMAT][:WEIGHT],...")
    p.add_argument("--n", type=int, default=3, metavar="N", help="examples to show (default 3)")
    p.add_argument("--json", action="store_true", help="one JSON object per example on stdout")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer directory (required)")
    p.add_argument("--max-length", type=int, default=0, metavar="N",
                   help=f"tokens per example (default {DEFAULT_MAX_LENGTH}; SFT itself defaults to the model's "
                        "max_seq_len)")
    p.add_argument("--max-prompt-length", type=int, default=0, metavar="N",
                   help=f"tokens of prompt (default: sft.prompt_share={SFTConfig.prompt_share:g} of --max-length)")
    p.add_argument("--format", default="auto", choices=SFT_FORMATS, help="record format (default: detected)")
    p.add_argument("--mode", default="sample", choices=SFT_MIX_MODES, help="mixture mode (default sample)")
    p.add_argument("--seed", type=int, default=SFTConfig.seed, help="mixture seed (default %(default)s)")
    p.add_argument("--skip-bad", action="store_true", help="skip and count records that fit no format")
    p.add_argument("--color", default="auto", choices=["auto", "always", "never"],
                   help="colour the supervised text (default: when stdout is a terminal)")
    p.set_defaults(func=_cmd_inspect)
    return p


__all__ = ["add_cli", "inspect_examples", "marked_text", "COLOR_ON", "COLOR_OFF", "MARK_ON", "MARK_OFF",
           "DEFAULT_MAX_LENGTH"]
