"""FP8 training of the blocks' linear layers (``train.fp8``) through ``torchao.float8``.

Each linear layer inside a block (attention's q, k, v, o; the MLP's gate, up, down) becomes
torchao's ``Float8Linear``: its forward casts the input and the weight to float8 e4m3 (its backward
the output gradient to e5m2) with scales computed from each tensor's absolute maximum at that
step ("dynamic" scaling), multiplies with ``torch._scaled_mm`` accumulating in fp32 and returns
the autocast dtype (bf16). Recipes (torchao's ``Float8LinearConfig.from_recipe_name``):

- ``tensorwise``: one scale per tensor; the fastest on Hopper;
- ``rowwise``: one scale per row of each operand; more robust to outliers, slower, and a longer compile.

What does not change: each layer keeps its weight ``Parameter`` (same name, shape and dtype: the
fp32 master weights), so optimizers (Muon included), checkpoints, export and every other command
see the model as without FP8; the embedding stays bf16, and so does the LM head unless asked
(``train.fp8_head``: the vocab-wide logits are the matmul most sensitive to FP8's range; an
untied head only, since the embedding's rows cannot be a ``Float8Linear``); a linear whose dimensions are not multiples
of 16 stays bf16 (FP8 GEMMs need them). With FSDP the weights are all-gathered in bf16 and cast
after the gather (torchao's float8 all-gather is not used).

Hardware: FP8 tensor cores, i.e. CUDA compute capability 8.9 or later (Ada, Hopper, Blackwell);
elsewhere :func:`check_fp8` refuses before step 0. MFU is still counted against the device's
dense bf16 peak (:data:`codechat.config.device.PEAK_BF16_FLOPS`), so a run in FP8 can exceed
what bf16 could reach.
"""
from __future__ import annotations

import torch
from torch import nn

from codechat.config.stages import FP8_RECIPES, ConfigError

#: CUDA compute capability from which GPUs have FP8 tensor cores (Ada Lovelace: 8.9; Hopper: 9.0).
MIN_CAPABILITY = (8, 9)


def check_fp8(recipe: str, device: torch.device) -> None:
    """Refuse ``train.fp8=recipe`` where it cannot run.

    ``recipe`` is one of :data:`FP8_RECIPES` (``TrainConfig`` checks the name).

    Raises:
        ConfigError: a device that is not a CUDA GPU of compute capability >= 8.9; torchao not installed.
    """
    if recipe == "none":
        return
    if device.type != "cuda":
        raise ConfigError(f"train.fp8={recipe} needs a CUDA GPU with FP8 tensor cores (compute capability >= 8.9: "
                          f"Ada, Hopper or newer); this run is on {device.type}: use --train.fp8 none")
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        raise ConfigError(f"train.fp8={recipe} needs FP8 tensor cores (compute capability >= 8.9: Ada, Hopper or "
                          f"newer); {torch.cuda.get_device_name(device)} is {cap[0]}.{cap[1]}: use --train.fp8 none")
    _torchao_float8()


def _torchao_float8():
    try:
        import torchao.float8 as float8
    except ImportError as e:
        raise ConfigError(f"train.fp8 needs torchao ({e}): pip install 'codechat[fp8]' (torchao>=0.12), or use "
                          "--train.fp8 none") from None
    return float8


def fp8_eligible(module: nn.Module, fqn: str, head: bool = False) -> bool:
    """Whether the layer at ``fqn`` trains in FP8: a plain ``nn.Linear`` inside a block (``layers.``),
    or the LM head (``lm_head``) when ``head``, whose in and out features are multiples of 16."""
    return (type(module) is nn.Linear and (fqn.startswith("layers.") or ".layers." in fqn or (head and fqn == "lm_head"))
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def convert_to_fp8(model: nn.Module, recipe: str, head: bool = False) -> list[str]:
    """Swap ``model``'s eligible linears (:func:`fp8_eligible`; the LM head too when ``head``) for
    torchao's ``Float8Linear`` in place under ``recipe`` (``tensorwise`` or ``rowwise``); returns the
    names of the layers swapped. ``GPT.head`` then calls the FP8 head as a module.

    Call it before the model is wrapped (DDP, FSDP) or compiled. The device is not checked here
    (:func:`check_fp8`): on a CPU torch emulates the FP8 matmul, which tests use.

    Raises:
        ConfigError: ``recipe`` is ``none`` or unknown; ``head`` with the head tied to the embedding;
            torchao is missing.
    """
    if recipe not in FP8_RECIPES[1:]:
        raise ConfigError(f"convert_to_fp8: recipe must be one of {', '.join(FP8_RECIPES[1:])}, got {recipe!r}")
    if head and model.lm_head.weight is model.embed_tokens.weight:
        raise ConfigError("train.fp8_head with model.tie_embeddings: the head's weight is the embedding's and "
                          "stays bf16; drop --train.fp8_head or untie the embeddings")
    float8 = _torchao_float8()
    names = [fqn for fqn, m in model.named_modules() if fp8_eligible(m, fqn, head)]
    float8.convert_to_float8_training(model, config=float8.Float8LinearConfig.from_recipe_name(recipe),
                                      module_filter_fn=lambda m, fqn: fp8_eligible(m, fqn, head))
    model.fp8_head = "lm_head" in names
    return names
