"""The memory planner's model states: which weights train, what the optimizer keeps for each, DDP's buckets.

:mod:`codechat.train.plan` sums these per pipeline stage; here is what one stage's weights are made of.

- **Parameter counts** (:func:`param_counts`) of a :class:`ModelConfig` from its shapes.
- **Weight tensors** (:func:`stage_tensors`): the embedding (first stage), each block's matrices and
  norm weights, the final norm, the untied LM head and the model's mixing scalars (last stage), as
  (elements, count, hidden matrix or not) rows.
- **LoRA** (``--peft lora``; Hu et al. 2021, arXiv:2106.09685; :func:`lora_tensors`): each targeted
  projection ``W`` (out, in) of every block gets ``A`` (rank, in) and ``B`` (out, rank):
  ``rank * (in + out)`` trainable parameters, stored, differentiated and optimized (AdamW) at the
  plan's ``param_bytes`` / ``grad_bytes`` (fp32). The base is frozen: no gradients, no optimizer
  state, no master copy; the blocks' projections are stored in the compute dtype (bf16 on CUDA), the
  embedding, head and norms as before (:mod:`codechat.peft.lora`: the residual stream stays fp32).
- **Optimizer state** (:func:`optimizer_bytes`) of the trainable tensors: AdamW's m and v,
  ``2 state_bytes`` a parameter; Muon's one momentum buffer per hidden matrix and AdamW's for the
  rest; ``adamw8bit`` (:mod:`codechat.train.optim8bit`): ``2 * (n + 4 n / 256 + 1024)`` bytes for a
  tensor of ``n >= 4096`` elements, ``n`` a multiple of 256 (one-byte codes, an fp32 scale per block
  of 256, a 256-entry fp32 table per moment: 2.03 bytes a parameter), AdamW's fp32 m and v for
  smaller tensors.
- **DDP's buckets** (:func:`ddp_bucket_bytes`): ``torch.nn.parallel.DistributedDataParallel``'s
  reducer allocates, when the module is wrapped, flat buckets (each at most ``train.ddp_bucket_cap_mb``,
  200 MiB by default; the first 1 MiB) that together hold one element per trainable parameter in
  its gradient dtype, and keeps them for the whole run. With ``gradient_as_bucket_view=False`` (torch's default,
  :data:`codechat.config.stages.DDP_GRADIENT_AS_BUCKET_VIEW`) each ``.grad`` is a tensor of its own
  that the reducer copies into its bucket and back, so the buckets are a second copy of all
  gradients (torch's DDP docstring: a view "can reduce peak memory usage, where the saved memory
  size will be equal to the total gradients size"); with views, nothing beyond the gradients.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from codechat.config.stages import DDP_GRADIENT_AS_BUCKET_VIEW, ConfigError, ModelConfig
from codechat.train.optim8bit import state_bytes as adamw8bit_state_bytes


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a :class:`ModelConfig`; ``total`` equals ``GPT(cfg).num_params()``."""

    n_layer: int
    embedding: int  # vocab_size * n_embd
    block: int  # one transformer block: 2 norms, q/k/v/o, optional QK-norm, SwiGLU
    head: int  # final norm + LM head (the LM head is the embedding when tied) + x0_mix's and unet_skips' scalars
    block_matrices: tuple[tuple[int, int], ...]  # shapes of one block's 2-D weights (Muon's hidden matrices)
    head_matrix: int  # elements of the LM head's matrix (cast by autocast even when tied)
    block_matrix_names: tuple[str, ...] = ()  # --lora.targets names of block_matrices (q, k, v, o, [gate,] up, down)
    block_vectors: tuple[int, ...] = ()  # elements of each of one block's norm weights
    final_norm: int = 0  # elements of the final norm's weight
    lm_head: int = 0  # elements of the untied LM head (0 when tied)
    scalars: int = 0  # x0_mix's and unet_skips' scalars

    @property
    def total(self) -> int:
        return self.embedding + self.n_layer * self.block + self.head


def param_counts(cfg: ModelConfig) -> ParamCounts:
    """Parameter counts of ``cfg`` from its shapes (see :class:`codechat.model.GPT`)."""
    h, q, kv, i = cfg.n_embd, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim, cfg.intermediate_size
    relu2 = cfg.mlp_act == "relu2"  # ReLU² has no gate
    mlp = ((i, h), (h, i)) if relu2 else ((i, h), (i, h), (h, i))
    names = ("q", "k", "v", "o") + (("up", "down") if relu2 else ("gate", "up", "down"))
    matrices = ((q, h), (kv, h), (kv, h), (h, q)) + mlp
    vectors = (h, h) + ((cfg.head_dim, cfg.head_dim) if cfg.qk_norm else ())
    block = sum(vectors) + sum(r * c for r, c in matrices)
    lm_head = 0 if cfg.tie_embeddings else cfg.vocab_size * h
    scalars = 2 * cfg.n_layer * cfg.x0_mix + cfg.n_layer // 2 * cfg.unet_skips  # the model's own, beside the head's
    return ParamCounts(cfg.n_layer, cfg.vocab_size * h, block, h + lm_head + scalars, matrices, cfg.vocab_size * h,
                       names, vectors, h, lm_head, scalars)


