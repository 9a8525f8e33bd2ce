"""``config.json`` of a Hugging Face Llama / Qwen3 checkpoint, to and from :class:`~codechat.config.stages.ModelConfig`.

The two architectures differ, for codechat's model, only in QK-norm: ``Qwen3ForCausalLM`` has it
(an RMSNorm over each head's query and key before RoPE), ``LlamaForCausalLM`` does not. Every other
field maps one to one:

=========================  ==========================
``config.json``            ``ModelConfig``
=========================  ==========================
vocab_size                 vocab_size (embedding rows)
hidden_size                n_embd
num_hidden_layers          n_layer
num_attention_heads        n_head
num_key_value_heads        n_kv_head
head_dim                   head_dim
intermediate_size          intermediate_size
max_position_embeddings    max_seq_len
rope_theta                 rope_theta
rms_norm_eps               norm_eps
tie_word_embeddings        tie_embeddings
initializer_range          init_std
=========================  ==========================

Export refuses, naming the field, every :class:`ModelConfig` option that neither architecture can
express (:data:`NOT_EXPORTABLE`: the ReLU² MLP, logit soft-capping): transformers would load the
weights without complaint and compute something else.

Import refuses, naming the field, every setting that would change what the weights compute in a way
codechat's model does not reproduce (:data:`UNSUPPORTED`): RoPE scaling other than the default,
sliding-window attention, biases, mixtures of experts, quantised weights, an activation other than
SiLU, attention dropout. Reading such a checkpoint as if the field were absent would give a model
that loads and runs but is wrong.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from codechat.config.stages import ConfigError, ModelConfig

#: ``model_type`` -> (architecture, QK-norm).
ARCHITECTURES: dict[str, tuple[str, bool]] = {"llama": ("LlamaForCausalLM", False),
                                              "qwen3": ("Qwen3ForCausalLM", True)}
ROPE_DEFAULT = ("default", None)  # rope_type values that mean plain RoPE


class HFImportError(ConfigError):
    """A Hugging Face checkpoint codechat cannot load faithfully; the message names the file and the field."""


class HFExportError(ConfigError):
    """A codechat model that transformers' Llama / Qwen3 cannot compute; the message names the option."""


#: ``ModelConfig`` options outside Llama / Qwen3: field -> (the value both can express, what it changes).
#: ``zero_init_proj`` is not here: it changes the initialisation only, not what the weights compute.
NOT_EXPORTABLE: dict[str, tuple[Any, str]] = {
    "mlp_act": ("swiglu", "their MLP is always SwiGLU, down(silu(gate(x)) * up(x)); relu2 has no gate"),
    "logit_softcap": (0.0, "they have no final-logit soft-capping (Gemma 2 has; Llama and Qwen3 do not)"),
    "x0_mix": (False, "their blocks read the previous block's output alone, with no learned mix of the embedding"),
    "unet_skips": (False, "their blocks have no skip connections from earlier blocks"),
}


def check_exportable(cfg: ModelConfig) -> None:
    """Raises :class:`HFExportError` naming each option of ``cfg`` in :data:`NOT_EXPORTABLE` that is on."""
    bad = [f"model.{k}={getattr(cfg, k)!r} ({what})" for k, (ok, what) in NOT_EXPORTABLE.items()
           if getattr(cfg, k) != ok]
    if bad:
        raise HFExportError("cannot export to transformers' LlamaForCausalLM / Qwen3ForCausalLM: "
                            + "; ".join(bad) + ". The model would load there and compute something else; keep "
                            "using it with codechat (chat, serve, eval), or train one with these options off")


def _is_set(value: Any) -> bool:
    """True for a value that turns a feature on (a non-empty, non-zero, non-false value)."""
    return value not in (None, False, 0, 0.0, "", [], {})


#: Fields refused when set, with what they would change. ``rope_scaling``/``rope_parameters``,
#: ``layer_types`` and ``hidden_act`` are checked by value in :func:`model_config_from_hf`.
UNSUPPORTED: dict[str, str] = {
    "attention_bias": "biases on the attention projections",
    "mlp_bias": "biases on the MLP projections",
    "use_sliding_window": "sliding-window attention",
    "num_experts": "a mixture of experts",
    "num_local_experts": "a mixture of experts",
    "n_routed_experts": "a mixture of experts",
    "moe_intermediate_size": "a mixture of experts",
    "quantization_config": "quantised weights",
    "attention_dropout": "dropout in attention (codechat trains without dropout)",
}


