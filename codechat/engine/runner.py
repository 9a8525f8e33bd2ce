"""The model as the engine runs it: fused inference weights, a slot KV cache, prefill and decode.

:class:`InferenceModel` holds a copy of a :class:`codechat.model.GPT`'s weights in the inference
dtype (bf16 on CUDA, fp32 elsewhere, whatever the checkpoint's dtype) with the query, key and
value projections fused into one matrix and the SwiGLU gate and up projections into another. Its
forward pass is token-major: the N tokens of a step are rows of one (N, C) matrix whatever
sequences they belong to, and only attention knows where each sequence's keys live. The model's
options (``model.mlp_act``, ``logit_softcap``, ``x0_mix``, ``unet_skips``) are computed as
:class:`codechat.model.GPT` computes them; without ``x0_mix`` and ``unet_skips`` the residual add of
each block is fused with the next block's norm.

:class:`KVCache` is a fixed pool of ``slots``, each with room for ``max_len`` positions; a
sequence owns one slot from its prefill until it finishes. Prefill packs prompts of any lengths
end to end (no padding); decode feeds one token per slot, attending to that slot's first
``length + 1`` positions. On CUDA both go through FlashAttention-2's variable-length kernel
(``aten._flash_attention_forward`` with ``seqused_k``: Dao 2023, "FlashAttention-2"), which reads
only the filled part of each slot from a cache of static shape, so a decode step can be captured
in a CUDA graph once per batch size and replayed. Decode attention on CUDA is the split-KV Triton
kernel of :mod:`.attention` when Triton is installed (FlashAttention's kernel gives each
sequence-head one program: ~15 us a layer at batch 1); elsewhere
``F.scaled_dot_product_attention`` with a length mask.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..model import GPT, logits_fp32, rope_tables, soft_cap
from codechat.peft.lora import dense_weight
from . import attention as decode_kernels
from . import skinny


def _add_norm(x: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual, normed): ``x + delta`` and its RMSNorm; ``delta`` (S, N, C) is the partial sums
    of a matmul (:func:`codechat.engine.skinny.linear`), rounded to ``x``'s dtype once summed."""
    x = x + delta.sum(0).to(x.dtype)
    return x, F.rms_norm(x, (x.size(-1),), w, eps)


def _qkv_rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, qn: torch.Tensor | None,
              kn: torch.Tensor | None, n_head: int, n_kv: int, eps: float
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a fused (N, (H + 2 Hkv) D) projection into q (N, H, D), k, v (N, Hkv, D); QK-norm and
    rotate q and k (the rotate-half layout of :func:`codechat.model.apply_rope`)."""
    N = qkv.size(0)
    D = cos.size(-1)
    q, k, v = qkv.split([n_head * D, n_kv * D, n_kv * D], dim=-1)
    q, k, v = q.view(N, n_head, D), k.view(N, n_kv, D), v.view(N, n_kv, D)
    if qn is not None:
        q = F.rms_norm(q, (D,), qn, eps)
        k = F.rms_norm(k, (D,), kn, eps)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def rope(x: torch.Tensor) -> torch.Tensor:
        rotated = torch.cat([-x[..., D // 2:], x[..., :D // 2]], dim=-1)
        return (x * cos + rotated * sin).to(x.dtype)
    return rope(q), rope(k), v


def _swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u


def _relu2(up: torch.Tensor) -> torch.Tensor:
    """The MLP nonlinearity of ``model.mlp_act="relu2"`` (no gate): ``relu(up)^2``."""
    return F.relu(up).square()


@dataclass
class KVCache:
    """Keys and values of ``slots`` sequences: ``k[layer]``/``v[layer]`` (slots, max_len + 1,
    n_kv_head, head_dim) in the inference dtype. The extra position takes the one step a finished
    row may still run before the host learns that it stopped."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @classmethod
    def empty(cls, n_layer: int, slots: int, max_len: int, n_kv_head: int, head_dim: int,
              device: torch.device, dtype: torch.dtype) -> "KVCache":
        shape = (slots, max_len + 1, n_kv_head, head_dim)
        return cls([torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)],
                    [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)])

    @property
    def slots(self) -> int:
        return self.k[0].size(0)

    @property
    def positions(self) -> int:
        return self.k[0].size(1)

    def nbytes(self) -> int:
        return 2 * sum(t.numel() * t.element_size() for t in self.k)


