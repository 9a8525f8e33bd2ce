"""The codechat GPT: a decoder-only transformer whose weights map one-to-one onto Llama / Qwen3.

Architecture (each choice matches the Llama / Qwen3 family, so ``hf.py`` is a renaming):
- token embedding, no absolute positions; rotary position embeddings (RoPE, Su et al. 2021)
  with the "rotate half" layout of Hugging Face Llama;
- pre-norm blocks with RMSNorm (Zhang & Sennrich 2019), no biases anywhere;
- grouped-query attention (Ainslie et al. 2023) through ``F.scaled_dot_product_attention``,
  with optional QK-norm (an RMSNorm over each head's query and key, as in Qwen3);
- SwiGLU MLP (Shazeer 2020): ``down(silu(gate(x)) * up(x))``;
- final RMSNorm and an LM head, tied to the embedding or not.

Options from the NanoGPT speedrun, each a :class:`ModelConfig` field and off by default (a
checkpoint written before them computes what it did): ``mlp_act="relu2"`` (``down(relu(up(x))^2)``,
no gate), ``zero_init_proj`` (``o_proj`` and ``down_proj`` start at zero), ``logit_softcap``
(``cap * tanh(logits / cap)``), ``x0_mix`` (block i's input ``a_i * x + b_i * x0``, ``x0`` the embedding
output) and ``unet_skips`` (block L-1-j's input plus ``w_j`` times block j's output, j < L // 2; both
applied by :meth:`GPT.skip_in`). All but ``zero_init_proj`` are not Llama / Qwen3: ``codechat.hf``
refuses to export them.

The model is built on the meta device and initialised explicitly by :meth:`GPT.init_weights`,
so that a parallel wrapper can shard it before any memory is allocated. It knows nothing of
parallelism. ``forward(idx)`` gives logits; ``forward(idx, labels)`` the cross-entropy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from codechat.config.stages import ModelConfig

IGNORE_INDEX = -100  # label value that is not trained on


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale: ``x / rms(x) * weight``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # weight in the input's dtype: a mixed pair falls off the fused kernel under autocast
        return F.rms_norm(x, (x.size(-1),), self.weight.to(x.dtype), self.eps)


def rope_tables(head_dim: int, max_len: int, theta: float, device: torch.device | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (max_len, head_dim), float32, in the rotate-half layout."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32, device=device), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def logits_fp32(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(..., V) float32 logits ``h @ weight.T`` of hidden states ``h`` (..., C) and an LM head
    ``weight`` (V, C).

    bf16 or fp16 operands on CUDA, with no gradient to track, go through cuBLAS with an fp32
    output (``torch.mm(..., out_dtype=torch.float32)``: the fp32 accumulator is stored as it is),
    so greedy decoding and sampling never see logits rounded to bf16 — there, scores closer than
    1/16 of a nat at magnitude ~10 become exact ties broken by token index. Everything else
    (training, autocast, CPU) is ``F.linear(h, weight).float()``.
    """
    if (h.is_cuda and h.dtype == weight.dtype and h.dtype in (torch.bfloat16, torch.float16)
            and not (torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad))):
        flat = torch.mm(h.reshape(-1, h.size(-1)), weight.t(), out_dtype=torch.float32)
        return flat.view(*h.shape[:-1], weight.size(0))
    return F.linear(h, weight).float()


