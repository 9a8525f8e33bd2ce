"""Frozen, validated configuration: one dataclass per concern, YAML files, CLI overrides.

Every magic number of a stage lives here as a field. Each dataclass checks itself in
``__post_init__`` and raises :class:`ConfigError` with a message that names the setting
and says what to change, so a run that would be useless fails before step 0.

Overrides use dotted names: ``--optim.lr 3e-4 --train.max_steps 100``; a YAML file has one
mapping per section (``model:``, ``data:``, ``optim:``, ``train:``, ``run:``). Loading, building and
writing them is :mod:`codechat.config.yaml_io` (re-exported here).
"""
from __future__ import annotations

import glob
import math
import re
import sysconfig
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


from codechat.config.lora import LoraConfig, check_peft
from codechat.config.model import (MLP_ACTS, PRESETS, ModelConfig, check_pipeline_options,  # noqa: F401 (re-exported)
                                   preset)
from codechat.config.yaml_io import (ConfigError, _check, build, load, parse_overrides, save_yaml,  # noqa: F401 (re-exported)
                                     to_dict)


# ----------------------------------------------------------------------------- data
def default_corpus_dirs() -> tuple[str, ...]:
    """The running Python's standard library: real source code present on every machine."""
    return (sysconfig.get_paths()["stdlib"],)


#: ``data.quality``: off (no scores), report (bands in index.json, nothing changed), filter (the train split's
#: documents written ``data.quality_weights`` times by band; codechat.data.quality).
QUALITY_MODES = ("off", "report", "filter")
#: The bands of codechat.data.quality.score_document, worst first.
QUALITY_BANDS = ("drop", "low", "standard", "high")


def parse_quality_weights(spec: str) -> dict[str, float]:
    """``"drop:0,low:0.5,standard:1,high:1"`` -> ``{band: weight}`` (every band named once, weights >= 0).

    Raises:
        ConfigError: a malformed entry, an unknown or missing band, a negative weight.
    """
    out: dict[str, float] = {}
    for part in filter(None, (x.strip() for x in spec.split(","))):
        band, sep, w = part.partition(":")
        try:
            weight = float(w)
        except ValueError:
            weight = -1.0
        _check(bool(sep) and band in QUALITY_BANDS and band not in out and weight >= 0,
               f"data.quality_weights: {part!r} is not BAND:WEIGHT with BAND one of {', '.join(QUALITY_BANDS)} "
               "(each once) and WEIGHT >= 0")
        out[band] = weight
    _check(set(out) == set(QUALITY_BANDS), f"data.quality_weights {spec!r} must give every band: "
                                           f"{', '.join(QUALITY_BANDS)}")
    return out


@dataclass(frozen=True)
class DataConfig:
    """Where pretraining tokens come from and how they are cut into windows.

    ``data_dir``/``tokenizer_dir`` empty means: build the default tokenizer and corpus
    from ``src`` into the run directory.
    """

    data_dir: str = ""
    tokenizer_dir: str = ""
    src: tuple[str, ...] = ()  # dirs, files, globs, .jsonl/.json/.parquet files, hf:ORG/NAME (data.sources); () -> stdlib
    extensions: tuple[str, ...] = (".py",)
    text_fields: tuple[str, ...] = ("content", "text")  # a data-file record's text: the first of these it has
    vocab_size: int = 32768  # only used when a tokenizer is trained
    tokenizer_max_bytes: int = 100_000_000  # cap on the text a tokenizer is trained on; 0 -> the whole train split
    val_fraction: float = 0.05
    max_files: int = 0  # 0 -> all files
    seq_len: int = 1024
    workers: int = 0  # tokenising processes; 0 -> os.cpu_count()
    quality: str = "off"  # QUALITY_MODES: document quality bands in the corpus build (codechat.data.quality)
    quality_weights: str = "drop:0,low:0.5,standard:1,high:1"  # copies of a train document per band (filter)

    def __post_init__(self) -> None:
        _check(self.quality in QUALITY_MODES,
               f"data.quality must be one of {', '.join(QUALITY_MODES)}, got {self.quality!r}")
        weights = parse_quality_weights(self.quality_weights)
        _check(self.quality != "filter" or any(weights[b] > 0 for b in QUALITY_BANDS),
               "data.quality=filter with every band's weight 0 would write no training document; raise a weight")
        _check(self.seq_len >= 2, f"data.seq_len must be >= 2, got {self.seq_len}")
        _check(0.0 < self.val_fraction < 0.5, f"data.val_fraction must be in (0, 0.5), got {self.val_fraction}")
        _check(self.max_files >= 0 and self.workers >= 0 and self.tokenizer_max_bytes >= 0,
               "data.max_files, data.workers and data.tokenizer_max_bytes must be >= 0")
        _check(self.vocab_size >= 256 + 16,
               f"data.vocab_size={self.vocab_size} is smaller than the 256 byte tokens plus the special tokens; "
               "use at least 512")
        _check(bool(self.text_fields) and all(self.text_fields),
               f"data.text_fields must name at least one field, got {self.text_fields}")
        for p in (self.data_dir, self.tokenizer_dir, *self.src):
            _check(not p or p.startswith("hf:") or glob.has_magic(p) or Path(p).exists(),
                   f"path {p!r} (data.*) does not exist; fix the path or leave it empty")

    @property
    def sources(self) -> tuple[str, ...]:
        return self.src or default_corpus_dirs()


