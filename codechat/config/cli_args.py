"""Command-line pieces that several ``codechat`` subcommands share (:mod:`codechat.cli`,
:mod:`codechat.chat.cli`): the ``--model`` help, ``--seed``/``--device`` and a message flag's type."""
from __future__ import annotations

import argparse
from typing import Callable

#: ``--model`` of every command that loads one (:func:`codechat.checkpoint.resolve`).
MODEL_HELP = ("checkpoint, stage directory (its newest checkpoint) or run directory such as a speedrun's "
              "(its rl/, sft/ or pretrain/ stage, first found; the pick is printed)")


def message_type(without: str) -> Callable[[str], str]:
    """An argparse ``type`` for a message flag: empty or whitespace-only text is a usage error
    (exit 2, before the model loads) whose hint says what leaving the flag out does."""
    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"empty text {text!r}; give the text, or leave the flag out {without}")
        return text
    return check


def add_common(p: argparse.ArgumentParser) -> None:
    """``--seed`` (run.seed) and ``--device`` (run.device)."""
    p.add_argument("--seed", type=int, help="random seed (run.seed)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], help="device (run.device, default auto)")