def soft_cap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap * tanh(logits / cap)`` (Gemma 2's final-logit soft-capping): smooth, monotonic, bounded
    in (-cap, cap); ``logits`` unchanged when ``cap`` is 0 (``model.logit_softcap`` off)."""
    return cap * torch.tanh(logits / cap) if cap else logits


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (B, H, T, D) by position tables ``cos``/``sin`` (T, D) or (B, 1, T, D)."""
    half = x.size(-1) // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


@dataclass
class KVCache:
    """Pre-allocated keys and values for incremental decoding.

    ``k[layer]``/``v[layer]`` have shape (B, n_kv_head, max_len, head_dim); ``pos`` is the
    number of positions already filled (the same for every row of the batch).
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    pos: int = 0

    @classmethod
    def empty(cls, cfg: ModelConfig, batch_size: int, max_len: int, device: torch.device,
              dtype: torch.dtype) -> "KVCache":
        shape = (batch_size, cfg.n_kv_head, max_len, cfg.head_dim)
        return cls([torch.empty(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)],
                   [torch.empty(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)])

    @property
    def max_len(self) -> int:
        return self.k[0].size(2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_head * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.n_embd, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: KVCache | None, layer: int, mask: torch.Tensor | BlockMask | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if isinstance(mask, BlockMask):  # packed rows on CUDA: flex attention skips cross-document blocks
            y = compiled_flex_attention(q, k, v, block_mask=mask, enable_gqa=True)
        elif mask is not None:  # packed rows: causal within each document only
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        elif cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            p = cache.pos
            cache.k[layer][:, :, p:p + T] = k
            cache.v[layer][:, :, p:p + T] = v
            k, v = cache.k[layer][:, :, :p + T], cache.v[layer][:, :, :p + T]
            if T == 1:  # one new query sees every cached position
                y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            else:  # new queries see the past and the causal part of themselves
                mask = torch.ones(T, p + T, dtype=torch.bool, device=x.device).tril(diagonal=p)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))


class MLP(nn.Module):
    """SwiGLU ``down(silu(gate(x)) * up(x))``, or with ``mlp_act="relu2"`` ``down(relu(up(x))^2)``
    (no ``gate_proj``; Primer, So et al. 2021)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        gated = cfg.mlp_act == "swiglu"
        self.gate_proj = nn.Linear(cfg.n_embd, cfg.intermediate_size, bias=False) if gated else None
        self.up_proj = nn.Linear(cfg.n_embd, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_proj is None:
            return self.down_proj(F.relu(self.up_proj(x)).square())
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: KVCache | None, layer: int, mask: torch.Tensor | BlockMask | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


#: Initial values of the scalar parameters of ``model.x0_mix`` (``x_scale``, ``x0_scale``) and
#: ``model.unet_skips`` (``unet_scale``): each block starts reading the previous output alone.
SCALAR_INIT = {"x_scale": 1.0, "x0_scale": 0.0, "unet_scale": 1.0}


class GPT(nn.Module):
    """Decoder-only transformer. Parameter names follow Hugging Face Llama without ``model.``.

    With ``model.x0_mix`` it also has ``x_scale`` and ``x0_scale``, (n_layer,) float32, and with
    ``model.unet_skips`` ``unet_scale``, (n_layer // 2,) float32 (:meth:`skip_in`); without them its
    parameters are a Llama's.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        # True once codechat.train.fp8 made the head torchao's Float8Linear (train.fp8_head): head() then
        # calls it as a module, where it otherwise multiplies by its weight (logits_fp32)
        self.fp8_head = False
        self.x_scale = nn.Parameter(torch.empty(cfg.n_layer)) if cfg.x0_mix else None
        self.x0_scale = nn.Parameter(torch.empty(cfg.n_layer)) if cfg.x0_mix else None
        self.unet_scale = nn.Parameter(torch.empty(cfg.n_layer // 2)) if cfg.unet_skips else None
        self.tie_weights()
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def tie_weights(self) -> None:
        """Share the LM head with the embedding when ``tie_embeddings`` (again after ``to_empty``)."""
        if self.cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every parameter and buffer in place (after ``to_empty`` from meta).

        Linear and embedding weights ~ N(0, init_std); the residual output projections
        (``o_proj``, ``down_proj``) are scaled by 1/sqrt(2 n_layer) (GPT-2, Radford et al. 2019),
        or are zero with ``zero_init_proj`` (modded-nanogpt: each block starts as the identity);
        norm scales are 1; the scalars of ``x0_mix`` and ``unet_skips`` are :data:`SCALAR_INIT`
        (drawing nothing: the other weights are the same with those options on or off).
        """
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if name in SCALAR_INIT:
                p.fill_(SCALAR_INIT[name])
            elif name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                p.normal_(0.0, std / math.sqrt(2 * self.cfg.n_layer))  # drawn either way: the other
                if self.cfg.zero_init_proj:  # weights get the same values with the option on or off
                    p.zero_()
            else:
                p.normal_(0.0, std)
        cos, sin = rope_tables(self.cfg.head_dim, self.cfg.max_seq_len, self.cfg.rope_theta, self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def forward(self, idx: torch.Tensor, labels: torch.Tensor | None = None, *, reduction: str = "sum",
                cache: KVCache | None = None, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits, or the cross-entropy against ``labels``.

        Args:
            idx: (B, T) int64 token ids.
            labels: (B, T) int64 next-token targets, ``IGNORE_INDEX`` (-100) where not trained.
            reduction: ``"sum"`` (a scalar: summed loss in nats over supervised tokens) or
                ``"none"`` ((B, T) float32, 0 at ignored positions).
            cache: a :class:`KVCache`; the new positions are appended at ``cache.pos``, which
                the caller advances.
            doc_ids: (B, T) int64 document index of each position of a packed row. Attention
                then stays inside each document and rotary positions restart at 0 in each, so a
                packed row computes exactly what its documents would on their own rows.

        Returns:
            (B, T, vocab_size) float32 logits (soft-capped when ``logit_softcap``) when ``labels``
            is None, else the loss.

        Raises:
            ValueError: the sequence does not fit in ``max_seq_len`` or in the cache.
        """
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        if start + T > self.cfg.max_seq_len or (cache is not None and start + T > cache.max_len):
            raise ValueError(f"sequence of {start + T} positions is over the limit "
                             f"(model.max_seq_len={self.cfg.max_seq_len}"
                             + (f", cache {cache.max_len}" if cache is not None else "") + ")")
        mask = None
        if doc_ids is None:
            cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]
        else:
            pos = positions_in_documents(doc_ids)
            cos, sin = self.rope_cos[pos].unsqueeze(1), self.rope_sin[pos].unsqueeze(1)  # (B, 1, T, D)
            mask = document_mask(doc_ids)
        x = x0 = self.embed_tokens(idx)
        kept: list[torch.Tensor] = []  # unet_skips: the outputs of the first n_layer // 2 blocks
        skips = self.x_scale is not None or self.unet_scale is not None
        for i, block in enumerate(self.layers):
            if skips:
                x = self.skip_in(i, x, x0, kept)
            x = block(x, cos, sin, cache, i, mask)
            if self.unet_scale is not None and i < self.cfg.n_layer // 2:
                kept.append(x)
        return self.head(x, labels, reduction)

    def skip_in(self, i: int, x: torch.Tensor, x0: torch.Tensor, kept: list[torch.Tensor]) -> torch.Tensor:
        """Block ``i``'s input from the previous block's output ``x`` (B, T, C), the embedding output
        ``x0`` (B, T, C) and the kept outputs ``kept[j]`` of blocks j < n_layer // 2, in ``x``'s dtype.

        ``x0_mix`` first: ``x_scale[i] * x + x0_scale[i] * x0`` (modded-nanogpt, Keller Jordan et al.,
        MIT: the embedding reaches every block; the idea only). Then ``unet_skips``: block
        ``i = n_layer - 1 - j`` adds ``unet_scale[j] * kept[j]`` (U-Net, Ronneberger et al. 2015, as
        modded-nanogpt uses it); with an even ``n_layer`` the first such block, ``n_layer // 2``, adds
        the output of the block just before it (its ``x`` before the mixing).
        """
        if self.x_scale is not None:
            x = self.x_scale[i] * x + self.x0_scale[i] * x0
        j = self.cfg.n_layer - 1 - i
        if self.unet_scale is not None and j < self.cfg.n_layer // 2:
            x = x + self.unet_scale[j] * kept[j]
        return x

    def head(self, x: torch.Tensor, labels: torch.Tensor | None, reduction: str = "sum") -> torch.Tensor:
        """The final norm, the LM head and, with ``labels``, the cross-entropy: :meth:`forward`
        from the last block's output ``x`` (B, T, n_embd) on. A method of its own so that regional
        compilation (``train.compile_scope`` ``blocks``) compiles it beside the blocks: Inductor
        then fuses the fp32 upcast into the loss, as when the whole model is compiled."""
        B, T = x.shape[:2]
        h = self.norm(x)
        logits = self.lm_head(h).float() if self.fp8_head else logits_fp32(h, self.lm_head.weight)
        logits = soft_cap(logits, self.cfg.logit_softcap)
        if labels is None:
            return logits
        loss = F.cross_entropy(logits.view(B * T, -1), labels.reshape(B * T),
                               ignore_index=IGNORE_INDEX, reduction=reduction)
        return loss.view(B, T) if reduction == "none" else loss

    def num_params(self, exclude_embedding: bool = False) -> int:
        """Number of parameters (tied weights counted once); optionally without the embedding."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.embed_tokens.weight.numel() if exclude_embedding else n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward): 6 N + 12 L H D T.

        N counts the non-embedding parameters (the LM head included), and the second term is
        the attention score and value matmuls at context length T (Kaplan et al. 2020, §2.1;
        PaLM, Chowdhery et al. 2022, App. B).
        """
        c = self.cfg
        t = seq_len or c.max_seq_len
        n = self.num_params() - c.vocab_size * c.n_embd * (0 if c.tie_embeddings else 1)
        return 6 * n + 12 * c.n_layer * c.n_head * c.head_dim * t


#: flex attention is only fast compiled; inside an already compiled model this is inlined.
compiled_flex_attention = torch.compile(flex_attention, dynamic=False)


@torch.compiler.disable
def document_mask(doc_ids: torch.Tensor) -> torch.Tensor | BlockMask:
    """Causal attention restricted to each document of packed rows ``doc_ids`` (B, T).

    On CUDA a flex-attention ``BlockMask`` (fully masked 128x128 blocks are skipped, so packing
    costs about what plain causal attention costs); elsewhere a dense (B, 1, T, T) bool mask.
    """
    B, T = doc_ids.shape
    if doc_ids.device.type == "cuda":
        return document_block_mask(doc_ids)
    same = doc_ids.unsqueeze(2) == doc_ids.unsqueeze(1)  # (B, T, T)
    return (same & torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()).unsqueeze(1)


def document_block_mask(doc_ids: torch.Tensor, block: int = 128) -> BlockMask:
    """The flex-attention ``BlockMask`` of :func:`document_mask` for (B, T) int64 ``doc_ids``, built from each
    ``block`` x ``block`` tile's range of document ids with a few tensor ops.

    A tile (query block i, key block j <= i) is skipped when its two id ranges do not meet, *full* (no mask
    evaluated) when both blocks lie in one document and j < i, and *partial* (the mask evaluated per element)
    otherwise: a superset of the tiles with an unmasked pair, so it is exact for any ids, contiguous or not.
    ``create_block_mask`` gives the same tiles by evaluating the mask on all B x T x T pairs, in eager ops on every
    packed SFT step (on a CPU, 8 rows of 1,024: 46 ms against 1.1 ms here; ``benchmarks/RESULTS.md``); it is
    still what builds the mask when T is not a multiple of ``block``.
    """
    def same_document_causal(b, h, q, kv):
        return (doc_ids[b, q] == doc_ids[b, kv]) & (q >= kv)

    B, T = doc_ids.shape
    if T % block:
        return create_block_mask(same_document_causal, B, None, T, T, device=doc_ids.device)
    tiles = doc_ids.view(B, T // block, block)
    lo, hi = tiles.amin(-1), tiles.amax(-1)  # (B, n)
    q_lo, q_hi, k_lo, k_hi = lo[:, :, None], hi[:, :, None], lo[:, None, :], hi[:, None, :]  # query i, key j
    causal = torch.ones(T // block, T // block, dtype=torch.bool, device=doc_ids.device).tril()
    meet = (q_lo <= k_hi) & (k_lo <= q_hi) & causal
    full = meet & (q_lo == q_hi) & (k_lo == k_hi) & (q_lo == k_lo) & causal.tril(-1)

    def ordered(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(count (B, 1, n), indices (B, 1, n, n)) int32 of the True tiles of each query block, those first,
        ascending."""
        idx = torch.argsort((~m).to(torch.uint8), dim=-1, stable=True)
        return m.sum(-1, dtype=torch.int32)[:, None], idx.to(torch.int32)[:, None]

    return BlockMask.from_kv_blocks(*ordered(meet & ~full), *ordered(full), BLOCK_SIZE=block,
                                    mask_mod=same_document_causal)


def positions_in_documents(doc_ids: torch.Tensor) -> torch.Tensor:
    """Position of each token inside its document: (B, T) int64 from (B, T) document ids.

    Documents are contiguous runs of equal ids, e.g. ``[0, 0, 0, 1, 1]`` -> ``[0, 1, 2, 0, 1]``.
    """
    T = doc_ids.size(1)
    idx = torch.arange(T, device=doc_ids.device).expand_as(doc_ids)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - first


def build_model(cfg: ModelConfig, device: torch.device | str = "cpu") -> GPT:
    """Build the model on the meta device, materialise it on ``device`` and initialise it."""
    with torch.device("meta"):
        model = GPT(cfg)
    model.to_empty(device=device)
    model.tie_weights()  # to_empty gives each use of a shared parameter its own tensor
    model.init_weights()
    return model
