"""Offline SFT data and decontamination.

Mining. :func:`mine_records` turns Python source files (by default this Python's standard
library, present on every machine) into instruction conversations, so SFT runs with no download::

    user:      Write a Python function `name(args)` that: <the function's docstring>
    assistant: <the function's source, without its docstring>

With ``style="complete"`` the same function is asked for the way HumanEval asks (Chen et al.
2021; :data:`codechat.data.formats.HUMANEVAL_PROMPT`)::

    user:      Complete the following Python function:\n\n<its def line(s) and docstring>
    assistant: <the rest of the function: its body after the docstring, as indented in the file>

and ``style="both"`` yields both conversations of each function (:data:`MINE_STYLES`).

A function is kept when it is defined at module level without decorators, is not a dunder, has
a docstring of :data:`MIN_DOC_CHARS`..:data:`MAX_DOC_CHARS` characters, a body beyond the
docstring that is not only ``pass`` / ``...`` / ``raise NotImplementedError``, at most
:data:`MAX_FUNCTION_LINES` lines, and a source not seen before (exact duplicates are dropped).

Decontamination. :class:`Decontaminator` excludes any SFT example that overlaps a HumanEval
problem (from the ``HumanEval.jsonl.gz`` shipped with codechat) or an MBPP test
problem (from a user-given MBPP file). Rule: texts are lower-cased and split into identifiers,
numbers and single punctuation characters (whitespace ignored); each benchmark problem has up
to three *parts* - its prompt, its tests and its solution. An example (all its turns,
function calls included) is excluded when, for some part, at least ``threshold`` (default
0.5) of the part's distinct token ``ngram``-grams (default 10) occur in the example. A part
shorter than ``ngram`` tokens is not used (too short to tell copying from coincidence).

MBPP as a source. A record in the ``mbpp`` format whose ``task_id`` is an MBPP task id
(1..974, optionally ``Mbpp/N``) is that task: it is kept only in :data:`MBPP_SFT_SPLITS` (train
601-974, few-shot prompts 1-10) and every other task (test 11-510, validation 511-600) is
excluded by its identity, whatever the n-grams say (counted under ``by_rule["task_id"]``). The
held-out tasks of each local MBPP source file also join the benchmark problems, so the other
sources (and MBPP's own train tasks) are checked against them by the n-gram rule: a copy of an
MBPP test problem in, say, a Code Alpaca or chat-format file is excluded too.
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import json
import multiprocessing as mp
import os
import logging
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from codechat.chat.conversation import Conversation, Message
from codechat.config.sft import MINE_STYLES, SFTConfig
from codechat.data.benchmarks import HUMANEVAL_FILE, MBPP_SPLITS, mbpp_split
from codechat.data.formats import HUMANEVAL_PROMPT, Record
from codechat.data.sources import collect_files

log = logging.getLogger(__name__)

#: The user turn of a mined pair.
MINED_PROMPT = "Write a Python function `{signature}` that: {doc}"
MIN_DOC_CHARS = 20
MAX_DOC_CHARS = 1500
MAX_FUNCTION_LINES = 60
MINED_FORMAT = "mined"
#: MBPP splits checked by default (task ids 11-510, the split every MBPP score is reported on).
MBPP_DECONTAM_SPLITS: tuple[str, ...] = ("test",)
#: MBPP splits an MBPP *source* keeps (train 601-974, few-shot prompts 1-10); its other tasks are excluded.
MBPP_SFT_SPLITS: tuple[str, ...] = ("train", "prompt")
_MBPP_ID = re.compile(r"(?:mbpp/)?(\d+)")
_TOKEN = re.compile(r"[a-z_][a-z0-9_]*|\d+|[^\sa-z0-9_]")


# ----------------------------------------------------------------------------- mining
@dataclass
class MiningCounts:
    """Files read, functions seen and skipped (by reason), and records kept by :func:`mine_records`."""

    files: int = 0
    unparsable_files: int = 0
    functions: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "unparsable_files": self.unparsable_files, "functions": self.functions,
                "kept": self.kept, "skipped": dict(self.skipped)}


def source_lines(text: str) -> list[str]:
    """``text``'s lines as Python counts them (``ast`` line numbers index this list from 1): split at
    ``\n``, ``\r\n`` and ``\r`` only. ``str.splitlines`` also splits at form feeds, ``\x1c``-``\x1e``,
    ``\x85`` and ``\u2028``/``\u2029``, which real sources hold (page breaks, separators in strings);
    every line after one would be off by one, and a function's source sliced by its line numbers
    would be another's (the GPU speedrun's corpus miner died of it: ``SyntaxError`` in ``ast.parse``)."""
    return re.split(r"\r\n|\r|\n", text)


def _trivial(body: Sequence[ast.stmt]) -> bool:
    """Only ``pass``, ``...`` or ``raise NotImplementedError``."""
    for stmt in body:
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        if isinstance(stmt, ast.Raise) and "NotImplementedError" in ast.unparse(stmt):
            continue
        return False
    return True


def _pair(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str], style: str) -> list[tuple[str, str]] | str:
    """The ``(instruction, answer)`` pairs of ``style`` for one function, or the reason it is skipped."""
    if node.name.startswith("__") or node.decorator_list:
        return "decorated_or_dunder"
    doc = ast.get_docstring(node, clean=True)
    if not doc:
        return "no_docstring"
    if not MIN_DOC_CHARS <= len(doc) <= MAX_DOC_CHARS:
        return "docstring_length"
    if node.end_lineno is None or node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
        return "too_long"
    if _trivial(node.body[1:]):
        return "trivial_body"
    doc_node = node.body[0]
    if doc_node.lineno == node.lineno or lines[doc_node.end_lineno - 1][doc_node.end_col_offset:].strip() \
            or lines[doc_node.lineno - 1][:doc_node.col_offset].strip():
        return "docstring_shares_a_line"
    pairs = []
    if style in ("docstring", "both"):
        answer = "\n".join(lines[node.lineno - 1:doc_node.lineno - 1] + lines[doc_node.end_lineno:node.end_lineno])
        signature = f"{node.name}({ast.unparse(node.args)})"
        pairs.append((MINED_PROMPT.format(signature=signature, doc=doc), answer.rstrip()))
    if style in ("complete", "both"):
        head = "\n".join(lines[node.lineno - 1:doc_node.end_lineno])
        body = "\n".join(lines[doc_node.end_lineno:node.end_lineno])
        pairs.append((HUMANEVAL_PROMPT.format(prompt=head + "\n"), body.strip("\n").rstrip()))
    return pairs


#: One function of a mined file: its ``def`` line, the digest of its source and its pairs, or the
#: reason it is skipped.
_Mined = tuple[int, bytes, list[tuple[str, str]]] | str


def _mine_file(path: str, style: str) -> list[_Mined] | None:
    """What one file holds (:func:`_pair` per module-level function), or ``None`` if it does not parse."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in old code
            tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    lines = source_lines(text)
    out: list[_Mined] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            pairs = _pair(node, lines, style)
            if isinstance(pairs, str):
                out.append(pairs)
            else:
                source = "\n".join(lines[node.lineno - 1:node.end_lineno])
                out.append((node.lineno, hashlib.sha256(source.encode("utf-8")).digest(), pairs))
    return out


