"""``optim.name adamw8bit``: AdamW whose two moments are kept in 8 bits (torchao's ``AdamW8bit``).

Dettmers et al. 2022 ("8-bit Optimizers via Block-wise Quantization", arXiv:2110.02861): each
moment of a tensor is stored as one uint8 code per element into a 256-entry dynamic-tree table
(signed for ``m``, unsigned for ``v``), with one fp32 absmax scale per block of
:data:`BLOCK_SIZE` elements. The step dequantizes a tensor's moments to fp32, runs AdamW's update
in fp32 on the fp32 weights (codechat's weights are fp32 as with ``adamw``: the fp32 "master" copy
is the model itself) and requantizes the moments.

State bytes per parameter (torchao 0.18, ``torchao/optim/subclass_8bit.py``, ``adam.py``): a tensor
of at least :data:`MIN_QUANTIZED_NUMEL` elements whose count ``n`` is a multiple of
:data:`BLOCK_SIZE` keeps, per moment, ``n`` codes, ``n / 256`` fp32 scales and its own fp32 copy of
the 256-entry table: ``2 * (n + 4 n / 256 + 1024)`` bytes, 2.03125 bytes a parameter against
AdamW's 8. Any other tensor (norm weights, scalars) keeps fp32 moments like AdamW (8 bytes a
parameter). :func:`state_bytes` is that formula; ``tests/test_optim8bit.py`` holds it to the
bytes a real optimizer holds.

Why torchao's and not bitsandbytes': both implement the same block-wise 8-bit Adam (bitsandbytes'
is the paper's own). torchao is a 3.4 MB wheel already in the ``fp8`` and ``test`` extras (for
``train.fp8``), pure PyTorch (its step is one ``torch.compile``'d function per tensor shape), and
runs on the CPU: on the 2-core development VM a ``tiny`` model trains with it, resumes exactly and
its state is 0.25x AdamW's bytes (``tests/test_optim8bit.py``). bitsandbytes is a 43 MB wheel of
CUDA kernels (too big for a 64 MiB device carry beside the code) and has no CPU path to test here.
The cost is the step: torchao compiles the update once per distinct (shape, quantized or not) pair
(about 35 s on that VM for the first step of a small model with a cold compile cache, seconds
warm) and launches it once per tensor: on that VM a ``tiny`` step took 3.4x AdamW's
(``benchmarks/optimizer_step.py``, ``benchmarks/RESULTS.md``; GPU step time not measured yet).

Not adopted: bf16 weights with stochastic rounding (torchao's ``bf16_stochastic_round``). It would
save the fp32 weights' other 2 bytes a parameter, but codechat's trainer keeps fp32 weights for
every optimizer and its quality was not measured here; the planner (``codechat plan --param-dtype
bf16 --optim.name adamw8bit``) still shows what it would take.

Devices: CUDA and CPU (where ``torch.compile`` has a backend); any other device, or no torchao, is
refused by :func:`build_adamw8bit` (the trainer builds its optimizer before step 0) with the setting and the fix.
"""
from __future__ import annotations

from typing import Any

from codechat.config.stages import ConfigError

#: Elements per block of one fp32 scale (torchao's default, as bitsandbytes').
BLOCK_SIZE = 256
#: torchao quantizes only tensors of at least this many elements (following bitsandbytes).
MIN_QUANTIZED_NUMEL = 4096
#: Bytes of the fp32 code table each quantized moment keeps (256 entries).
QMAP_BYTES = 256 * 4
#: Devices torchao's compiled step runs on.
DEVICES = ("cuda", "cpu")


def quantized(numel: int) -> bool:
    """Whether torchao keeps a tensor of ``numel`` elements in 8 bits (else fp32 moments)."""
    return numel >= MIN_QUANTIZED_NUMEL and numel % BLOCK_SIZE == 0


def state_bytes(numel: int) -> int:
    """Bytes of both moments of one tensor of ``numel`` elements (see the module docstring)."""
    if quantized(numel):
        return 2 * (numel + 4 * numel // BLOCK_SIZE + QMAP_BYTES)
    return 2 * 4 * numel


def build_adamw8bit(groups: list[dict[str, Any]], lr: float, betas: tuple[float, float], eps: float,
                    device: Any) -> Any:
    """torchao's ``AdamW8bit`` over ``groups`` (each with its ``weight_decay``), block size :data:`BLOCK_SIZE`.

    torchao keeps each group's ``lr`` as a 0-dim fp32 tensor, so that a new LR does not recompile its
    step: :func:`codechat.train.optim.set_lr` writes into that tensor.

    Raises:
        ConfigError: ``device`` is neither CUDA nor CPU, or torchao is not installed.
    """
    if device.type not in DEVICES and device.type != "meta":  # meta: a template to load a checkpoint into
        raise ConfigError(f"optim.name adamw8bit runs on CUDA and CPU (torchao compiles its step), not on "
                          f"{device.type}; use --optim.name adamw")
    try:
        from torchao.optim import AdamW8bit
    except ImportError:
        raise ConfigError("optim.name adamw8bit needs torchao: pip install 'codechat[fp8]', or use --optim.name "
                          "adamw") from None
    return AdamW8bit(groups, lr=lr, betas=betas, eps=eps, block_size=BLOCK_SIZE)


__all__ = ["BLOCK_SIZE", "MIN_QUANTIZED_NUMEL", "QMAP_BYTES", "DEVICES", "quantized", "state_bytes",
           "build_adamw8bit"]
