"""What one transformer block keeps for its backward, per token: the memory planner's activations.

:mod:`codechat.train.plan` multiplies these by the tokens of a micro-batch and the blocks of a
stage; see its docstring for how they enter the peak.
"""
from __future__ import annotations

from codechat.config.stages import ModelConfig

from .plan_states import ParamCounts

FP32 = 4


def activation_bytes(cfg: ModelConfig, ac: str, residual_bytes: int, compute_bytes: int,
                     compiled: bool = False) -> int:
    """Bytes per token that one transformer block keeps for its backward.

    The method of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
    Models", sec. 4.1: sbh(34 + 5as/h) for a GPT layer) applied to this block (RMSNorm, GQA,
    SwiGLU, no dropout, fused SDPA that keeps no (T, T) scores, only a logsumexp per head), with
    h = n_embd, q = n_head * head_dim, kv = n_kv_head * head_dim, I = intermediate_size,
    r = residual_bytes (the residual stream: fp32 when autocast runs on fp32 weights), c = compute_bytes:

    - ``none``: 2hr (the inputs of both norms) + nhc with n = 5 casts of the norms' outputs when
      r != c (autocast casts them once per projection: q, k, v, gate, up), else n = 2; (q + kv)c for
      QK-norm; (2q + 2kv)c for attention (rotated q and k, v, the output that ``o_proj`` reads);
      4Ic for SwiGLU (gate, up, silu(gate), the product); fp32 statistics (norms' rstd, logsumexp).
    - ``selective``: torchtitan's op-level policy (``apply_ac`` with ``selective_ac_option: op``):
      keep the attention output and the output of every other matmul of the block, recompute the
      rest; in this block's order (q, k, v, o, gate, up, down) that keeps q, v, gate and down:
      hr + (2q + kv + I + h)c + the logsumexp.
    - ``full`` (each block recomputed from its input; Korthikanti et al.'s 2sbh per layer): hr.

    ``compiled`` (``none`` only): what AOTAutograd's min-cut partitioner keeps when ``torch.compile``
    traces the step — 2hr + 2hc (each norm's output cast once) + (q + kv)c (the QK-norm inputs) +
    (2q + 2kv)c + 3Ic (gate, up and silu(gate): the product is recomputed) + the fp32 statistics.
    ``tests/test_plan.py`` holds it to the bytes a compiled step saves (counted with
    ``saved_tensors_hooks``), and on an H200 it predicts the measured growth of peak memory per
    token of d20 and 1b within 0.2%.
    """
    h, q, kv, i = cfg.n_embd, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim, cfg.intermediate_size
    r, c = residual_bytes, compute_bytes
    if ac == "full":
        return h * r
    if ac == "selective":
        return h * r + (2 * q + kv + i + h) * c + FP32 * cfg.n_head
    casts = 2 if compiled or r == c else 5
    qk_norm = ((q + kv) * c + FP32 * (cfg.n_head + cfg.n_kv_head)) if cfg.qk_norm else 0
    swiglu = (3 if compiled else 4) * i * c
    return 2 * h * r + casts * h * c + qk_norm + (2 * q + 2 * kv) * c + swiglu + FP32 * (2 + cfg.n_head)


def skip_bytes(cfg: ModelConfig, residual_bytes: int) -> int:
    """Bytes per token that ``model.x0_mix`` and ``model.unet_skips`` keep for their backward, outside the
    blocks (checkpointed or not): with ``x0_mix`` the input of every mix (the embedding output and each
    block's output but the last: ``n_layer`` residual tensors); ``unet_skips`` alone only block
    ``n_layer // 2 - 1``'s output when ``n_layer`` is even (each other skipped output is the next block's
    input, kept anyway). A compiled step keeps less (AOTAutograd recomputes some): an upper bound there
    (``tests/test_model_options.py`` counts both).
    """
    L = cfg.n_layer
    return cfg.n_embd * residual_bytes * (L if cfg.x0_mix else int(cfg.unet_skips and L % 2 == 0))


def lora_activation_bytes(counts: ParamCounts, rank: int, targets: tuple[str, ...], dropout: bool,
                          compute_bytes: int) -> int:
    """Bytes per token one block's LoRA adapters (rank ``rank`` on the ``targets`` projections) keep
    for their backward: each adapter's (rank,) output of ``A`` that ``B`` multiplies; with ``dropout``,
    also its dropped (in,) input. 0 without adapters (``rank`` 0)."""
    if not rank:
        return 0
    shapes = dict(zip(counts.block_matrix_names, counts.block_matrices))
    dropped = sum(shapes[t][1] for t in targets) if dropout else 0
    return (rank * len(targets) + dropped) * compute_bytes


__all__ = ["FP32", "activation_bytes", "skip_bytes", "lora_activation_bytes"]
