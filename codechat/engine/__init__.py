"""Generation for every stage after training: sample, chat, evaluation, RL rollouts, serving.

- :mod:`.sampling`: :class:`SamplingConfig`, per-row temperature / top-k / top-p with
  counter-based randomness, log-probs of each choice;
- :mod:`.runner`: fused inference weights (bf16 on CUDA), the slot KV cache, packed prefill and
  static-shape decode through FlashAttention's variable-length kernel;
- :mod:`.types`: :class:`EngineConfig`, :class:`Request`, the :class:`Token` events and :class:`Sample` s;
- :mod:`.scheduler`: :class:`Engine`, continuous batching of :class:`Request` s with CUDA graphs.
"""
from .sampling import SamplingConfig
from .scheduler import Engine
from .types import FINISH_REASONS, EngineConfig, Request, Sample, Token


def mean_logprob(engine: Engine, prompt: list[int], completion: list[int]) -> float:
    """Mean log-probability, in nats per token, of ``completion`` following ``prompt``, scored by
    one teacher-forced pass at temperature 1 (:meth:`Engine.score`) whatever the sampling was.

    Ranking samples by it is the "mean log-probability" selection of Chen et al. 2021 ("Evaluating
    Large Language Models Trained on Code", arXiv:2107.03374) and the ``best_of`` of OpenAI's
    completions API.

    Raises:
        ValueError: ``prompt`` or ``completion`` is empty, or together they exceed the context.
    """
    lps = engine.score(prompt, completion)
    return sum(lps) / len(lps)


__all__ = ["Engine", "EngineConfig", "FINISH_REASONS", "Request", "Sample", "SamplingConfig", "Token",
           "mean_logprob"]
