"""The model's shape: :class:`ModelConfig`, its named presets, and what a pipeline cannot carry.

Every field is checked in ``__post_init__`` and a bad one raises :class:`ConfigError` naming the
setting and what to change (:mod:`codechat.config.stages` holds the other sections and re-exports these).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from codechat.config.yaml_io import _check


#: ``model.mlp_act`` values: the MLP's nonlinearity (:class:`ModelConfig`).
MLP_ACTS = ("swiglu", "relu2")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the decoder-only GPT (Llama/Qwen3-compatible weights).

    ``n_kv_head`` < ``n_head`` gives grouped-query attention; ``head_dim`` defaults to
    ``n_embd // n_head``; ``intermediate_size`` is the MLP's hidden width.

    Architecture options from the NanoGPT speedrun (modded-nanogpt), each off by default so that a
    checkpoint written before they existed loads and computes as it did (issue 32):

    - ``mlp_act``: ``swiglu`` (Llama's ``down(silu(gate(x)) * up(x))``) or ``relu2``
      (``down(relu(up(x))^2)``, no gate; So et al. 2021, "Primer"). ``intermediate_size`` then
      defaults to ``4 * n_embd``: two matrices of 4 C^2 hold what SwiGLU's three of 8/3 C^2 hold.
      transformers' Llama / Qwen3 cannot express it: the HF export refuses it.
    - ``zero_init_proj``: the residual output projections (``o_proj``, ``down_proj``) start at zero,
      so every block starts as the identity. Initialisation only: the export is unchanged.
    - ``logit_softcap``: when > 0 the logits are ``cap * tanh(logits / cap)`` (Gemma 2), bounding
      them in (-cap, cap); 0 is off. Llama / Qwen3 have no such field: the HF export refuses it.
    - ``x0_mix``: before block i the residual stream is ``a_i * x + b_i * x0``, ``x0`` the embedding
      output, with learned scalars ``a`` (init 1) and ``b`` (init 0): every block can read the
      token embedding directly, and at init the model computes what it would without the option.
    - ``unet_skips``: U-net skips (Ronneberger et al. 2015) between blocks: with L = ``n_layer``, the
      output of block j < L // 2 is added, times a learned scalar ``w_j`` (init 1), to the input of
      block L - 1 - j. With ``x0_mix`` too, the mixing comes first, then the skip.
      Both are new parameters outside Llama / Qwen3: the HF export refuses them; a pipeline
      (``train.pp`` > 1) cannot carry them across its stages and refuses them too.
    """

    vocab_size: int = 32768
    n_layer: int = 12
    n_embd: int = 768
    n_head: int = 6
    n_kv_head: int = 6
    head_dim: int = 0  # 0 -> n_embd // n_head
    intermediate_size: int = 0  # 0 -> 8/3 * n_embd rounded up to a multiple of 64
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    qk_norm: bool = True
    tie_embeddings: bool = False
    init_std: float = 0.02
    mlp_act: str = "swiglu"  # swiglu | relu2 (MLP_ACTS)
    zero_init_proj: bool = False  # o_proj and down_proj initialised to zero
    logit_softcap: float = 0.0  # > 0: logits = cap * tanh(logits / cap); 0 -> off
    x0_mix: bool = False  # block i's input a_i * x + b_i * x0 (x0: the embedding output)
    unet_skips: bool = False  # block L-1-j's input + w_j * block j's output, j < L // 2

    #: Fields derived from others when 0 (see :func:`load`: setting an input re-derives them).
    DERIVED: ClassVar[dict[str, tuple[str, ...]]] = {"head_dim": ("n_embd", "n_head"),
                                                     "intermediate_size": ("n_embd", "mlp_act")}

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_embd", "n_head", "n_kv_head", "max_seq_len"):
            _check(getattr(self, name) > 0, f"model.{name} must be > 0, got {getattr(self, name)}")
        _check(self.n_head % self.n_kv_head == 0,
               f"model.n_head ({self.n_head}) must be a multiple of model.n_kv_head ({self.n_kv_head}); "
               "pick n_kv_head among the divisors of n_head")
        if self.head_dim == 0:
            _check(self.n_embd % self.n_head == 0,
                   f"model.n_embd ({self.n_embd}) is not divisible by model.n_head ({self.n_head}); "
                   "change one of them or set model.head_dim explicitly")
            object.__setattr__(self, "head_dim", self.n_embd // self.n_head)
        _check(self.head_dim % 2 == 0, f"model.head_dim must be even for rotary embeddings, got {self.head_dim}")
        _check(self.mlp_act in MLP_ACTS, f"model.mlp_act must be one of {', '.join(MLP_ACTS)}, got {self.mlp_act!r}")
        if self.intermediate_size == 0:
            object.__setattr__(self, "intermediate_size", 4 * self.n_embd if self.mlp_act == "relu2"
                               else 64 * math.ceil(8 * self.n_embd / 3 / 64))
        _check(not self.unet_skips or self.n_layer >= 2,
               f"model.unet_skips joins block j to block n_layer - 1 - j for j < n_layer // 2: it needs "
               f"model.n_layer >= 2, got {self.n_layer}")
        _check(self.logit_softcap >= 0 and math.isfinite(self.logit_softcap),
               f"model.logit_softcap must be >= 0 (0: off), got {self.logit_softcap}")
        _check(self.init_std > 0 and self.norm_eps > 0 and self.rope_theta > 0,
               "model.init_std, model.norm_eps and model.rope_theta must be > 0")


def check_pipeline_options(cfg: ModelConfig, pp: int) -> None:
    """Raises :class:`ConfigError` when ``pp`` > 1 pipeline stages would have to carry ``model.x0_mix``'s
    embedding or ``model.unet_skips``' block outputs from one stage to another (they do not)."""
    on = [f"model.{k}" for k in ("x0_mix", "unet_skips") if getattr(cfg, k)]
    _check(pp == 1 or not on, f"--pp {pp} with {' and '.join(on)}: a pipeline stage sends the next only its "
                              "hidden states, not the embedding or earlier blocks' outputs these read; "
                              "use --pp 1 (data parallelism or FSDP) or turn them off")


#: Presets. ``tiny`` trains on a 2-core CPU in minutes: at a fixed 9 CPU minutes a narrow model
#: that sees more tokens compresses better (validation bits/byte after the speedrun's budget with
#: AdamW: width 256 ~1.70, 192 ~1.62, 128 ~1.37-1.46, 96 ~1.30-1.52; with its recipe's Muon and
#: 512-token windows, on the same data at 2,121 steps: 2 heads of 48 1.21-1.25, 4 heads of 24
#: 1.26-1.32; with lr 1e-2 at 2,384 steps 1.19-1.20; see benchmarks/RESULTS.md).
#: ``8b`` has the seed system's shape (40 layers, width 4096, 32 heads). ``vocab_size`` is set
#: from the tokenizer at build time.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(n_layer=4, n_embd=96, n_head=2, n_kv_head=2, max_seq_len=512, tie_embeddings=True),
    "d12": dict(n_layer=12, n_embd=768, n_head=6, n_kv_head=6, max_seq_len=2048),
    "d20": dict(n_layer=20, n_embd=1280, n_head=10, n_kv_head=10, max_seq_len=2048),
    "1b": dict(n_layer=16, n_embd=2048, n_head=16, n_kv_head=8, max_seq_len=4096),
    "2b": dict(n_layer=24, n_embd=2304, n_head=18, n_kv_head=6, max_seq_len=4096),
    "8b": dict(n_layer=40, n_embd=4096, n_head=32, n_kv_head=8, intermediate_size=14336, max_seq_len=4096),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The :class:`ModelConfig` of a named preset, with field overrides applied.

    Raises:
        ConfigError: unknown preset name.
    """
    _check(name in PRESETS, f"unknown --preset {name!r}; choose one of {', '.join(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})