def mine_records(srcs: Sequence[str | os.PathLike], *, max_files: int = 0, max_examples: int = 0,
                 counts: MiningCounts | None = None, style: str = "docstring", workers: int = 1) -> Iterator[Record]:
    """(docstring -> function) conversations from the ``.py`` files under ``srcs``, in file order.

    Each :class:`Record` has the file as ``source``, the ``def`` line as ``line`` and format
    ``"mined"``. ``style`` is one of :data:`MINE_STYLES` (``both``: two records per function).
    ``max_files`` / ``max_examples`` > 0 stop early (``max_examples`` counts records).
    ``workers`` > 1 parses files in that many spawned processes (0: one per CPU core); the
    records are the same, in the same order, for any number (a script calling this with
    ``workers`` != 1 must do so under ``if __name__ == "__main__":``).

    Raises:
        ConfigError: a source does not exist or holds no ``.py`` file.
        ValueError: an unknown ``style`` or a negative ``workers``.
    """
    if style not in MINE_STYLES:
        raise ValueError(f"mining style must be one of {', '.join(MINE_STYLES)}, got {style!r}")
    if workers < 0:
        raise ValueError(f"mining workers must be >= 0 (0: one per CPU core), got {workers}")
    counts = counts if counts is not None else MiningCounts()
    files = collect_files(srcs, (".py",), max_files)
    paths = [str(f.path) for f in files]
    n = workers or os.cpu_count() or 1
    with ExitStack() as stack:
        if n > 1 and len(paths) > 1:
            pool = stack.enter_context(mp.get_context("spawn").Pool(min(n, len(paths))))
            results = pool.imap(partial(_mine_file, style=style), paths, chunksize=8)
        else:
            results = (_mine_file(p, style) for p in paths)
        seen: set[bytes] = set()
        for path, mined in zip(paths, results):
            counts.files += 1
            if mined is None:
                counts.unparsable_files += 1
                continue
            for item in mined:
                counts.functions += 1
                if isinstance(item, str):
                    counts.skip(item)
                    continue
                line, digest, pairs = item
                if digest in seen:
                    counts.skip("duplicate")
                    continue
                seen.add(digest)
                for prompt, answer in pairs:
                    counts.kept += 1
                    yield Record(Conversation((Message("user", prompt), Message("assistant", answer))), path, line,
                                 MINED_FORMAT)
                    if max_examples and counts.kept >= max_examples:
                        return