def read_config(directory: Path) -> dict[str, Any]:
    """``directory/config.json`` as a dict.

    Raises:
        HFImportError: missing, or not a JSON object.
    """
    f = directory / "config.json"
    if not f.is_file():
        raise HFImportError(f"{f}: missing; a Hugging Face checkpoint needs config.json")
    try:
        cfg = json.loads(f.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HFImportError(f"{f}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise HFImportError(f"{f}: expected a JSON object")
    return cfg


def _rope_theta(cfg: dict[str, Any], where: str) -> float:
    """The RoPE base of ``cfg``; refuses any RoPE variant other than the default."""
    theta = cfg.get("rope_theta")
    for field in ("rope_scaling", "rope_parameters"):  # transformers < 5 / >= 5
        params = cfg.get(field)
        if params is None:
            continue
        if not isinstance(params, dict):
            raise HFImportError(f"{where}: {field}={params!r} is not supported (expected null or a mapping)")
        kind = params.get("rope_type", params.get("type"))
        if kind not in ROPE_DEFAULT:
            raise HFImportError(f"{where}: {field}.rope_type={kind!r} is not supported: codechat implements plain "
                                "RoPE only (rope_type 'default')")
        theta = params.get("rope_theta", theta)
    if theta is None:
        raise HFImportError(f"{where}: no rope_theta")
    return float(theta)


def model_config_from_hf(cfg: dict[str, Any], where: str, vocab_size: int) -> ModelConfig:
    """The :class:`ModelConfig` of HF ``cfg`` (read from ``where``), with ``vocab_size`` embedding rows.

    Raises:
        HFImportError: an architecture other than Llama / Qwen3, or a field of :data:`UNSUPPORTED`
            that is set, named with its value.
    """
    model_type = cfg.get("model_type")
    if model_type not in ARCHITECTURES:
        raise HFImportError(f"{where}: model_type={model_type!r} is not supported; codechat imports "
                            f"{', '.join(ARCHITECTURES)} ({', '.join(a for a, _ in ARCHITECTURES.values())})")
    for field, what in UNSUPPORTED.items():
        if _is_set(cfg.get(field)):
            raise HFImportError(f"{where}: {field}={cfg[field]!r} is not supported ({what})")
    layer_types = cfg.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise HFImportError(f"{where}: layer_types={sorted(set(layer_types))} is not supported (only full_attention)")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise HFImportError(f"{where}: hidden_act={act!r} is not supported (SwiGLU with silu only)")
    try:
        n_embd, n_head = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        return ModelConfig(
            vocab_size=vocab_size, n_layer=int(cfg["num_hidden_layers"]), n_embd=n_embd, n_head=n_head,
            n_kv_head=int(cfg.get("num_key_value_heads") or n_head),
            head_dim=int(cfg.get("head_dim") or n_embd // n_head), intermediate_size=int(cfg["intermediate_size"]),
            max_seq_len=int(cfg["max_position_embeddings"]), rope_theta=_rope_theta(cfg, where),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), qk_norm=ARCHITECTURES[model_type][1],
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            init_std=float(cfg.get("initializer_range", 0.02)))
    except KeyError as e:
        raise HFImportError(f"{where}: field {e.args[0]} is missing") from None
    except ConfigError as e:
        raise HFImportError(f"{where}: {e}") from None


def hf_config(cfg: ModelConfig, *, dtype: str, bos_id: int, eos_id: int) -> dict[str, Any]:
    """``config.json`` for ``Qwen3ForCausalLM`` (``cfg.qk_norm``) or ``LlamaForCausalLM``.

    ``dtype`` is the stored weights' (``"bfloat16"`` or ``"float32"``). Written with the
    transformers 4.x names (``rope_theta``, ``torch_dtype``), which transformers 5 also reads.

    Raises:
        HFExportError: ``cfg`` has an option neither architecture expresses (:func:`check_exportable`).
    """
    check_exportable(cfg)
    model_type = "qwen3" if cfg.qk_norm else "llama"
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURES[model_type][0]], "model_type": model_type,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.n_embd, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_kv_head,
        "head_dim": cfg.head_dim, "hidden_act": "silu", "max_position_embeddings": cfg.max_seq_len,
        "initializer_range": cfg.init_std, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "rope_scaling": None, "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
        "attention_dropout": 0.0, "use_cache": True, "bos_token_id": bos_id, "eos_token_id": eos_id,
        "pad_token_id": eos_id, "torch_dtype": dtype,
    }
    if model_type == "qwen3":
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.n_layer)
    else:
        out.update(mlp_bias=False, pretraining_tp=1)
    return out
