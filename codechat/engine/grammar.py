"""Constrained decoding: grammars compiled against the tokenizer, and per-row token masks.

A :class:`Grammar` is a constraint compiled once (:class:`GrammarCompiler`, cached by its source):
a JSON schema, a regular expression, or a Lark grammar (llguidance's dialect, which may embed JSON
schemas with ``%json {...}`` and name special tokens by id, ``<[123]>``). A :class:`Request` that
carries one gets a :class:`GrammarMatcher` per row; before each of that row's tokens is sampled the
engine asks it for the allowed tokens (a bitmask, 32 ids per int32 word, bit ``i % 32`` of word
``i // 32``) and sets every other logit to ``-inf`` before temperature, top-k and top-p
(:mod:`codechat.engine.sampling`); the row then ends when the grammar is complete.

The library is llguidance (Microsoft's grammar engine, used by vLLM and SGLang beside xgrammar),
chosen over xgrammar 0.2.8 because xgrammar's wheel requires ``triton`` (~1 GB installed, a CPU
install included) and ``apache-tvm-ffi``, where llguidance is one 3 MB abi3 wheel with no
dependencies; both compile JSON schemas, regexes and context-free grammars to token masks. It is
an optional extra (``pip install 'codechat[grammar]'``), imported only when a constraint is built.

The tokenizer is given to the library exactly: every id's bytes (byte-level BPE), the special ids
marked as such (they never match text; a grammar names them by id), ``<|end|>`` as the end-of-sequence
token (allowed exactly when the grammar may end).
"""
from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from codechat.tokenizer import Tokenizer

#: How many compiled grammars a :class:`GrammarCompiler` keeps (least recently used dropped first).
CACHE_SIZE = 256
#: The JSON layout a compiled schema allows: ``json.dumps``' default separators and no other
#: whitespace, the layout codechat's training data writes (``codechat.chat.calls.format_call``).
JSON_LAYOUT = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
#: JSON-schema keywords whose value is one subschema / a list of them / a map of them: where
#: :func:`_locate` looks for the innermost subschema at fault.
_SUB_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")
_SUB_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUB_MAP = ("properties", "patternProperties")


class GrammarError(ValueError):
    """A constraint the grammar library cannot compile.

    Attributes:
        message: the library's reason, one line.
        path: where in the schema (a JSON path such as ``$.properties.city.maxLength``; ``$`` for
            the whole schema or a grammar that is not a schema).
        keyword: the schema keyword at fault when one can be named (``format``, ``$ref``, ...), else None.
    """

    def __init__(self, message: str, path: str = "$", keyword: str | None = None) -> None:
        self.message, self.path, self.keyword = message, path, keyword
        where = f" at {path}" + (f" (keyword {keyword!r})" if keyword else "")
        super().__init__(f"cannot compile the constraint{where}: {message}")

    def under(self, prefix: str) -> GrammarError:
        """The same error with its path placed under ``prefix`` (``$.tools[0].parameters``): where the
        schema sits in a larger document."""
        return GrammarError(self.message, prefix + self.path[1:], self.keyword)


class GrammarUnavailable(RuntimeError):
    """A constraint was asked for without the grammar library installed."""

    def __init__(self) -> None:
        super().__init__("constrained decoding (strict tools, tool_choice, response_format, --strict) needs the "
                         "grammar extra: pip install 'codechat[grammar]' (the llguidance package)")


def _llg() -> Any:
    try:
        import llguidance
    except ImportError:
        raise GrammarUnavailable() from None
    return llguidance


class Grammar:
    """A compiled constraint: ``source`` (llguidance's grammar text, the cache key) and the
    ``vocab_size`` it was compiled for; :meth:`matcher` starts a row."""

    def __init__(self, source: str, vocab_size: int, proto: Any) -> None:
        self.source, self.vocab_size, self._proto = source, vocab_size, proto

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._proto.deep_copy(), self.vocab_size)

    def __repr__(self) -> str:
        return f"Grammar({self.source[:60]!r}..., vocab_size={self.vocab_size})"


class GrammarMatcher:
    """One row's place in its grammar.

    :meth:`fill` writes the allowed tokens of the next position into an int32 row of
    ``ceil(vocab_size / 32)`` words; :meth:`consume` advances by a sampled token; :attr:`done`
    says the grammar is complete (no token may follow) or broken (a token it did not allow).
    """

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self._m, self.vocab_size = matcher, vocab_size

    def fill(self, row: torch.Tensor) -> None:
        """Write the allowed-token bitmask into ``row``: (ceil(V / 32),) int32, contiguous, on the CPU."""
        self.fill_at(row.data_ptr())

    def fill_at(self, address: int) -> None:
        """:meth:`fill` into the ``ceil(V / 32)`` int32 words at host ``address`` (no tensor view made)."""
        self._m.unsafe_compute_mask_ptr(address, words(self.vocab_size) * 4)

    def consume(self, token: int) -> bool:
        """Advance by ``token``; False when the grammar did not allow it (the matcher is then broken)."""
        return bool(self._m.consume_token(int(token)))

    @property
    def done(self) -> bool:
        return bool(self._m.is_stopped() or self._m.is_error())

    @property
    def error(self) -> str:
        """Why the matcher broke ("" when it did not)."""
        return self._m.get_error() if self._m.is_error() else ""


