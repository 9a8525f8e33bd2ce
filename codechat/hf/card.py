"""The ``README.md`` model card of an export: architecture, training stages, data and licences, evaluations.

Everything comes from the run on disk (:func:`stages`): the exported checkpoint's ``state.json``, then
the checkpoint its ``meta.init`` names, and so on back to pretraining (or to an imported Hugging
Face model); each stage's directory gives its ``data_report.json`` (SFT sources), its run
directory ``metrics.json`` (a speedrun's licences) and ``eval/*/results.json`` (pass@k). A data
source's licence is the speedrun's statement when there is one, else :data:`KNOWN_LICENSES` by name,
else "unknown". A model trained on data with a non-commercial licence (Code Alpaca's CC BY-NC 4.0)
inherits it, and the card says so first.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from codechat.config.stages import default_corpus_dirs

#: Licences of the data sets codechat's documentation uses, by a name fragment (lower case).
KNOWN_LICENSES: dict[str, str] = {
    "code_alpaca": "CC BY-NC 4.0 (non-commercial)", "codealpaca": "CC BY-NC 4.0 (non-commercial)",
    "mbpp": "CC BY 4.0", "glaive": "Apache-2.0", "gsm8k": "MIT", "humaneval": "MIT",
    "stdlib": "PSF License", "python3": "PSF License",
}
NON_COMMERCIAL = "non-commercial"
MAX_STAGES = 16  # a loop in meta.init would otherwise never end


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def license_of(source: str) -> str:
    """:data:`KNOWN_LICENSES` entry of a data source's name or path, or ``"unknown: check the source"``."""
    low = source.lower()
    return next((v for k, v in KNOWN_LICENSES.items() if k in low), "unknown: check the source")


def stages(ckpt_dir: Path) -> list[dict[str, Any]]:
    """The stages that made ``ckpt_dir``, first stage first: ``{"stage", "step", "dir", "sources", "evals", "licenses"}``.

    ``sources`` are ``(name, licence)`` pairs of the stage's training data; ``evals`` the
    ``results.json`` of its run directory; ``licenses`` a speedrun's own statement (``metrics.json``).
    """
    out: list[dict[str, Any]] = []
    d: Path | None = ckpt_dir
    for _ in range(MAX_STAGES):
        if d is None or not (d / "state.json").is_file():
            break
        state = _json(d / "state.json")
        source = Path(state.get("exported_from") or "")
        if state.get("exported_from") and (source / "state.json").is_file():
            d = source  # an export: the stage's own checkpoint knows its run directory
            continue
        meta = state.get("meta", {})
        stage_dir = d.parent.parent if d.parent.name == "checkpoints" else d
        run_dir = stage_dir.parent
        speedrun = _json(run_dir / "metrics.json").get("licenses", {})
        out.append({"stage": meta.get("stage", "?"), "step": state.get("step"), "dir": str(stage_dir),
                    "sources": _sources(meta, stage_dir, speedrun), "licenses": speedrun,
                    "evals": [r for f in sorted(run_dir.glob("eval/*/results.json")) if (r := _json(f))]})
        d = Path(meta["init"]) if meta.get("init") else None
    return out[::-1]


def _sources(meta: dict[str, Any], stage_dir: Path, speedrun: dict[str, str]) -> list[tuple[str, str]]:
    cfg = meta.get("config", {})
    stage = meta.get("stage")
    if stage == "hf_import":
        return [(f"imported weights: {meta.get('source')}", "the model's own licence (see its model card)")]
    if stage == "pretrain":
        data = cfg.get("data", {})
        index = _json(Path(data["data_dir"]) / "index.json") if data.get("data_dir") else {}
        names = [str(s) for s in index.get("sources") or data.get("src") or default_corpus_dirs()]
        lic = speedrun.get("pretraining corpus")
    elif stage in ("sft", "funcall"):
        report = _json(stage_dir / "data_report.json")
        names = [s["source"] for s in report.get("sources", [])] or [cfg.get("sft", {}).get("data") or "mined pairs"]
        lic = speedrun.get("SFT data") if not cfg.get("sft", {}).get("data") else None
    elif stage == "rl":
        names, lic = [str(cfg.get("rl", {}).get("tasks", "doctest"))], None
    else:
        return []
    return [(n, lic or license_of(n if n != "mined pairs" else "stdlib")) for n in names]