def capture_graph(fn: Callable[[], tuple[torch.Tensor, ...]], kept: list[torch.Tensor], pool: tuple
                  ) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
    """A CUDA graph of ``fn`` and its output tensors, captured in memory ``pool``. Two warm-up runs
    (compilation, cuBLAS workspaces) go first on a side stream; the tensors ``kept`` (state that
    ``fn`` updates in place) are restored after each run and after the capture, so capturing
    changes nothing."""
    state = [t.clone() for t in kept]

    def restore() -> None:
        for t, saved in zip(kept, state):
            t.copy_(saved)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
            restore()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    restore()
    return graph, out


def flash_available(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether FlashAttention-2's variable-length kernel serves this device, dtype and head size."""
    return (device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and head_dim % 8 == 0
            and head_dim <= 256 and torch.cuda.get_device_capability(device)[0] >= 8)


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
           max_q: int, max_k: int, causal: bool, used_k: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False,
                                                   seqused_k=used_k)[0]


class InferenceModel:
    """A GPT's weights laid out for generation, and its token-major forward pass.

    Args:
        model: the trained model (any dtype, any device); its weights are copied (:meth:`load`).
        dtype: the inference dtype (bf16 on CUDA, fp32 on CPU is what :class:`Engine` picks).
        max_len: the longest sequence served; RoPE tables cover ``max_len + 1`` positions.
        compile: fuse the elementwise work between matmuls with ``torch.compile`` (CUDA).
        attention: decode attention, ``auto`` (the Triton split-KV kernel of
            :mod:`codechat.engine.attention` on CUDA when Triton is installed, else FlashAttention's
            varlen kernel where it serves, else SDPA), ``triton``, ``flash`` or ``sdpa``.

    Raises:
        ValueError: an ``attention`` this device, dtype or head size cannot run.
    """

    def __init__(self, model: GPT, dtype: torch.dtype, max_len: int, compile: bool = False,
                 attention: str = "auto") -> None:
        c = model.cfg
        self.cfg, self.dtype = c, dtype
        self.device = model.embed_tokens.weight.device
        self.n_head, self.n_kv, self.head_dim, self.eps = c.n_head, c.n_kv_head, c.head_dim, c.norm_eps
        self.flash = flash_available(self.device, dtype, c.head_dim)
        can = {"triton": decode_kernels.available(self.device), "flash": self.flash, "sdpa": True}
        if attention == "auto":
            attention = next(k for k in ("triton", "flash", "sdpa") if can[k])
        if not can.get(attention, False):
            raise ValueError(f"attention={attention!r} cannot run here (device {self.device}, {dtype}, head_dim "
                             f"{c.head_dim}); choose one of {[k for k, v in can.items() if v]}")
        self.decode_backend = attention
        cos, sin = rope_tables(c.head_dim, max_len + 1, c.rope_theta, self.device)
        self.cos, self.sin = cos, sin
        self.weights: dict[str, torch.Tensor] = {}
        self.load(model)
        wrap: Callable = (lambda f: torch.compile(f, dynamic=True)) if compile else (lambda f: f)
        act = _relu2 if c.mlp_act == "relu2" else _swiglu  # its input: "wgu" (gate and up, or up alone)
        self.add_norm, self.qkv_rope, self.swiglu = wrap(_add_norm), wrap(_qkv_rope), wrap(act)

    @torch.no_grad()
    def load(self, model: GPT) -> None:
        """Copy ``model``'s current weights in (in place after the first call, so that captured CUDA
        graphs stay valid: an RL trainer calls this after each update). A projection with LoRA
        adapters is copied merged (:func:`codechat.peft.lora.dense_weight`): rollouts see the current adapters."""
        new: dict[str, torch.Tensor] = {"embed": model.embed_tokens.weight, "norm": model.norm.weight}
        if not self.cfg.tie_embeddings:
            new["lm_head"] = model.lm_head.weight
        for i, b in enumerate(model.layers):
            a, m = b.self_attn, b.mlp
            new[f"{i}.wqkv"] = torch.cat([dense_weight(a.q_proj), dense_weight(a.k_proj), dense_weight(a.v_proj)])
            new[f"{i}.wo"] = dense_weight(a.o_proj)
            new[f"{i}.wgu"] = dense_weight(m.up_proj) if m.gate_proj is None else torch.cat([dense_weight(m.gate_proj),
                                                                                             dense_weight(m.up_proj)])
            new[f"{i}.wdown"] = dense_weight(m.down_proj)
            new[f"{i}.ln1"], new[f"{i}.ln2"] = b.input_layernorm.weight, b.post_attention_layernorm.weight
            if a.q_norm is not None:
                new[f"{i}.qn"], new[f"{i}.kn"] = a.q_norm.weight, a.k_norm.weight
        for name in ("x_scale", "x0_scale", "unet_scale"):  # model.x0_mix, model.unet_skips
            if getattr(model, name) is not None:
                new[name] = getattr(model, name)
        for name, w in new.items():
            if name in self.weights:
                self.weights[name].copy_(w.detach())
            else:  # a copy even when device and dtype match: ``.to`` alone would alias the model's tensors
                self.weights[name] = w.detach().to(self.device, self.dtype, memory_format=torch.contiguous_format,
                                                   copy=True)
        self.weights.setdefault("lm_head", self.weights["embed"])  # tied: one tensor

    def nbytes(self) -> int:
        """Bytes of weights one decode step reads: all but the embedding table, of which it reads
        only the rows of its tokens (a tied LM head is read whole, as ``lm_head``)."""
        return sum(t.numel() * t.element_size() for k, t in self.weights.items() if k != "embed")

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor,
                attend: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Final-norm hidden states (N, C) of ``tokens`` (N,) int64 at ``positions`` (N,) int64.

        ``attend(layer, q, k, v)`` gets q (N, H, D) and k, v (N, Hkv, D), stores k and v where
        its sequences keep them and returns the attention output (N, H, D).
        """
        w, L = self.weights, self.cfg.n_layer
        skips = self.cfg.x0_mix or self.cfg.unet_skips  # then each block's input is mixed before its norm
        cos, sin = self.cos[positions], self.sin[positions]
        x = x0 = F.embedding(tokens, w["embed"])
        kept: list[torch.Tensor] = []
        h = x if skips else F.rms_norm(x, (x.size(-1),), w["0.ln1"], self.eps)  # skips: skip_in norms it
        for i in range(L):
            if skips:
                x, h = self.skip_in(i, x, x0, kept)
            q, k, v = self.qkv_rope(F.linear(h, w[f"{i}.wqkv"]), cos, sin, w.get(f"{i}.qn"), w.get(f"{i}.kn"),
                                    self.n_head, self.n_kv, self.eps)
            y = attend(i, q, k, v).reshape(x.size(0), -1)
            x, h = self.add_norm(x, skinny.linear(y, w[f"{i}.wo"]), w[f"{i}.ln2"], self.eps)
            down = skinny.linear(self.swiglu(F.linear(h, w[f"{i}.wgu"])), w[f"{i}.wdown"])
            if skips and i + 1 < L:  # the next block's norm comes after its skip_in
                x = x + down.sum(0).to(x.dtype)
                if self.cfg.unet_skips and i < L // 2:
                    kept.append(x)
            else:
                x, h = self.add_norm(x, down, w[f"{i + 1}.ln1"] if i + 1 < L else w["norm"], self.eps)
        return h

    def skip_in(self, i: int, x: torch.Tensor, x0: torch.Tensor, kept: list[torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`codechat.model.GPT.skip_in` on token-major states (N, C) in the inference dtype: block
        ``i``'s input and its first RMSNorm."""
        w, L = self.weights, self.cfg.n_layer
        if self.cfg.x0_mix:
            x = w["x_scale"][i] * x + w["x0_scale"][i] * x0
        if self.cfg.unet_skips and L - 1 - i < L // 2:
            x = x + w["unet_scale"][L - 1 - i] * kept[L - 1 - i]
        return x, F.rms_norm(x, (x.size(-1),), w[f"{i}.ln1"], self.eps)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(N, vocab_size) float32 logits of final hidden states ``h`` (N, C), never rounded to the
        inference dtype: the split-K kernel's fp32 product in one slice of K where it applies (a
        decode step: faster than cuBLAS's bf16 product and its cast on an H200), else
        :func:`codechat.model.logits_fp32`; soft-capped as the model's (``model.logit_softcap``)."""
        w = self.weights["lm_head"]
        if skinny.applies(h):
            return soft_cap(skinny.linear_partials(h, w, **skinny.LM_HEAD)[0], self.cfg.logit_softcap)
        return soft_cap(logits_fp32(h, w), self.cfg.logit_softcap)

    # -- attention over the slot cache ------------------------------------------------------------

    def prefill_attend(self, cache: KVCache, seg_lens: list[int] | None, cu: torch.Tensor,
                       dest: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor], max_len: int = 0) -> Callable:
        """``attend`` for packed prompts: segment ``j`` is tokens ``cu[j]:cu[j+1]`` (causal within
        itself); ``dest = (src, slot, pos)`` (M,) int64 copies token ``src`` to ``(slot, pos)`` (``src``
        None: token ``i`` to entry ``i``). ``seg_lens`` None (a captured prefill: no host values)
        needs FlashAttention, with ``max_len`` bounding the segments' lengths."""
        src, slot, pos = dest
        max_len = max_len or max(seg_lens or [0])

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            ks, vs = (k, v) if src is None else (k[src], v[src])
            cache.k[layer].index_put_((slot, pos), ks)
            cache.v[layer].index_put_((slot, pos), vs)
            if self.flash:
                return _flash(q, k, v, cu, cu, max_len, max_len, True)
            if seg_lens is None:
                raise ValueError("a prefill without host segment lengths needs FlashAttention's varlen kernel")
            out, start = [], 0
            for n in seg_lens:
                qs, ks, vs = (t[start:start + n].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
                out.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)[0].transpose(0, 1))
                start += n
            return torch.cat(out)
        return attend

    def decode_attend(self, cache: KVCache, lengths: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                      max_used: int | None = None) -> Callable:
        """``attend`` for one new token in each of slots ``0..b-1`` (b = ``lengths.numel()``), each
        at position ``lengths[r]`` and seeing positions ``0..lengths[r]``. ``max_used`` (host) bounds
        ``lengths + 1`` on the non-flash path (None: the whole cache, a static shape). Build it
        inside a captured graph: what it derives from ``lengths`` must be recomputed each step."""
        b = lengths.numel()
        rows = torch.arange(b, device=lengths.device)
        used = lengths + 1
        used32 = used.to(torch.int32)
        P = cache.positions

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kc, vc = cache.k[layer], cache.v[layer]
            if self.decode_backend == "triton":  # the kernel writes k and v into the cache itself
                return decode_kernels.decode_attention(q, k, v, kc, vc, used)
            kc.index_put_((rows, lengths), k)
            vc.index_put_((rows, lengths), v)
            if self.decode_backend == "flash":
                return _flash(q, kc[:b].view(b * P, self.n_kv, self.head_dim),
                              vc[:b].view(b * P, self.n_kv, self.head_dim), cu_q, cu_k, 1, P, False, used32)
            m = P if max_used is None else max_used
            mask = (torch.arange(m, device=q.device) < used.unsqueeze(1)).view(b, 1, 1, m)
            y = F.scaled_dot_product_attention(q.unsqueeze(2), kc[:b, :m].transpose(1, 2), vc[:b, :m].transpose(1, 2),
                                               attn_mask=mask, enable_gqa=True)
            return y.squeeze(2)
        return attend