class Tensors(NamedTuple):
    """``count`` weight tensors of ``numel`` elements each; ``hidden``: a block's matrix (Muon's)."""

    numel: int
    count: int
    hidden: bool = False


def elements(tensors: list[Tensors]) -> int:
    """Parameters of ``tensors``."""
    return sum(t.numel * t.count for t in tensors)


def stage_tensors(counts: ParamCounts, layers: int, first: bool, last: bool, tied_copy: bool) -> list[Tensors]:
    """The weight tensors of a stage of ``layers`` blocks of a model of :class:`codechat.train.plan.ParamCounts`
    ``counts``: the embedding when ``first``; the final norm, the untied LM head (or, ``tied_copy``,
    the stage's copy of the tied one) and the scalars when ``last``."""
    out = [Tensors(r * c, layers, True) for r, c in counts.block_matrices]
    out += [Tensors(n, layers) for n in counts.block_vectors]
    if first:
        out.append(Tensors(counts.embedding, 1))
    if last:
        head = counts.head_matrix if tied_copy else counts.lm_head
        out += [Tensors(counts.final_norm, 1), Tensors(head, 1), Tensors(counts.scalars, 1)]
    return [t for t in out if t.numel]


def lora_tensors(counts: ParamCounts, layers: int, rank: int, targets: tuple[str, ...]) -> list[Tensors]:
    """LoRA's ``A`` (rank, in) and ``B`` (out, rank) of each targeted projection of ``layers`` blocks.

    Raises:
        ConfigError: a target this model's blocks do not have (``gate`` with a ReLU² MLP), or a rank
            over a targeted projection's smaller dimension.
    """
    shapes = dict(zip(counts.block_matrix_names, counts.block_matrices))
    out = []
    for name in targets:
        if name not in shapes:
            raise ConfigError(f"lora.targets: {name!r} matches no layer of this model (its blocks have "
                              f"{','.join(counts.block_matrix_names)})")
        rows, cols = shapes[name]
        if rank > min(rows, cols):
            raise ConfigError(f"lora.rank {rank} is larger than {name}'s smaller dimension ({rows} x {cols}); "
                              f"use at most {min(rows, cols)}")
        out += [Tensors(rank * cols, layers), Tensors(rows * rank, layers)]
    return out


def optimizer_bytes(optim: str, trainable: list[Tensors], state_bytes: int) -> float:
    """Bytes of ``optim``'s state (see the module docstring) over the ``trainable`` tensors, whole
    (before sharding); ``state_bytes``: one fp32 or bf16 state element (AdamW's and Muon's)."""
    if optim == "adamw8bit":
        return float(sum(adamw8bit_state_bytes(t.numel) * t.count for t in trainable))
    if optim == "muon":
        hidden = elements([t for t in trainable if t.hidden])
        return float(hidden * state_bytes + (elements(trainable) - hidden) * 2 * state_bytes)
    return float(elements(trainable) * 2 * state_bytes)


def ddp_bucket_bytes(trainable: int, grad_bytes: int, bucket_view: bool = DDP_GRADIENT_AS_BUCKET_VIEW) -> float:
    """Bytes of DDP's gradient buckets beside the gradients: ``trainable * grad_bytes``, 0 when the
    gradients are views into them (``bucket_view``)."""
    return 0.0 if bucket_view else float(trainable * grad_bytes)


def split_by_buckets(block_trainable_bytes: float, bucket_cap_mb: float) -> bool:
    """Whether compiled DDP cuts every block's graph: ``torch._dynamo``'s DDPOptimizer breaks the
    compiled graph at each bucket boundary, so with a block's trainable bytes over one bucket
    (``bucket_cap_mb`` MiB: ``train.ddp_bucket_cap_mb``) each block is compiled in pieces of one or two
    projections."""
    return block_trainable_bytes > bucket_cap_mb * 2 ** 20


__all__ = ["ParamCounts", "param_counts", "Tensors", "elements", "stage_tensors",
           "lora_tensors", "optimizer_bytes", "ddp_bucket_bytes", "split_by_buckets"]