def write_mined(srcs: Sequence[str | os.PathLike], paths: Sequence[str | os.PathLike], *, max_files: int = 0,
                style: str = "docstring", workers: int = 1) -> dict[str, Any]:
    """Mine ``srcs`` once (:func:`mine_records`, so a function found under two of them is kept once)
    into ``paths[i]`` for the files under ``srcs[i]`` (the innermost when they nest): JSON-lines
    files of ``completion`` records (``prompt``, ``completion``, ``id`` = ``FILE:LINE`` of the
    function) that an SFT mixture reads like any data file. Each file is written under a
    temporary name and renamed, so it is whole or absent.

    Lets the speedrun mine in a background process while the GPU pretrains: its SFT stage then
    reads the files instead of parsing the corpus itself.

    Returns:
        The :class:`MiningCounts` (``as_dict``) plus ``records`` per path (every path gets a file,
        possibly empty).

    Raises:
        ValueError: ``srcs`` and ``paths`` differ in length; the errors of :func:`mine_records`.
    """
    if len(srcs) != len(paths):
        raise ValueError(f"write_mined needs one path per source, got {len(srcs)} sources and {len(paths)} paths")
    roots = [Path(s).resolve() for s in srcs]
    by_depth = sorted(range(len(roots)), key=lambda i: -len(roots[i].parts))
    counts, outs = MiningCounts(), [Path(p) for p in paths]
    tmps = [p.with_name(f"{p.name}.tmp{os.getpid()}") for p in outs]
    n = [0] * len(outs)
    part_of: dict[str, int] = {}  # a file's part, found once per file (its records come together)
    with ExitStack() as stack:
        for p in outs:
            p.parent.mkdir(parents=True, exist_ok=True)
        files = [stack.enter_context(open(t, "w", encoding="utf-8")) for t in tmps]
        for rec in mine_records(srcs, max_files=max_files, counts=counts, style=style, workers=workers):
            if (k := part_of.get(rec.source)) is None:
                where = Path(rec.source).resolve()
                k = part_of[rec.source] = next((i for i in by_depth if where.is_relative_to(roots[i])), by_depth[-1])
            user, answer = rec.conversation.messages
            files[k].write(json.dumps({"prompt": user.content, "completion": answer.content,
                                       "id": f"{rec.source}:{rec.line}"}) + "\n")
            n[k] += 1
    for t, p in zip(tmps, outs):
        os.replace(t, p)
    return {**counts.as_dict(), "records": {str(p): k for p, k in zip(outs, n)}}