def fill_rows(rows: Sequence[tuple[GrammarMatcher, int]], bitmask: torch.Tensor) -> None:
    """Write each matcher's allowed tokens into row ``i`` of ``bitmask`` ((N, W) int32, rows
    contiguous, CPU). A matcher compiled for fewer ids than ``W * 32`` (a tokenizer smaller than the
    model's logits) leaves the words past its vocabulary at 0 (forbidden).

    One matcher after another: llguidance's parallel executor measured slower on every machine tried
    (``benchmarks/mask_fill.py``, 64 rows: 0.63x on 2 CPUs, 0.57x on 16, and inside the engine on an
    H100 host 25.6 ms a step against ~4.5 ms: ``benchmarks/RESULTS.md``). Each row is written through
    its address, not a tensor view: two views and a ``zero_`` a row cost more than the mask itself
    (the ``engine`` strategy of ``mask_fill.py`` at 0.63x ``serial`` on an H100 host before this).

    Raises ValueError for a ``bitmask`` that is not int32 on the CPU with contiguous rows."""
    if not rows:
        return
    if bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or bitmask.stride(1) != 1:
        raise ValueError(f"fill_rows needs a CPU int32 bitmask with contiguous rows, got {bitmask.dtype} "
                         f"on {bitmask.device} with strides {bitmask.stride()}")
    base, pitch, width = bitmask.data_ptr(), bitmask.stride(0) * 4, bitmask.size(1)
    short: dict[int, list[int]] = {}  # words of a vocabulary narrower than the buffer -> its rows
    for m, i in rows:
        m.fill_at(base + i * pitch)
        n = words(m.vocab_size)
        if n < width:
            short.setdefault(n, []).append(i)
    for n, idx in short.items():  # basic slices: an advanced-index write took ~1 ms on the H100 host
        for lo, hi in _runs(sorted(idx)):
            bitmask[lo:hi, n:].zero_()


def _runs(ascending: list[int]) -> list[tuple[int, int]]:
    """The maximal runs of consecutive integers in ``ascending``, as half-open ``(lo, hi)``."""
    runs: list[tuple[int, int]] = []
    for i in ascending:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def words(vocab_size: int) -> int:
    """int32 words of a bitmask over ``vocab_size`` ids."""
    return (vocab_size + 31) // 32


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(B, W) int32 bitmask -> (B, vocab_size) bool, True where a token is allowed (any device)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab_size]


class GrammarCompiler:
    """Compiles constraints against ``tok`` (and caches them: the same constraint twice is one compile).

    Masks cover the tokenizer's ids (``vocab_size`` = ``tok.vocab_size``); a model whose logits are
    wider (padded vocabulary) never gets the ids past them under a grammar.

    Args:
        tok: the model's tokenizer.
        model_vocab_size: the model's logits width, checked against the tokenizer (0: not checked).

    Raises:
        GrammarUnavailable: llguidance is not installed.
        ValueError: the tokenizer has more ids than the model's logits.
    """

    def __init__(self, tok: Tokenizer, model_vocab_size: int = 0) -> None:
        llg = _llg()
        if 0 < model_vocab_size < tok.vocab_size:
            raise ValueError(f"the tokenizer has {tok.vocab_size} ids, the model's logits only {model_vocab_size}: "
                             "this tokenizer is not the model's")
        self.vocab_size = tok.vocab_size
        self.tok = tok

        class _Wrapped:  # what llguidance.TokenizerWrapper reads
            eos_token_id, bos_token_id = tok.end_id, tok.bos_id
            tokens = [tok.token_bytes(i) for i in range(tok.vocab_size)]
            special_token_ids = sorted(tok.special_ids)

            def __call__(self, s: str | bytes) -> list[int]:
                return tok.encode(s.decode("utf-8", errors="replace") if isinstance(s, bytes) else s)

        self._lltok = llg.LLTokenizer(llg.TokenizerWrapper(_Wrapped()))
        self._cache: dict[str, Grammar] = {}
        self._lock = threading.Lock()

    # -- the constraints ----------------------------------------------------------------------

    def json_schema(self, schema: Mapping[str, Any]) -> Grammar:
        """JSON text valid under ``schema`` (draft 2020-12 as llguidance implements it), written in
        :data:`JSON_LAYOUT`.

        Raises:
            GrammarError: the schema is not an object, or uses what the library cannot compile
                (``path`` and ``keyword`` say where).
        """
        if not isinstance(schema, Mapping):
            raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
        return self.lark(f"start: {json_rule(schema)}\n", schema=schema)

    def regex(self, pattern: str) -> Grammar:
        """Text matching the regular expression ``pattern`` (Rust ``regex`` syntax) in full.

        Raises:
            GrammarError: the pattern does not compile.
        """
        return self.lark(f"start: /{_llg().regex_to_lark(pattern)}/\n")

    def lark(self, text: str, schema: Mapping[str, Any] | None = None) -> Grammar:
        """A grammar in llguidance's Lark dialect (``%json {...}`` embeds a schema, ``<[ID]>`` a special id).

        Args:
            schema: the JSON schema the grammar embeds, if any: an error is then located in it.

        Raises:
            GrammarError: the grammar does not compile.
        """
        return self.from_source(_llg().LLMatcher.grammar_from_lark(text), schema)

    def from_source(self, source: str, schema: Mapping[str, Any] | None = None) -> Grammar:
        """The grammar whose llguidance source is ``source`` (:attr:`Grammar.source`, as another
        process compiled it: the server's engine process gets grammars this way).

        Args:
            schema: the JSON schema the grammar embeds, if any: an error is then located in it.

        Raises:
            GrammarError: the grammar does not compile.
        """
        llg = _llg()
        with self._lock:
            hit = self._cache.pop(source, None)
            if hit is not None:
                self._cache[source] = hit  # most recently used last
                return hit
        error = llg.LLMatcher.validate_grammar(source, self._lltok)
        if error:
            raise _located(error, schema, self._lltok)
        proto = llg.LLMatcher(self._lltok, source, log_level=0)
        probe = proto.deep_copy()  # a grammar that is over before its first token admits nothing
        if not proto.is_error():
            GrammarMatcher(probe, self.vocab_size).fill(torch.zeros(words(self.vocab_size), dtype=torch.int32))
        if proto.is_error() or probe.is_error() or probe.is_stopped():
            raise _located(proto.get_error() or "the constraint admits no output at all (a $ref cycle without a "
                           "base case?)", schema, self._lltok)
        g = Grammar(source, self.vocab_size, proto)
        with self._lock:
            self._cache[source] = g
            while len(self._cache) > CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
        return g


