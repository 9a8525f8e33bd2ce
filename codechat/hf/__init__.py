"""Hugging Face interoperability: export to and import from ``transformers``' Llama / Qwen3 layout.

- :mod:`codechat.hf.export`: ``codechat export --format hf`` (safetensors, ``config.json``,
  ``generation_config.json``, tokenizer with the chat template, model card);
- :mod:`codechat.hf.imports`: ``--init hf:PATH`` (a Llama / Qwen3 checkpoint as a codechat one);
- :mod:`codechat.hf.config` (``config.json`` <-> ``ModelConfig``, unsupported fields),
  :mod:`codechat.hf.weights` (names, shards, vocabulary growth), :mod:`codechat.hf.tokenizer`
  (``tokenizer.json`` both ways, the token layout), :mod:`codechat.hf.template` (the chat
  template), :mod:`codechat.hf.card` (the model card).

Nothing here imports ``transformers``: the files are written as its documented formats.
"""
from __future__ import annotations

from .config import HFExportError, HFImportError
from .export import ExportConfig, export_hf
from .imports import PREFIX, import_hf, imported_from

__all__ = ["HFExportError", "HFImportError", "ExportConfig", "export_hf", "import_hf", "imported_from", "PREFIX"]
