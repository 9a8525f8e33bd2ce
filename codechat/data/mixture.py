"""Weighted SFT data mixtures: ``SOURCE[:WEIGHT],...`` -> a deterministic, resumable stream of records.

Spec (parsed by :mod:`codechat.data.spec`). Comma-separated sources, each ``SOURCE[#FORMAT][:WEIGHT]``. The last ``:`` field is the
weight only if it parses as a number (so ``hf:org/name:config`` has no weight and
``hf:org/name:config:2`` has weight 2); a missing weight is 1.0. A source is

- a local ``.jsonl`` / ``.json`` / ``.parquet`` file, optionally ``.gz``, or a directory of them
  (relative paths are resolved against ``base_dir``, default the working directory);
  ``FILE@train`` / ``FILE@heldout`` keeps one part of it by a stated hash of each record
  (:func:`codechat.data.benchmarks.conversation_split`; the function-calling evaluation scores
  the held-out part);
- ``hf:ORG/NAME[:CONFIG][@SPLIT]``: a Hugging Face dataset through ``datasets`` (imported only
  then; split default ``train``);
- ``mine:[DIR]``: (docstring -> function) pairs mined from Python files (default: this Python's
  standard library), see :mod:`codechat.data.mining`.

``#FORMAT`` forces a record format (see :mod:`codechat.data.formats`); otherwise it is detected.
Weights must be finite and >= 0, not all 0. A zero-weight source is never loaded nor drawn. A
positive-weight source with no records (empty, or all skipped / decontaminated) is an error
naming it.

Modes (:data:`~codechat.config.sft.SFT_MIX_MODES`):

- ``sample`` (default): each draw picks a source with probability ``weight / sum(weights)``;
  inside a source, records come in a seeded shuffled order, every record once before any
  repeats (then a new shuffle). An epoch is ``sum(records of the drawn sources)`` draws.
- ``epoch``: the weight multiplies a source's size: an epoch holds ``round(weight * records)``
  rows of it (weight 1: each record once; 2: twice; 0.5: a seeded half, a new half each
  epoch), all shuffled together.

Everything is a function of ``seed``; the position (``state_dict``) is a few integers, so a
resumed run continues the exact order. ``max_examples`` keeps a seeded subset: the distinct
records among the first ``max_examples`` draws, which then form the whole mixture.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from codechat.config.sft import SFT_MIX_MODES, SFTConfig
from codechat.config.stages import ConfigError
from codechat.data.benchmarks import conversation_split
from codechat.data.formats import FORMATS, Record, iter_records, records_from_rows
from codechat.data.readers import LoadCounts, data_files, hub_rows, read_rows
from codechat.data.spec import SourceSpec, parse_spec, resolve_path

#: Appended to a bad record's error: the commands that load a mixture and take ``--skip-bad``
#: (``speedrun`` loads mixtures without one; ``eval`` reads its files through
#: :mod:`codechat.data.formats`, whose errors name no flag).
SKIP_BAD_HINT = ("codechat sft --skip-bad, codechat distill --skip-bad and codechat data inspect --skip-bad skip and "
                 "count such records")

#: Draws whose sources are generated together from one seeded generator (resume regenerates one block).
BLOCK = 4096
#: Stream ids that keep the seeded generators of the different choices independent.
_SOURCES, _RECORDS, _EPOCH_ROWS, _EPOCH_ORDER = 1, 2, 3, 4
STATE_VERSION = 1


# ----------------------------------------------------------------------------- loading
def load_source(spec: SourceSpec, cfg: SFTConfig, *, base_dir: str | os.PathLike | None = None,
                counts: LoadCounts | None = None) -> list[Record]:
    """All records of one source (``cfg`` gives the format default, ``skip_bad`` and the mining limits).

    Raises:
        ConfigError: the source is missing or unreadable, or a bad record without ``skip_bad``
            (its message ends with :data:`SKIP_BAD_HINT`).
    """
    from codechat.data.formats import BadRecordError, FormatError
    counts = counts if counts is not None else LoadCounts()
    fmt = spec.format if spec.format != "auto" else cfg.format
    if spec.source.startswith("mine:"):
        from codechat.config.stages import default_corpus_dirs
        from codechat.data.mining import mine_records
        where = spec.source[len("mine:"):]
        srcs = [resolve_path(where, base_dir)] if where else list(cfg.mine_src or default_corpus_dirs())
        records = list(mine_records(srcs, max_files=cfg.mine_max_files, max_examples=cfg.mine_max_examples,
                                    style=cfg.mine_style, workers=cfg.mine_workers))
        counts.records += len(records)
        return records
    try:
        if spec.source.startswith("hf:"):
            return list(records_from_rows(hub_rows(spec.source), spec.source, format=fmt, skip_bad=cfg.skip_bad,
                                          counts=counts))
        path = resolve_path(spec.source, base_dir)
        if spec.split:
            return [rec for f in data_files(path) for rec in records_from_rows(
                ((line, r) for line, r in read_rows(f) if conversation_split(r) == spec.split), str(f),
                format=fmt, skip_bad=cfg.skip_bad, counts=counts)]
        return list(iter_records(path, format=fmt, skip_bad=cfg.skip_bad, counts=counts))
    except BadRecordError as e:
        raise ConfigError(f"{e} ({SKIP_BAD_HINT})") from None
    except FormatError as e:
        raise ConfigError(str(e)) from None


@dataclass
class Source:
    """A loaded source: its records (after filtering) and what was read, skipped and excluded."""

    name: str
    weight: float
    records: list[Record]
    counts: LoadCounts = field(default_factory=LoadCounts)
    excluded: int = 0  # records dropped by the filter (decontamination)


# ----------------------------------------------------------------------------- the mixture
class Mixture:
    """A deterministic, resumable, infinite stream of :class:`Record` drawn from weighted sources.

    ``next(mixture)`` gives the next record; :meth:`iter_epoch` the rest of the current epoch;
    ``state_dict()`` / ``load_state_dict()`` save and restore the position; :meth:`report`
    gives the realised proportions.

    Raises:
        ConfigError: a bad mode, no source with a positive weight, or a positive-weight source with no records.
    """

    def __init__(self, sources: Sequence[Source], *, seed: int = 0, mode: str = "sample",
                 max_examples: int = 0) -> None:
        if mode not in SFT_MIX_MODES:
            raise ConfigError(f"mixture mode must be one of {', '.join(SFT_MIX_MODES)}, got {mode!r}")
        if max_examples < 0:
            raise ConfigError(f"max_examples must be >= 0, got {max_examples}")
        self.sources, self.seed, self.mode = list(sources), int(seed), mode
        self.active = [k for k, s in enumerate(self.sources) if s.weight > 0]
        if not self.active:
            raise ConfigError("every source of the mixture has weight 0; give one a positive weight")
        for k in self.active:
            s = self.sources[k]
            if not s.records:
                why = (f" ({s.counts.n_skipped} skipped as bad: {s.counts.skipped})" if s.counts.n_skipped else "") + \
                      (f" ({s.excluded} excluded by decontamination)" if s.excluded else "")
                raise ConfigError(f"data source {s.name!r} is empty: it has no records{why}; remove it from the spec "
                                  "or give it weight 0")
        total = sum(self.sources[k].weight for k in self.active)
        self.probabilities = [s.weight / total for s in self.sources]
        self._cdf = np.cumsum([self.probabilities[k] for k in self.active])
        self._cdf[-1] = 1.0
        self.max_examples = max_examples
        self.decontaminator: Any = None  # set by from_config
        self._reset()
        if max_examples:
            self._take_subset(max_examples)

    # -------------------------------------------------------------- construction helpers
    @classmethod
    def from_spec(cls, spec: str, cfg: SFTConfig | None = None, *, base_dir: str | os.PathLike | None = None,
                  keep: Callable[[Record], bool] | None = None, progress: Callable[[str], None] | None = None
                  ) -> Mixture:
        """Load every positive-weight source of ``spec`` (``cfg`` gives seed, mode, format, skip_bad, max_examples).

        ``keep(record)`` False excludes a record (counted in ``Source.excluded``), e.g.
        :meth:`codechat.data.decontam.Decontaminator.keep`. With ``cfg.teacher_completions`` each
        record is its prompt plus the teacher's answer (:func:`codechat.data.prompts.join_answers`),
        joined before ``keep``.

        Raises:
            ConfigError: a source cannot be loaded, or (``teacher_completions``) the completions file is
                malformed or has no answer for some prompts (all named at once).
        """
        from codechat.data.formats import FormatError
        from codechat.data.prompts import join_answers, missing_message, read_answers
        cfg = cfg or SFTConfig()
        try:
            answers = read_answers(cfg.teacher_completions) if cfg.teacher_completions else None
        except FormatError as e:
            raise ConfigError(str(e)) from None
        sources, missing = [], []
        for item in parse_spec(spec):
            if item.weight == 0:
                if not item.source.startswith(("hf:", "mine:")):
                    try:
                        data_files(resolve_path(item.source, base_dir))  # a typo is still an error
                    except ValueError as e:
                        raise ConfigError(str(e)) from None
                sources.append(Source(item.source, 0.0, []))
                continue
            if progress:
                progress(f"loading {item.source}")
            counts = LoadCounts()
            records = load_source(item, cfg, base_dir=base_dir, counts=counts)
            if answers is not None:  # the teacher's answers replace the records' own (prompt-only data: their only)
                records, lost = join_answers(records, answers)
                missing += lost
            kept = [r for r in records if keep(r)] if keep else records
            sources.append(Source(item.source, item.weight, kept, counts, len(records) - len(kept)))
        if missing:
            raise ConfigError(missing_message(cfg.teacher_completions, missing))
        return cls(sources, seed=cfg.seed, mode=cfg.mix_mode, max_examples=cfg.max_examples)

    @classmethod
    def from_config(cls, cfg: SFTConfig, *, base_dir: str | os.PathLike | None = None,
                    progress: Callable[[str], None] | None = None) -> Mixture:
        """The mixture of ``cfg.data`` (``""``: ``mine:`` pairs), decontaminated when ``cfg.decontaminate``.

        The decontaminator is kept as ``mixture.decontaminator`` (its ``counts`` say what was excluded).
        That MBPP is not checked is logged only when there are sources it matters for
        (:func:`third_party_sources`): pairs mined from Python source have nothing to say about it.
        """
        from codechat.data.decontam import Decontaminator
        dec = None
        if cfg.decontaminate:
            spec = cfg.data or "mine:"
            from codechat.data.provenance import mbpp_files, third_party_sources
            mbpp = mbpp_files(spec, cfg, base_dir)
            unchecked = [] if cfg.decontam_mbpp else third_party_sources(spec, cfg, base_dir, mbpp)
            dec = Decontaminator.from_config(cfg, mbpp_sources=mbpp, unchecked=unchecked)
        mix = cls.from_spec(cfg.data or "mine:", cfg, base_dir=base_dir, keep=dec.keep if dec else None,
                            progress=progress)
        mix.decontaminator = dec
        return mix

    def _take_subset(self, n: int) -> None:
        """Keep the distinct records among the first ``n`` draws; the mixture restarts on them."""
        chosen: dict[int, set[int]] = {k: set() for k in self.active}
        for _ in range(n):
            s, i = self._draw()
            chosen[s].add(i)
        for k in self.active:
            src = self.sources[k]
            src.records = [src.records[i] for i in sorted(chosen[k])]
        self.active = [k for k in self.active if self.sources[k].records]
        self._cdf = np.cumsum([self.probabilities[k] for k in self.active])
        self._cdf /= self._cdf[-1]
        self._cdf[-1] = 1.0
        self._reset()

    def _reset(self) -> None:
        self.pos = 0  # draws so far (sample) / rows of the current epoch so far (epoch mode)
        self._epoch = 0
        self.taken = [0] * len(self.sources)  # draws per source since the start
        self._block: tuple[int, np.ndarray] | None = None
        self._perm: dict[int, tuple[int, np.ndarray]] = {}
        self._order: tuple[int, np.ndarray, np.ndarray] | None = None

    # -------------------------------------------------------------- sizes
    @property
    def epoch_size(self) -> int:
        """Draws per epoch: all records of the drawn sources (sample), or the sum of the quotas (epoch)."""
        if self.mode == "sample":
            return sum(len(self.sources[k].records) for k in self.active)
        return sum(self._quota(k) for k in self.active)

    def _quota(self, k: int) -> int:
        return int(round(self.sources[k].weight * len(self.sources[k].records)))

    @property
    def epoch(self) -> int:
        """The epoch the next draw belongs to."""
        if self.mode == "sample":
            return self.pos // self.epoch_size
        return self._epoch + (self.pos >= self.epoch_size)

    # -------------------------------------------------------------- drawing
    def _record_index(self, k: int, taken: int) -> int:
        n = len(self.sources[k].records)
        cycle = taken // n
        cached = self._perm.get(k)
        if cached is None or cached[0] != cycle:
            cached = (cycle, np.random.default_rng([self.seed, _RECORDS, k, cycle]).permutation(n))
            self._perm[k] = cached
        return int(cached[1][taken % n])

    def _draw(self) -> tuple[int, int]:
        """(source index, record index) of the next draw; advances the position."""
        if self.mode == "epoch":
            return self._draw_epoch()
        block, at = divmod(self.pos, BLOCK)
        if self._block is None or self._block[0] != block:
            u = np.random.default_rng([self.seed, _SOURCES, block]).random(BLOCK)
            self._block = (block, np.searchsorted(self._cdf, u, side="right"))
        k = self.active[int(self._block[1][at])]
        i = self._record_index(k, self.taken[k])
        self.taken[k] += 1
        self.pos += 1
        return k, i

    def _epoch_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        if self._order is None or self._order[0] != epoch:
            src, idx = [], []
            for k in self.active:
                n, quota = len(self.sources[k].records), self._quota(k)
                reps, rem = divmod(quota, n)
                rows = np.random.default_rng([self.seed, _EPOCH_ROWS, epoch, k]).permutation(n)[:rem]
                idx.append(np.concatenate([np.tile(np.arange(n), reps), rows]))
                src.append(np.full(quota, k))
            s, i = np.concatenate(src).astype(np.int64), np.concatenate(idx).astype(np.int64)
            order = np.random.default_rng([self.seed, _EPOCH_ORDER, epoch]).permutation(len(s))
            self._order = (epoch, s[order], i[order])
        return self._order[1], self._order[2]

    def _draw_epoch(self) -> tuple[int, int]:
        if self.epoch_size == 0:
            raise ConfigError("in epoch mode every source's round(weight x records) is 0: the epoch is empty; raise "
                              "the weights")
        if self.pos >= self.epoch_size:
            self._epoch, self.pos = self._epoch + 1, 0
        s, i = self._epoch_order(self._epoch)
        k, idx = int(s[self.pos]), int(i[self.pos])
        self.pos += 1
        self.taken[k] += 1
        return k, idx

    def __iter__(self) -> Mixture:
        return self

    def __next__(self) -> Record:
        k, i = self._draw()
        return self.sources[k].records[i]

    def iter_epoch(self) -> Iterator[Record]:
        """The records left in the current epoch (a whole epoch from its start); always finite."""
        if self.mode == "sample":
            left = self.epoch_size - self.pos % self.epoch_size
        else:
            left = self.epoch_size - self.pos if self.pos < self.epoch_size else self.epoch_size
        for _ in range(left):
            yield next(self)

    # -------------------------------------------------------------- state
    def _fingerprint(self) -> list[Any]:
        return [self.mode, self.seed, [[s.name, s.weight, len(s.records)] for s in self.sources]]

    def state_dict(self) -> dict[str, Any]:
        """The position: restoring it into a mixture built from the same spec continues the exact order."""
        return {"version": STATE_VERSION, "pos": self.pos, "epoch": self._epoch, "taken": list(self.taken),
                "fingerprint": self._fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`.

        Raises:
            ConfigError: the state comes from a different mixture (sources, weights, sizes, seed or mode).
        """
        if state.get("version") != STATE_VERSION or state.get("fingerprint") != self._fingerprint():
            raise ConfigError("the saved data position belongs to a different data mixture (sources, weights, sizes, "
                              f"seed or mode differ): saved {state.get('fingerprint')}, now {self._fingerprint()}")
        self._reset()
        self.pos, self._epoch, self.taken = int(state["pos"]), int(state["epoch"]), [int(t) for t in state["taken"]]

    # -------------------------------------------------------------- reporting
    def report(self, realised: bool = True) -> list[dict[str, Any]]:
        """Per source: weight, target probability (sample) or epoch share, records, skipped, excluded, and
        with ``realised`` the realised proportion: ``drawn`` (records drawn since the run began; a loader
        draws a whole chunk at a time) and ``share`` (of all draws). Before any draw there is no
        realised proportion: report it (``realised=True``) after training, not as zeros before.
        """
        drawn = sum(self.taken)
        size = self.epoch_size
        rows = []
        for k, s in enumerate(self.sources):
            target = self.probabilities[k] if self.mode == "sample" else \
                (self._quota(k) / size if k in self.active and size else 0.0)
            rows.append({"source": s.name, "weight": s.weight, "target_share": round(target, 6),
                         "records": len(s.records), "skipped": s.counts.n_skipped, "excluded": s.excluded})
            if realised:
                rows[-1].update(drawn=self.taken[k], share=round(self.taken[k] / drawn, 6) if drawn else 0.0)
        return rows

    def format_report(self, realised: bool = True) -> str:
        """:meth:`report` as one line per source, for logs."""
        return "\n".join(f"{r['source']}: weight {r['weight']:g}, target {r['target_share']:.3f}"
                         + (f", realised {r['share']:.3f} ({r['drawn']} drawn of " if realised else " (")
                         + f"{r['records']} records; {r['skipped']} skipped, {r['excluded']} excluded)"
                         for r in self.report(realised))


__all__ = ["BLOCK", "Source", "Mixture", "load_source",
           "FORMATS", "SKIP_BAD_HINT"]