# ----------------------------------------------------------------------------- optim
#: ``optim.name`` values (:class:`OptimConfig`).
OPTIMIZERS = ("adamw", "muon", "adamw8bit")


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer and the learning-rate schedule; warmup then decay to a floor.

    ``name``: ``adamw`` — AdamW on every parameter, decoupled weight decay on matrices only;
    ``adamw8bit`` — the same AdamW with both moments in 8 bits (block-wise quantized, one fp32 scale
    per 256 elements: ~2 bytes a parameter instead of 8; torchao's, on CUDA or CPU; the weights stay
    fp32; :mod:`codechat.train.optim8bit`);
    ``muon`` — Muon (momentum orthogonalised by Newton-Schulz; Jordan et al. 2024,
    https://kellerjordan.github.io/posts/muon/) on the hidden matrices (attention and MLP
    projections), AdamW on the embedding, the LM head and the norms. Muon's step is scaled by
    ``0.2 * sqrt(max(rows, cols))`` to match AdamW's update RMS (Liu et al. 2025, "Muon is Scalable
    for LLM Training", sec. 2.2), so one ``lr`` and ``weight_decay`` serve both. Its Newton-Schulz
    iteration runs in ``muon_ns_dtype``: ``auto`` is bf16 on CUDA (as in torch's own Muon) and fp32
    elsewhere, since a CPU without native bf16 runs bf16 matmuls ~100x slower than fp32.

    The LR at progress ``p`` in [0, 1] after warmup is ``min_lr + (lr - min_lr) * f(p)``,
    with ``f`` cosine (``0.5 * (1 + cos(pi p))``), linear (``1 - p``) or constant (1).

    ``embed_lr_mult`` and ``head_lr_mult`` scale the scheduled LR of the token embedding's and the
    untied LM head's AdamW groups (a tied head follows the embedding). nanochat and modded-nanogpt
    train the embedding with a far larger Adam LR than the hidden matrices (issue 32 measures it on
    ours); 1 and 1 keep the two AdamW groups of checkpoints written before (decay, no decay).
    """

    name: str = "adamw"
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    warmup_steps: int = 100
    schedule: str = "cosine"
    grad_clip: float = 1.0  # 0 -> no clipping
    muon_momentum: float = 0.95
    muon_ns_dtype: str = "auto"  # auto | fp32 | bf16: dtype of Muon's Newton-Schulz iteration
    embed_lr_mult: float = 1.0  # the token embedding's LR = this * the scheduled LR
    head_lr_mult: float = 1.0  # the untied LM head's LR = this * the scheduled LR

    def __post_init__(self) -> None:
        _check(self.name in OPTIMIZERS, f"optim.name must be one of {', '.join(OPTIMIZERS)}, got {self.name!r}")
        _check(0 <= self.muon_momentum < 1, f"optim.muon_momentum must be in [0, 1), got {self.muon_momentum}")
        _check(self.muon_ns_dtype in ("auto", "fp32", "bf16"),
               f"optim.muon_ns_dtype must be auto, fp32 or bf16, got {self.muon_ns_dtype!r}")
        _check(self.lr > 0 and math.isfinite(self.lr), f"optim.lr must be a positive number, got {self.lr}")
        for name in ("embed_lr_mult", "head_lr_mult"):
            v = getattr(self, name)
            _check(v > 0 and math.isfinite(v), f"optim.{name} must be a positive number (1: the scheduled LR), got {v}")
        _check(0.0 <= self.min_lr_ratio <= 1.0, f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _check(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "optim.beta1 and optim.beta2 must be in [0, 1)")
        _check(self.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        _check(self.schedule in ("cosine", "linear", "constant"),
               f"optim.schedule must be cosine, linear or constant, got {self.schedule!r}")
        _check(self.grad_clip >= 0, f"optim.grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip}")


# ----------------------------------------------------------------------------- train
#: ``train.parallel`` values (:mod:`codechat.parallel.wrapper`).
PARALLEL_STRATEGIES = ("ddp", "fsdp", "hsdp")
#: ``train.ddp_bucket_cap_mb``'s default, MiB (torch's own: 25). Under train.compile TorchDynamo's DDPOptimizer
#: cuts the compiled graph at every bucket's boundary: larger buckets, fewer graphs, less overlap of the
#: all-reduce with backward. 1b compiled over one H100 (RESULTS, sixteenth session): 67 buckets at 25 MiB ran
#: at 0.915x the plain path, 16 at 200 MiB at 0.965x, with 4.6 GiB less at its peak.
DDP_BUCKET_CAP_MB = 200.0
#: ``gradient_as_bucket_view`` the DDP wrapper passes (torch's default, False): each gradient is a tensor of its
#: own beside DDP's buckets, a second copy of all gradients, which the planner counts (codechat.train.plan_states).
DDP_GRADIENT_AS_BUCKET_VIEW = False
#: ``train.pp_schedule`` values: ``torch.distributed.pipelining``'s ScheduleGPipe and Schedule1F1B.
PP_SCHEDULES = ("gpipe", "1f1b")
#: ``train.compile_scope`` values. ``model``: one ``torch.compile`` of the whole model (Inductor
#: fuses across blocks and into the loss). ``blocks``: each transformer block compiled on its own,
#: and the final norm, head and loss (``GPT.head``) as one more region (regional compilation: the
#: identical blocks reuse one compiled graph, so the compile costs about one block's and the head's:
#: d12 on this CPU, cold caches, 22 s against 44 s; only the embedding runs eager). With ``--pp`` the
#: blocks are always compiled on their own and the head runs eager (the schedule calls each stage).
COMPILE_SCOPES = ("model", "blocks")
#: ``train.fp8``: the blocks' linear layers in FP8 through torchao.float8 (codechat.train.fp8): none (bf16),
#: tensorwise (one dynamic scale per tensor) or rowwise (one per row of the input, per column of the weight).
FP8_RECIPES = ("none", "tensorwise", "rowwise")


@dataclass(frozen=True)
class TrainConfig:
    """The training loop: batch shape, budget, evaluation, logging and checkpoints.

    One optimizer step sees ``micro_batch_size * grad_accum * dp_size`` rows (``dp_size``: the
    data-parallel ranks, ``world_size / pp``). The run
    stops at ``max_steps`` or after ``time_budget_s`` seconds of training, whichever
    comes first; at least one of them must be set.
    """

    micro_batch_size: int = 8
    grad_accum: int = 1
    batch_size: int = 0  # rows per optimizer step over all ranks; 0 -> micro_batch_size * grad_accum * dp ranks
    max_steps: int = 0  # 0 -> no step limit (time_budget_s or epochs must be set)
    epochs: float = 0.0  # passes over the data, turned into max_steps by the stage; 0 -> not used
    time_budget_s: float = 0.0  # 0 -> no time limit
    eval_every: int = 100
    eval_tokens: int = 65536  # validation tokens per evaluation (capped)
    log_every: int = 10
    save_every: int = 500
    save_every_s: float = 0.0  # also save after this many seconds of training since the last save; 0 -> off
    keep_last: int = 2
    dtype: str = "auto"  # auto -> bf16 autocast on CUDA, fp32 elsewhere
    compile: bool = False
    compile_scope: str = "model"  # what train.compile compiles: COMPILE_SCOPES
    parallel: str = "ddp"  # ddp | fsdp | hsdp: how a torchrun world shares the model (codechat.parallel.wrapper)
    ddp_bucket_cap_mb: float = DDP_BUCKET_CAP_MB  # DDP's gradient bucket size, MiB (see DDP_BUCKET_CAP_MB)
    fsdp_reshard_after_forward: bool = True  # fsdp/hsdp: free each block's gathered weights after its forward and
    # gather them again for its backward (FSDP2's default); False keeps every block's gathered (the compute-dtype
    # weights of the whole model on each GPU, as DDP holds them) and saves the backward's all-gathers
    ac: str = "none"  # activation checkpointing: none | selective (attention + every other matmul kept) | full (every
    # block recomputed from its input in the backward pass); codechat.parallel.wrapper.selective_contexts
    cpu_offload: bool = False  # fsdp/hsdp: the parameter, gradient and optimizer shards live in host memory and AdamW
    # steps on the CPU; each block is copied to the GPU for its forward and backward (FSDP2 CPUOffloadPolicy)
    pp: int = 1  # pipeline stages (--pp); the world's other factor, world_size / pp, is data parallel
    pp_schedule: str = "1f1b"  # gpipe | 1f1b (codechat.parallel.pipeline); only with pp > 1
    pp_microbatches: int = 0  # pipeline micro-batches each micro-batch is cut into; 0 -> pp. Divides micro_batch_size
    fp8: str = "none"  # FP8_RECIPES: the blocks' linears compute in FP8 (torchao, a CUDA GPU of compute capability
    # >= 8.9); weights, optimizer and checkpoints stay as without it; MFU stays relative to the bf16 peak
    fp8_head: bool = False  # with train.fp8: the LM head's matmul in FP8 too (its logits bf16, then fp32 for the
    # loss); an untied head only, one process stage (no --pp)

    def __post_init__(self) -> None:
        _check(self.ac in ("none", "selective", "full"), f"train.ac must be none, selective or full, got {self.ac!r}")
        _check(self.pp >= 1, f"train.pp (--pp) must be >= 1, got {self.pp}")
        _check(self.pp_schedule in PP_SCHEDULES,
               f"train.pp_schedule must be one of {', '.join(PP_SCHEDULES)}, got {self.pp_schedule!r}")
        _check(self.pp_microbatches >= 0, f"train.pp_microbatches must be >= 0 (0: --pp), got {self.pp_microbatches}")
        n_mb = self.pipeline_microbatches
        _check(self.micro_batch_size % n_mb == 0,
               f"train.pp_microbatches={n_mb} does not divide train.micro_batch_size={self.micro_batch_size}: "
               "each micro-batch is cut into that many pipeline micro-batches; make micro_batch_size a multiple of it")
        _check(self.pp_schedule != "1f1b" or n_mb >= self.pp,
               f"train.pp_schedule=1f1b needs train.pp_microbatches >= --pp {self.pp}, got {n_mb}: raise it or use "
               "--train.pp_schedule gpipe")
        _check(self.fp8 in FP8_RECIPES, f"train.fp8 must be one of {', '.join(FP8_RECIPES)}, got {self.fp8!r}")
        _check(self.fp8 == "none" or self.dtype != "fp32",
               f"train.fp8={self.fp8} with train.dtype=fp32: FP8 matmuls run inside bf16 autocast; use --train.dtype "
               "auto or bf16, or --train.fp8 none")
        _check(not self.fp8_head or self.fp8 != "none",
               "train.fp8_head needs train.fp8 tensorwise or rowwise (the head in FP8 beside the blocks); "
               "add --train.fp8 tensorwise or drop --train.fp8_head")
        _check(not self.fp8_head or self.pp == 1,
               "train.fp8_head with --pp: a pipeline's last stage computes the head from its weight, outside the "
               "FP8 layer; drop --train.fp8_head or --pp")
        _check(self.compile_scope in COMPILE_SCOPES,
               f"train.compile_scope must be one of {', '.join(COMPILE_SCOPES)}, got {self.compile_scope!r}")
        _check(self.ddp_bucket_cap_mb > 0, f"train.ddp_bucket_cap_mb must be > 0 (MiB), got {self.ddp_bucket_cap_mb}")
        _check(self.parallel in PARALLEL_STRATEGIES,
               f"train.parallel must be one of {', '.join(PARALLEL_STRATEGIES)}, got {self.parallel!r}")
        _check(not self.cpu_offload or (self.parallel in ("fsdp", "hsdp") and self.pp == 1),
               "train.cpu_offload keeps FSDP's shards in host memory: it needs --parallel fsdp or hsdp, without --pp")
        _check(self.micro_batch_size > 0, f"train.micro_batch_size must be > 0, got {self.micro_batch_size}")
        _check(self.grad_accum > 0, f"train.grad_accum must be > 0, got {self.grad_accum}")
        _check(self.batch_size >= 0, f"train.batch_size must be >= 0, got {self.batch_size}")
        if self.batch_size:
            self.accum_steps(1)
        for name in ("max_steps", "time_budget_s", "epochs"):
            _check(getattr(self, name) >= 0, f"train.{name} must be >= 0, got {getattr(self, name)}")
        _check(self.max_steps > 0 or self.time_budget_s > 0 or self.epochs > 0,
               "none of train.max_steps, train.time_budget_s, train.epochs is set: give --max-steps N, "
               "--train.time_budget_s S or --train.epochs E")
        for name in ("eval_every", "log_every", "save_every", "keep_last"):
            _check(getattr(self, name) > 0, f"train.{name} must be > 0, got {getattr(self, name)}")
        _check(self.eval_tokens > 0, f"train.eval_tokens must be > 0, got {self.eval_tokens}")
        _check(self.save_every_s >= 0, f"train.save_every_s must be >= 0 (0: by steps only), got {self.save_every_s}")
        _check(self.dtype in ("auto", "bf16", "fp32"), f"train.dtype must be auto, bf16 or fp32, got {self.dtype!r}")

    @property
    def pipeline_microbatches(self) -> int:
        """Pipeline micro-batches per micro-batch (``pp_microbatches``, or ``pp`` when 0)."""
        return self.pp_microbatches or self.pp

    def with_epochs(self, steps_per_epoch: float) -> "TrainConfig":
        """This config with ``max_steps`` set from ``epochs`` when only epochs were given."""
        if self.max_steps or not self.epochs:
            return self
        return replace(self, max_steps=max(1, math.ceil(self.epochs * steps_per_epoch)))

    def accum_steps(self, world_size: int) -> int:
        """Micro-batches per optimizer step on each of ``world_size`` ranks.

        Raises:
            ConfigError: ``batch_size`` is not a multiple of ``micro_batch_size * world_size``.
        """
        if not self.batch_size:
            return self.grad_accum
        per_pass = self.micro_batch_size * world_size
        _check(self.batch_size % per_pass == 0,
               f"train.batch_size={self.batch_size} does not divide into micro-batches of "
               f"train.micro_batch_size={self.micro_batch_size} x {world_size} rank(s); make it a multiple of "
               f"{per_pass}")
        _check(self.grad_accum in (1, self.batch_size // per_pass),
               f"train.grad_accum={self.grad_accum} contradicts train.batch_size={self.batch_size}; set only one")
        return self.batch_size // per_pass


# ----------------------------------------------------------------------------- run
@dataclass(frozen=True)
class RunConfig:
    """Where a stage writes, how it is seeded, and on which device it runs."""

    out: str = "runs/default/pretrain"
    seed: int = 1337
    device: str = "auto"
    resume: bool = False

    def __post_init__(self) -> None:
        _check(self.device in ("auto", "cpu", "cuda", "mps") or self.device.startswith("cuda:"),
               f"run.device must be auto, cpu, cuda or mps, got {self.device!r}")
        _check(bool(self.out), "run.out is empty: give --out DIR")


@dataclass(frozen=True)
class PretrainConfig:
    """Everything a pretraining run needs; saved to ``DIR/config.yaml`` to reproduce it.

    ``init`` (optional) continues pretraining a checkpoint (or ``hf:PATH``, :mod:`codechat.hf`): its
    weights, model shape and tokenizer replace the preset's, and the corpus is tokenised with it.
    ``peft`` ``lora`` (with ``init`` only) trains LoRA adapters on it instead (:mod:`codechat.config.lora`).
    """

    init: str = ""
    model: ModelConfig = field(default_factory=lambda: preset("d12"))
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(max_steps=1000))
    run: RunConfig = field(default_factory=RunConfig)
    peft: str = "none"  # PEFT_METHODS: none (every weight trained) | lora (adapters on the frozen --init)
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        check_peft(self.peft, self.optim, self.train, self.init)
        _check(self.train.pp <= self.model.n_layer,
               f"--pp {self.train.pp} stages for a model of {self.model.n_layer} layers: every stage needs at least "
               f"one block; use --pp <= {self.model.n_layer}")
        check_pipeline_options(self.model, self.train.pp)
        _check(self.data.seq_len <= self.model.max_seq_len,
               f"data.seq_len={self.data.seq_len} is over the model's limit model.max_seq_len="
               f"{self.model.max_seq_len}; lower --data.seq_len or raise --model.max_seq_len")


#: Per-preset defaults of the other sections, applied under a YAML file and CLI overrides.
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {"data": dict(vocab_size=4096, seq_len=512, tokenizer_max_bytes=8_000_000),
             "optim": dict(name="muon", lr=1e-2, warmup_steps=50, min_lr_ratio=0.05),
             "train": dict(micro_batch_size=4, eval_every=250, eval_tokens=32768, save_every=1000)},
    "d12": {"data": dict(seq_len=1024), "optim": dict(lr=1e-3, warmup_steps=200),
            "train": dict(micro_batch_size=32, eval_every=250, compile=True)},
    "d20": {"data": dict(seq_len=2048), "optim": dict(lr=6e-4, warmup_steps=300),
            "train": dict(micro_batch_size=16, eval_every=250, compile=True)},
    "1b": {"data": dict(seq_len=2048), "optim": dict(lr=3e-4, warmup_steps=500),
           "train": dict(micro_batch_size=8, eval_every=500, compile=True)},
    "2b": {"data": dict(seq_len=2048), "optim": dict(lr=3e-4, warmup_steps=500),
           "train": dict(micro_batch_size=4, eval_every=500, compile=True)},
    "8b": {"data": dict(seq_len=2048), "optim": dict(lr=1.5e-4, warmup_steps=1000),
           "train": dict(micro_batch_size=2, eval_every=500, compile=True)},
}


def pretrain_recipe(name: str) -> "PretrainConfig":
    """The default :class:`PretrainConfig` of preset ``name`` (model shape plus its recipe)."""
    model = preset(name)
    r = RECIPES[name]
    return PretrainConfig(model=model, data=DataConfig(**r["data"]), optim=OptimConfig(**r["optim"]),
                          train=TrainConfig(max_steps=1000, **r["train"]))


def check_init(init: str, what: str) -> None:
    """Raises ConfigError unless ``init`` (a stage's ``--init``, ``what`` it should be) exists, or is
    ``hf:PATH`` with ``PATH`` a local directory or a Hub repo id ``ORG/NAME`` (:mod:`codechat.hf`)."""
    _check(bool(init), f"no --init given: name {what} directory or checkpoint to start from")
    if init.startswith("hf:"):
        name = init[3:]
        _check(Path(name).is_dir() or re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None,
               f"--init {init}: {name!r} is not a directory, nor a Hugging Face Hub repo id ORG/NAME")
        return
    _check(Path(init).exists(), f"--init {init}: no such run directory or checkpoint")


__all__ = ["ConfigError", "MLP_ACTS", "ModelConfig", "DataConfig", "OptimConfig", "TrainConfig", "RunConfig",
           "PretrainConfig", "PRESETS", "RECIPES", "preset", "pretrain_recipe", "load", "build", "to_dict", "save_yaml", "parse_overrides",
           "replace", "default_corpus_dirs", "check_init"]
