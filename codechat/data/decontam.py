"""Decontamination of training data against the evaluation benchmarks.

:class:`Decontaminator` excludes any SFT example that overlaps a HumanEval
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

import gzip
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codechat.chat.conversation import Conversation
from codechat.config.sft import SFTConfig
from codechat.data.benchmarks import HUMANEVAL_FILE, MBPP_SPLITS, mbpp_split
from codechat.data.formats import Record

log = logging.getLogger(__name__)

#: MBPP splits checked by default (task ids 11-510, the split every MBPP score is reported on).
MBPP_DECONTAM_SPLITS: tuple[str, ...] = ("test",)
#: MBPP splits an MBPP *source* keeps (train 601-974, few-shot prompts 1-10); its other tasks are excluded.
MBPP_SFT_SPLITS: tuple[str, ...] = ("train", "prompt")
_MBPP_ID = re.compile(r"(?:mbpp/)?(\d+)")
_TOKEN = re.compile(r"[a-z_][a-z0-9_]*|\d+|[^\sa-z0-9_]")


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

        Logs a warning (one line, logger ``codechat.data.decontam``) when HumanEval's shipped file is
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


__all__ = ["BenchmarkProblem", "humaneval_file", "humaneval_problems", "mbpp_problems", "mbpp_held_out_task",
           "MBPP_DECONTAM_SPLITS", "MBPP_SFT_SPLITS", "normalized_tokens", "ngrams", "conversation_text", "Overlap",
           "Decontaminator"]
