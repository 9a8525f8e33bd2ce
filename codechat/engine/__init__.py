"""Generation for every stage after training: sample, chat, evaluation, RL rollouts, serving.

- :mod:`.sampling`: :class:`SamplingConfig`, per-row temperature / top-k / top-p with
  counter-based randomness, log-probs of each choice;
- :mod:`.runner`: fused inference weights (bf16 on CUDA), the slot KV cache, packed prefill and
  static-shape decode through FlashAttention's variable-length kernel;
- :mod:`.types`: :class:`EngineConfig`, :class:`Request`, the :class:`Token` events and :class:`Sample` s;
- :mod:`.scheduler`: :class:`Engine`, continuous batching of :class:`Request` s with CUDA graphs;
- :mod:`.grammar`: constraints (JSON schema, regex, Lark) compiled against the tokenizer, and the
  per-row token masks a constrained :class:`Request` is sampled under;
- :mod:`.scoring`: teacher-forced log-probabilities of a known sequence (:meth:`Engine.score`, a
  prompt's tokens with their top-k for the server's ``echo``), in one pass that takes no cache slot;
- :mod:`.completion`: code completion with a base model (where it ends, the best of n by mean log-probability).
"""
from .sampling import SamplingConfig
from .scheduler import Engine
from .types import FINISH_REASONS, EngineConfig, Request, Sample, Token

__all__ = ["Engine", "EngineConfig", "FINISH_REASONS", "Request", "Sample", "SamplingConfig", "Token"]