def _eval_line(r: dict[str, Any]) -> str:
    scores = ", ".join(f"{k} {v:.2%}" for k, v in r.get("pass@k", {}).items())
    return f"| {r.get('suite', '?')} | {r.get('problems', '?')} x {r.get('n', '?')} | {scores} | {r.get('model', '?')} |"


def model_card(name: str, cfg: dict[str, Any], hf_cfg: dict[str, Any], ckpt_dir: Path, params: int) -> str:
    """Markdown of the model card of run ``name`` (``cfg``: codechat's model config, ``hf_cfg`` the
    written ``config.json``) from the run behind ``ckpt_dir``."""
    chain = stages(ckpt_dir)
    sources = [s for st in chain for s in st["sources"]]
    nc = sorted({n for n, lic in sources if NON_COMMERCIAL in lic.lower()})
    last = chain[-1] if chain else {"stage": "?", "step": "?"}
    lines = [f"# {name} ({last['stage']}, step {last['step']})", ""]
    if nc:
        lines += [f"**Licence: non-commercial use only.** Trained on {', '.join(nc)}, whose licence forbids "
                  "commercial use; the model inherits it.", ""]
    lines += ["A code-chat model trained with codechat and exported for `transformers`.", "",
              "## Model", "",
              f"`{hf_cfg['architectures'][0]}`: {cfg['n_layer']} layers, width {cfg['n_embd']}, {cfg['n_head']} heads "
              f"({cfg['n_kv_head']} key/value), head dim {cfg['head_dim']}, MLP {cfg['intermediate_size']}, "
              f"vocabulary {cfg['vocab_size']}, context {cfg['max_seq_len']}, RoPE theta {cfg['rope_theta']:g}, "
              f"{'tied' if cfg['tie_embeddings'] else 'untied'} head, {'with' if cfg['qk_norm'] else 'without'} "
              f"QK-norm; {params:,} parameters; weights in {hf_cfg['torch_dtype']}.", "",
              "## Use", "", "```python",
              "from transformers import AutoModelForCausalLM, AutoTokenizer",
              "tok = AutoTokenizer.from_pretrained(PATH)",
              "model = AutoModelForCausalLM.from_pretrained(PATH)",
              'ids = tok.apply_chat_template([{"role": "user", "content": "Reverse a list in Python."}],',
              "                              add_generation_prompt=True, return_tensors='pt', return_dict=True)",
              "out = model.generate(**ids, max_new_tokens=128, do_sample=False)",
              "print(tok.decode(out[0, ids['input_ids'].shape[1]:], skip_special_tokens=True))", "```", "",
              "The chat template is codechat's chat format (`codechat.chat.render`), tools and function calls "
              "included; generation ends at `<|end|>` (the EOS of `generation_config.json`). transformers "
              "matches special-token spellings typed in text (`<|end|>`) as control tokens; pass "
              "`split_special_tokens=True` to encode untrusted text as codechat does.", "",
              "## Training stages", "", "| stage | step | directory |", "| --- | --- | --- |"]
    lines += [f"| {st['stage']} | {st['step']} | `{st['dir']}` |" for st in chain]
    lines += ["", "## Data sources and licences", "", "| stage | source | licence |", "| --- | --- | --- |"]
    lines += [f"| {st['stage']} | {n} | {lic} |" for st in chain for n, lic in st["sources"]]
    evals = [r for st in chain for r in st["evals"]]
    lines += ["", "## Evaluation", ""]
    if evals:
        lines += ["| suite | problems x samples | pass@k | model |", "| --- | --- | --- | --- |"]
        lines += [_eval_line(r) for r in evals]
    else:
        lines += ["No evaluation results were found beside the run (`codechat eval run --out RUN/eval/SUITE`)."]
    return "\n".join(lines) + "\n"
