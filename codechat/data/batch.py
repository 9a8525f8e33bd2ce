"""The unit the trainer consumes: one micro-batch of token rows."""
from __future__ import annotations

from typing import NamedTuple

import torch


class Batch(NamedTuple):
    """One micro-batch.

    inputs: (B, T) int64 token ids. labels: (B, T) int64 next-token targets, -100 where not
    trained. doc_ids: (B, T) int64 document index per position for packed rows (attention and
    positions stay inside a document), or None. n_tokens: real (non-padding) input tokens,
    for tokens/s; None means every position is real.
    """

    inputs: torch.Tensor
    labels: torch.Tensor
    doc_ids: torch.Tensor | None = None
    n_tokens: int | None = None

    @property
    def real_tokens(self) -> int:
        return self.inputs.numel() if self.n_tokens is None else self.n_tokens
