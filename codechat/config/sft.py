"""Frozen, validated configuration of chat SFT: the data (:class:`SFTConfig`, the ``sft:`` section)
and the whole ``codechat sft`` stage (:class:`SFTStageConfig`). The other sections, loading and
overrides are :mod:`codechat.config.stages`'s.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from codechat.config.lora import LoraConfig, check_peft
from codechat.config.stages import OptimConfig, RunConfig, TrainConfig, check_init
from codechat.config.yaml_io import _check

#: Record formats of SFT data files (``codechat.data.formats``); ``auto`` detects from the fields.
SFT_FORMATS: tuple[str, ...] = ("auto", "messages", "sharegpt", "glaive", "alpaca", "mbpp", "humaneval", "qa",
                                "completion", "prompt", "text")
#: How a mixture draws (``codechat.data.mixture``): ``sample`` draws sources by normalised weight
#: (with replacement across epochs), ``epoch`` takes ``weight x size`` rows of each source per epoch.
SFT_MIX_MODES: tuple[str, ...] = ("sample", "epoch")
#: How mined functions are asked for (``codechat.data.mining``): their docstring as the instruction,
#: HumanEval's completion prompt (signature + docstring), or both conversations of each function.
MINE_STYLES: tuple[str, ...] = ("docstring", "complete", "both")
#: The smallest prompt budget: ``<|bos|>`` plus the final ``<|assistant|>`` header.
MIN_PROMPT_TOKENS = 2


@dataclass(frozen=True)
class SFTConfig:
    """Chat SFT data: where examples come from, how they are cut to budget, and how they are batched.

    A conversation is rendered by :func:`codechat.chat.budget.render_with_budget`: its last assistant
    turn is the completion and everything before it the prompt. ``max_prompt_length`` bounds the
    prompt (``<|bos|>`` through the final ``<|assistant|>`` header) and ``max_length`` the whole row,
    so the completion always keeps at least ``max_length - max_prompt_length`` >= 1 tokens.

    Unless set, the budgets follow the model: ``max_length`` 0 becomes the model's
    ``max_seq_len`` (:meth:`for_model`, called by the SFT stage once the checkpoint is loaded) and
    ``max_prompt_length`` 0 becomes ``prompt_share`` of ``max_length``. An explicit
    ``max_length`` wins, and :meth:`for_model` refuses one over the model's limit.
    """

    data: str = ""  # mixture spec SOURCE[:WEIGHT],...; "" -> docstring->function pairs mined from mine_src
    format: str = "auto"  # record format of every source; auto -> detected per file from its first record
    mix_mode: str = "sample"  # see SFT_MIX_MODES
    max_length: int = 0  # tokens per example, prompt + completion; 0 -> the model's max_seq_len
    max_prompt_length: int = 0  # tokens of prompt, < max_length; 0 -> prompt_share x max_length
    prompt_share: float = 0.75  # share of max_length the prompt may take when max_prompt_length is 0
    packing: bool = False  # best-fit pack examples into rows of max_length instead of padding
    chunk_examples: int = 2048  # records rendered, sorted or packed, and shuffled together
    pad_to_multiple: int = 8  # padded rows are padded to a multiple of this (packed rows: to max_length)
    preflight_examples: int = 2000  # records rendered before step 0 to count what the budgets keep
    eval_examples: int = 64  # first kept preflight examples whose loss is logged as eval_loss
    eval_data: str = ""  # mixture spec of held-out records: eval_loss over their first eval_examples kept ones
    #                      (rendered and decontaminated as data); "" -> the first training examples (what the model fits)
    skip_bad: bool = False  # skip (and count) records that fit no format instead of failing
    max_examples: int = 0  # > 0 -> a seeded subset of at most this many records (smoke tests)
    seed: int = 1337  # mixture order and subsets
    decontaminate: bool = True  # drop examples overlapping HumanEval / MBPP test problems (codechat.data.decontam)
    decontam_mbpp: str = ""  # MBPP .jsonl whose test problems are checked too; "" -> HumanEval, plus the held-out
    #                          tasks of MBPP files among the sources (an MBPP source keeps only train and prompt)
    decontam_ngram: int = 10  # n of the normalised token n-grams compared
    decontam_threshold: float = 0.5  # share of a benchmark text's n-grams found in an example that excludes it
    mine_src: tuple[str, ...] = ()  # sources mined when data is ""; () -> default_corpus_dirs()
    mine_max_files: int = 0  # 0 -> every file
    mine_max_examples: int = 0  # 0 -> every mined pair
    mine_style: str = "docstring"  # MINE_STYLES: docstring, complete (HumanEval's prompt) or both
    mine_workers: int = 1  # processes parsing the mined files (0: one per CPU core); same records for any number
    teacher_completions: str = ""  # DIR/completions.jsonl of codechat distill: each record's prompt gets its answer

    #: Fields derived from others when 0 (see :func:`load`: setting an input re-derives them).
    DERIVED: ClassVar[dict[str, tuple[str, ...]]] = {"max_prompt_length": ("max_length", "prompt_share")}

    def __post_init__(self) -> None:
        _check(self.max_length == 0 or self.max_length > MIN_PROMPT_TOKENS,
               f"sft.max_length must be > {MIN_PROMPT_TOKENS} (or 0: the model's max_seq_len), got {self.max_length}")
        _check(0.0 < self.prompt_share < 1.0, f"sft.prompt_share must be in (0, 1), got {self.prompt_share}")
        if self.max_length and not self.max_prompt_length:
            object.__setattr__(self, "max_prompt_length",
                               max(MIN_PROMPT_TOKENS, int(self.max_length * self.prompt_share)))
        _check(self.max_prompt_length == 0 or self.max_prompt_length >= MIN_PROMPT_TOKENS,
               f"sft.max_prompt_length must be >= {MIN_PROMPT_TOKENS} (<|bos|> and the <|assistant|> header), "
               f"got {self.max_prompt_length}")
        _check(not self.max_length or self.max_prompt_length < self.max_length,
               f"sft.max_prompt_length={self.max_prompt_length} >= sft.max_length={self.max_length} leaves no "
               "tokens for the completion, so every label would be masked; lower --sft.max_prompt_length below "
               "--sft.max_length")
        for name in ("chunk_examples", "pad_to_multiple", "preflight_examples", "eval_examples"):
            _check(getattr(self, name) > 0, f"sft.{name} must be > 0, got {getattr(self, name)}")
        _check(self.max_examples >= 0, f"sft.max_examples must be >= 0 (0: all), got {self.max_examples}")
        _check(self.format in SFT_FORMATS, f"sft.format must be one of {', '.join(SFT_FORMATS)}, got {self.format!r}")
        _check(self.mix_mode in SFT_MIX_MODES,
               f"sft.mix_mode must be one of {', '.join(SFT_MIX_MODES)}, got {self.mix_mode!r}")
        _check(self.decontam_ngram >= 1, f"sft.decontam_ngram must be >= 1, got {self.decontam_ngram}")
        _check(0.0 < self.decontam_threshold <= 1.0,
               f"sft.decontam_threshold must be in (0, 1], got {self.decontam_threshold}")
        _check(self.mine_style in MINE_STYLES,
               f"sft.mine_style must be one of {', '.join(MINE_STYLES)}, got {self.mine_style!r}")
        _check(self.mine_max_files >= 0 and self.mine_max_examples >= 0 and self.mine_workers >= 0,
               "sft.mine_max_files, sft.mine_max_examples and sft.mine_workers must be >= 0 (0: all / one per core)")
        _check(not self.teacher_completions or Path(self.teacher_completions).is_file(),
               f"sft.teacher_completions {self.teacher_completions!r} is not a file; give the completions.jsonl "
               "that codechat distill wrote")
        for p in (self.decontam_mbpp, *self.mine_src):
            _check(not p or Path(p).exists(), f"path {p!r} (sft.*) does not exist; fix the path or leave it empty")

    def for_model(self, max_seq_len: int, where: str = "") -> "SFTConfig":
        """This config with the budgets left at 0 taken from a model of context ``max_seq_len`` (``where``: its path).

        Raises:
            ConfigError: an explicit ``max_length`` over ``max_seq_len``, or an explicit
                ``max_prompt_length`` that leaves no completion within it.
        """
        _check(self.max_length <= max_seq_len,
               f"sft.max_length={self.max_length} is over the model's limit max_seq_len={max_seq_len}"
               f"{f' ({where})' if where else ''}; lower --sft.max_length to at most {max_seq_len}, or leave it "
               "unset to follow the model")
        _check(self.max_length or self.max_prompt_length < max_seq_len,
               f"sft.max_prompt_length={self.max_prompt_length} leaves no tokens for the completion within the "
               f"model's max_seq_len={max_seq_len}{f' ({where})' if where else ''}; lower --sft.max_prompt_length")
        return self if self.max_length else replace(self, max_length=max_seq_len)



@dataclass(frozen=True)
class SFTStageConfig:
    """Everything ``codechat sft`` needs: the model to start from, the data, optimizer, loop and run, and
    whether every weight is trained or LoRA adapters on the frozen model (``peft``, ``lora``)."""

    init: str = ""  # stage directory or checkpoint to start from (required)
    sft: SFTConfig = field(default_factory=SFTConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-4, warmup_steps=20, schedule="linear",
                                                                   min_lr_ratio=0.0, weight_decay=0.0))
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=1.0, micro_batch_size=8, log_every=10,
                                                                   eval_every=10**9, save_every=500))
    run: RunConfig = field(default_factory=lambda: RunConfig(out="runs/default/sft"))
    peft: str = "none"  # PEFT_METHODS: none (every weight trained) | lora (adapters on the frozen --init)
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        check_peft(self.peft, self.optim, self.train)
        _check(not (self.sft.packing and self.train.pp > 1),
               "--packing with --pp: pipeline stages do not pass the documents of packed rows along yet; "
               "leave --packing out or use --pp 1")

    def check_init(self) -> None:
        """Raises ConfigError unless ``init`` names an existing run directory or checkpoint."""
        check_init(self.init, "the pretrained stage")


__all__ = ["SFTConfig", "SFTStageConfig", "SFT_FORMATS", "SFT_MIX_MODES", "MINE_STYLES", "MIN_PROMPT_TOKENS"]