def without_ids(path: str | os.PathLike, out: str | os.PathLike, ids: set[str]) -> int:
    """Copy :func:`write_mined`'s file ``path`` to ``out`` without the records whose ``id`` (``FILE:LINE``)
    is in ``ids`` (written under a temporary name and renamed); returns how many were left out."""
    from codechat.config.atomic import write_text
    kept, dropped = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if json.loads(line)["id"] in ids:
                dropped += 1
            else:
                kept.append(line)
    write_text(out, "".join(kept))
    return dropped


# ----------------------------------------------------------------------------- benchmarks
@dataclass(frozen=True)
class BenchmarkProblem:
    """A problem that SFT data must not contain: ``id`` like ``"HumanEval/0"`` or ``"MBPP/11"``."""

    id: str
    prompt: str
    solution: str
    tests: str = ""

    @property
    def benchmark(self) -> str:
        return self.id.split("/", 1)[0]


def humaneval_file() -> Path | None:
    """The ``HumanEval.jsonl.gz`` shipped with codechat (:data:`codechat.data.benchmarks.HUMANEVAL_FILE`),
    or ``None`` if it is missing (a copy of the sources without the package data)."""
    return HUMANEVAL_FILE if HUMANEVAL_FILE.is_file() else None


def humaneval_problems(path: str | os.PathLike | None = None) -> list[BenchmarkProblem]:
    """The 164 HumanEval problems (``path`` default: :func:`humaneval_file`).

    Raises:
        FileNotFoundError: no path given and the shipped file is missing.
    """
    path = Path(path) if path else humaneval_file()
    if path is None:
        raise FileNotFoundError("HumanEval is not available: the HumanEval.jsonl.gz shipped with codechat is missing "
                                "(codechat/data/shipped/); reinstall codechat or give its path")
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [BenchmarkProblem(r["task_id"], r["prompt"], r["canonical_solution"], r.get("test", "")) for r in rows]


def mbpp_problems(path: str | os.PathLike, splits: Sequence[str] = MBPP_DECONTAM_SPLITS) -> list[BenchmarkProblem]:
    """MBPP problems of ``splits`` (by task id, as :func:`codechat.data.benchmarks.mbpp_split`) from ``mbpp.jsonl``
    or ``sanitized-mbpp.json`` (``.gz`` allowed).

    Raises:
        FileNotFoundError: ``path`` is missing. ValueError: no problem of those splits in the file.
    """
    from codechat.data.readers import read_rows
    if not Path(path).is_file():
        raise FileNotFoundError(f"MBPP file {str(path)!r} (sft.decontam_mbpp) does not exist")
    out = []
    for _, r in read_rows(path):
        if isinstance(r, dict) and "task_id" in r and mbpp_split(int(r["task_id"])) in splits:
            out.append(BenchmarkProblem(f"MBPP/{r['task_id']}", r.get("text") or r.get("prompt") or "",
                                        (r.get("code") or "").replace("\r\n", "\n"), "\n".join(r.get("test_list", []))))
    if not out:
        raise ValueError(f"{path} holds no MBPP problem of splits {list(splits)}")
    return out


def mbpp_held_out_task(record: Record) -> str | None:
    """``"MBPP/N"`` when ``record`` is MBPP task N (format ``mbpp``, task id 1..974) outside :data:`MBPP_SFT_SPLITS`."""
    m = _MBPP_ID.fullmatch(record.task_id.strip().lower()) if record.format == "mbpp" else None
    if m is None or not 1 <= int(m[1]) <= 974:
        return None
    return None if mbpp_split(int(m[1])) in MBPP_SFT_SPLITS else f"MBPP/{int(m[1])}"


# ----------------------------------------------------------------------------- decontamination
def normalized_tokens(text: str) -> list[str]:
    """Lower-cased identifiers, numbers and single punctuation characters of ``text``; whitespace dropped."""
    return _TOKEN.findall(text.lower())


