"""Tokenizers in Hugging Face's layout: ``tokenizer.json`` + ``tokenizer_config.json``, both ways.

Export: the BPE of a codechat tokenizer, unchanged, with every special id (``<|bos|>``, ``<|end|>``,
the role tokens, and for an imported model its own added tokens) declared in ``added_tokens`` as
``special: true`` at its id; no post-processor, so ``tokenizer(text)`` is codechat's
:meth:`~codechat.tokenizer.Tokenizer.encode`. ``tokenizer_config.json`` names
``PreTrainedTokenizerFast``, ``<|bos|>`` / ``<|end|>`` as bos / eos (and pad), and the chat template
of :mod:`codechat.hf.template`. One difference is transformers' and cannot be turned off in the
files: it matches the spelling of an added token in text (``"<|end|>"`` typed by a user becomes
the control id), as it does for every model; ``split_special_tokens=True`` gives codechat's ids.

Import (:func:`import_tokenizer`): the BPE of the model's ``tokenizer.json`` keeps its ids. The
model's vocabulary is its embedding's rows ``V``; ids from the end of the BPE up to ``V`` are the
model's added tokens (``<|im_start|>``, ``<|begin_of_text|>``, ...) and, where no token has an id, a
placeholder ``<|reserved_ID|>`` (Qwen3 pads its embedding beyond its tokenizer). All of them become
codechat special ids: text never produces them (they stay in the vocabulary and keep their rows).
codechat's :data:`~codechat.tokenizer.SPECIAL_TOKENS` come next, from id ``V`` on, in their order;
one whose spelling the model already has as an added token (a model exported by codechat) is that
token, with its id and its trained row, so export then import changes no id.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from ..tokenizer import BPE_FILE, SPECIAL_TOKENS, Tokenizer
from .config import HFImportError
from .template import chat_template

CONFIG_FILE = "tokenizer_config.json"
RESERVED = "<|reserved_{}|>"


def _added(content: str, i: int) -> dict[str, Any]:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def write_tokenizer(tok_dir: Path, out: Path, max_seq_len: int) -> list[str]:
    """Write the codechat tokenizer saved in ``tok_dir`` as ``out/tokenizer.json`` + ``tokenizer_config.json``.

    Returns the file names written.
    """
    tok = Tokenizer.load(tok_dir)
    spec = json.loads((tok_dir / BPE_FILE).read_text(encoding="utf-8"))
    specials = {name: tok.special_id(name) for name in tok.special_tokens}
    spec["added_tokens"] = [_added(name, i) for name, i in specials.items()]
    spec["post_processor"] = None  # ids of tokenizer(text) are encode(text): no BOS/EOS added
    (out / BPE_FILE).write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    roles = [n for n in SPECIAL_TOKENS if n in specials and n not in ("<|bos|>", "<|end|>")]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|end|>",
              "pad_token": "<|end|>", "unk_token": None, "additional_special_tokens": roles,
              "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
              "model_max_length": max_seq_len, "chat_template": chat_template("<|bos|>", "<|end|>")}
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return [BPE_FILE, CONFIG_FILE]


def import_tokenizer(directory: Path, vocab_rows: int) -> tuple[Tokenizer, dict[str, Any]]:
    """codechat's tokenizer for a model of ``vocab_rows`` embedding rows from ``directory/tokenizer.json``.

    Returns ``(tokenizer, layout)``: ``layout`` states the id ranges (``bpe``, ``model_added``,
    ``codechat_new``: [start, stop) each) and which codechat tokens were found in the model.

    Raises:
        HFImportError: no ``tokenizer.json``, not a byte-level BPE, or an added token whose id is
            outside the embedding.
    """
    f = directory / BPE_FILE
    if not f.is_file():
        raise HFImportError(f"{f}: missing; codechat imports a fast tokenizer (tokenizer.json)")
    try:
        spec = json.loads(f.read_text(encoding="utf-8"))
        added = {int(t["id"]): t["content"] for t in spec.get("added_tokens") or []}
        spec["added_tokens"] = []
        if spec.get("model", {}).get("type") != "BPE":
            raise ValueError(f"model.type is {spec.get('model', {}).get('type')!r}, not BPE")
        bpe = HFTokenizer.from_str(json.dumps(spec))
    except Exception as e:  # JSON, a missing field, or the tokenizers library refusing the spec
        raise HFImportError(f"{f}: cannot be read as a byte-level BPE ({e})") from None
    n_bpe = bpe.get_vocab_size(with_added_tokens=False)
    if n_bpe > vocab_rows:
        raise HFImportError(f"{f}: the BPE has {n_bpe} tokens, more than the model's {vocab_rows} embedding rows")
    outside = sorted(i for i in added if i >= vocab_rows)
    if outside:
        raise HFImportError(f"{f}: added token {added[outside[0]]!r} has id {outside[0]}, outside the model's "
                            f"{vocab_rows} embedding rows")
    names = [added.get(i, RESERVED.format(i)) for i in range(n_bpe, vocab_rows)]
    found = [n for n in SPECIAL_TOKENS if n in names]
    new = [n for n in SPECIAL_TOKENS if n not in names]
    if len(set(names + new)) != len(names) + len(new):
        raise HFImportError(f"{f}: two added tokens share one spelling")
    try:
        tok = Tokenizer(bpe, kind="hf", special_tokens=names + new)
    except ValueError as e:
        raise HFImportError(f"{f}: {e}") from None
    layout = {"bpe": [0, n_bpe], "model_added": [n_bpe, vocab_rows],
              "codechat_new": [vocab_rows, vocab_rows + len(new)], "codechat_found_in_model": found}
    return tok, layout