def json_rule(schema: Mapping[str, Any]) -> str:
    """The Lark rule body ``%json {...}`` for ``schema`` in :data:`JSON_LAYOUT` (to embed in a grammar)."""
    return "%json " + json.dumps({**schema, "x-guidance": {**JSON_LAYOUT, **schema.get("x-guidance", {})}},
                                 ensure_ascii=False)


def _located(error: str, schema: Mapping[str, Any] | None, lltok: Any) -> GrammarError:
    """``error`` as a :class:`GrammarError` at the innermost subschema of ``schema`` that fails alone
    (or, for an unresolvable ``$ref``, at that reference), naming the keyword the message names."""
    message = _clean(error)
    if schema is None:
        return GrammarError(message)
    refs = [(p, r) for p, r in _refs(schema, "$") if r in message]
    if refs:
        return GrammarError(message, refs[0][0], "$ref")
    path, sub = _locate(schema, "$", lltok)
    low = message.lower()
    keyword = next((k for k in sub if k.lower() in low), None) if isinstance(sub, Mapping) else None
    return GrammarError(message, path, keyword)


def _clean(error: str) -> str:
    """The library's error in one line, without its position prefix and its echo of the grammar."""
    text = re.sub(r"^at \d+\(\d+\): ", "", error.strip()).replace("failed to compile JSON schema: ", "")
    text = re.split(r"\n\s*\d+ \|", text)[0]
    return " ".join(text.split()) or "invalid grammar"


def _refs(schema: Any, path: str) -> list[tuple[str, str]]:
    """Every ``(path of the $ref keyword, its value)`` in ``schema``."""
    out = []
    if isinstance(schema, Mapping):
        for k, v in schema.items():
            if k == "$ref" and isinstance(v, str):
                out.append((f"{path}.$ref", v.lstrip("#")))
            else:
                out += _refs(v, f"{path}.{k}")
    elif isinstance(schema, list):
        for i, v in enumerate(schema):
            out += _refs(v, f"{path}[{i}]")
    return out


def _fails(schema: Any, lltok: Any) -> bool:
    llg = _llg()
    if not isinstance(schema, Mapping):
        return not isinstance(schema, bool)
    return bool(llg.LLMatcher.validate_grammar(llg.LLMatcher.grammar_from_lark(f"start: {json_rule(schema)}\n"), lltok))


def _locate(schema: Any, path: str, lltok: Any) -> tuple[str, Any]:
    """The innermost ``(path, subschema)`` under ``schema`` that fails to compile on its own
    (``schema`` itself when no child does: a ``$ref`` resolves only from the root)."""
    children: list[tuple[str, Any]] = []
    if isinstance(schema, Mapping):
        children += [(f"{path}.{k}", schema[k]) for k in _SUB_ONE if isinstance(schema.get(k), Mapping)]
        children += [(f"{path}.{k}[{i}]", s) for k in _SUB_LIST if isinstance(schema.get(k), Sequence)
                     and not isinstance(schema.get(k), str) for i, s in enumerate(schema[k])]
        children += [(f"{path}.{k}.{n}", s) for k in _SUB_MAP if isinstance(schema.get(k), Mapping)
                     for n, s in schema[k].items()]
    for p, child in children:
        if "$ref" not in json.dumps(child) and _fails(child, lltok):
            return _locate(child, p, lltok)
    return path, schema