def ngrams(tokens: Sequence[str], n: int) -> set[tuple[str, ...]]:
    """The distinct ``n``-grams of ``tokens`` (empty when there are fewer than ``n`` tokens)."""
    return set(zip(*(tokens[k:] for k in range(n))))  # the tuples built in C, not sliced one by one


def conversation_text(conv: Conversation) -> str:
    """Every turn's text and function call, one after another (what an example could leak)."""
    parts = []
    for m in conv.messages:
        parts.append(m.content)
        if m.function_call is not None:
            parts.append(json.dumps(m.function_call, ensure_ascii=False))
    return "\n".join(parts)


@dataclass(frozen=True)
class Overlap:
    """Why an example is contaminated: ``fraction`` of the n-grams of ``part`` of ``problem`` are in it."""

    problem: str
    part: str
    fraction: float


class Decontaminator:
    """Finds SFT examples that overlap benchmark problems (rule in the module docstring).

    :meth:`keep` is the filter a :class:`~codechat.data.mixture.Mixture` applies; ``counts``
    (excluded examples per benchmark), ``by_rule`` (``task_id``: held-out MBPP tasks of an MBPP
    source; ``ngram``: the overlap rule), ``checked`` and ``examples`` (the first few exclusions)
    go to the report.
    """

    #: How many exclusions are remembered in ``examples``.
    MAX_EXAMPLES = 20

    def __init__(self, problems: Iterable[BenchmarkProblem], *, ngram: int = SFTConfig.decontam_ngram,
                 threshold: float = SFTConfig.decontam_threshold, mbpp_sources: Sequence[str] = ()) -> None:
        if ngram < 1 or not 0.0 < threshold <= 1.0:
            raise ValueError(f"ngram must be >= 1 and threshold in (0, 1], got {ngram} and {threshold}")
        self.ngram, self.threshold = ngram, threshold
        self.parts: list[tuple[str, str, int]] = []  # (problem id, part name, distinct n-grams)
        self._index: dict[tuple[str, ...], list[int]] = {}
        self.benchmarks: Counter[str] = Counter()  # problems per benchmark
        for p in problems:
            self.benchmarks[p.benchmark] += 1
            for part, text in (("prompt", p.prompt), ("tests", p.tests), ("solution", p.solution)):
                grams = ngrams(normalized_tokens(text), ngram)
                if not grams:
                    continue
                pid = len(self.parts)
                self.parts.append((p.id, part, len(grams)))
                for g in grams:
                    self._index.setdefault(g, []).append(pid)
        self._grams = frozenset(self._index)  # a set's intersection with a set runs in C (with dict keys it copies)
        self.mbpp_sources = [str(f) for f in mbpp_sources]
        self.counts: Counter[str] = Counter()
        self.by_rule: Counter[str] = Counter()
        self.checked = 0
        self.examples: list[dict[str, Any]] = []

    @classmethod
    def from_config(cls, cfg: SFTConfig, mbpp_sources: Sequence[str | os.PathLike] = (),
                    unchecked: Sequence[str] | None = None) -> Decontaminator:
        """HumanEval, the MBPP test problems in ``cfg.decontam_mbpp``, and the held-out tasks (outside
        :data:`MBPP_SFT_SPLITS`) of the MBPP files among the SFT sources (``mbpp_sources``, see
        :func:`codechat.data.provenance.mbpp_files`).

        Logs a warning (one line, logger ``codechat.data.mining``) when HumanEval's shipped file is
        missing, when an MBPP source holds no held-out task, and when MBPP is checked neither way
        while there is data it matters for: ``unchecked`` names the sources that could hold copies
        of MBPP's test problems (an empty list: none, so nothing to say; None: not known, so the
        warning is general).
        """
        problems: list[BenchmarkProblem] = []
        if humaneval_file() is not None:
            problems += humaneval_problems()
        else:
            log.warning("decontamination cannot check HumanEval: the HumanEval.jsonl.gz shipped with codechat is "
                        "missing (codechat/data/shipped/); reinstall codechat")
        if cfg.decontam_mbpp:
            problems += mbpp_problems(cfg.decontam_mbpp)
        elif not mbpp_sources and (unchecked is None or unchecked):
            which = "" if unchecked is None else f" for {', '.join(unchecked)}"
            log.warning(f"decontamination does not check MBPP's test problems{which}: give the MBPP file as "
                        "--sft.decontam_mbpp PATH/mbpp.jsonl")
        held_out = tuple(s for s in MBPP_SPLITS if s not in MBPP_SFT_SPLITS)
        for f in mbpp_sources:
            try:
                problems += mbpp_problems(f, held_out)
            except ValueError:  # e.g. a train-only file: its own tasks are fine, but nothing to check others against
                if not cfg.decontam_mbpp:
                    log.warning(f"the MBPP source {f} holds no {'/'.join(held_out)} task, so the other sources are "
                                "not checked against MBPP's test problems; give the full MBPP file as "
                                "--sft.decontam_mbpp PATH/mbpp.jsonl")
        return cls(dict.fromkeys(problems), ngram=cfg.decontam_ngram, threshold=cfg.decontam_threshold,
                   mbpp_sources=[str(f) for f in mbpp_sources])

    def overlap(self, conv: Conversation | str) -> Overlap | None:
        """The strongest overlap of ``conv`` (or a text) with a benchmark part at or over the threshold, or ``None``
        (of equal shares, the first problem's first part: prompt, tests, solution)."""
        text = conv if isinstance(conv, str) else conversation_text(conv)
        hits: Counter[int] = Counter()
        for g in ngrams(normalized_tokens(text), self.ngram) & self._grams:  # the shared few
            for pid in self._index[g]:
                hits[pid] += 1
        best: Overlap | None = None
        for pid, n in sorted(hits.items()):  # ties go to the first part, whatever the set's hash order
            problem, part, total = self.parts[pid]
            frac = n / total
            if frac >= self.threshold and (best is None or frac > best.fraction):
                best = Overlap(problem, part, frac)
        return best

    def keep(self, record: Record) -> bool:
        """False (and counted) when ``record`` is a held-out MBPP task or overlaps a benchmark problem."""
        self.checked += 1
        task = mbpp_held_out_task(record)
        hit = Overlap(task, "task_id", 1.0) if task else self.overlap(record.conversation)
        if hit is None:
            return True
        self.counts[hit.problem.split("/", 1)[0]] += 1
        self.by_rule["task_id" if task else "ngram"] += 1
        if len(self.examples) < self.MAX_EXAMPLES:
            self.examples.append({"source": record.source, "line": record.line, "problem": hit.problem,
                                  "part": hit.part, "fraction": round(hit.fraction, 3)})
        return False

    def report(self) -> dict[str, Any]:
        """Checked and excluded counts (per benchmark and per rule), the rules' settings and the first exclusions."""
        return {"checked": self.checked, "excluded": sum(self.counts.values()), "by_benchmark": dict(self.counts),
                "by_rule": dict(self.by_rule), "problems": dict(self.benchmarks), "ngram": self.ngram,
                "threshold": self.threshold, "mbpp_sources": list(self.mbpp_sources),
                "mbpp_kept_splits": list(MBPP_SFT_SPLITS), "examples": list(self.examples)}

    def format_report(self) -> str:
        """:meth:`report` as one line, for logs."""
        r = self.report()
        return (f"decontamination: checked {r['checked']}, excluded {r['excluded']} (by benchmark "
                f"{r['by_benchmark'] or 'none'}; held-out MBPP tasks by task_id {r['by_rule'].get('task_id', 0)}, "
                f"by {self.ngram}-gram overlap {r['by_rule'].get('ngram', 0)})")


__all__ = ["MINED_PROMPT", "MINE_STYLES", "MiningCounts", "mine_records", "write_mined", "BenchmarkProblem",
           "humaneval_file", "humaneval_problems", "mbpp_problems", "mbpp_held_out_task", "MBPP_SFT_SPLITS",
           "normalized_tokens", "ngrams", "conversation_text", "Overlap", "Decontaminator"]
