"""Messages of the SFT and corpus stages reach the user as one log line each (``codechat: warning:
TEXT``, no Python warning with its source line), and "decontamination does not check MBPP" is said
only when some source could hold copies of MBPP's test problems: not for pairs mined from Python
source (``mine:`` or the files the speedrun's background miner writes)."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import torch

from codechat import checkpoint as ckpt
from codechat.config.sft import SFTConfig
from codechat.config.stages import ModelConfig, to_dict
from codechat.data.mining import write_mined
from codechat.data.mixture import Mixture
from codechat.data.provenance import third_party_sources
from codechat.model import build_model

FUNCTIONS = "".join(f'def f{i}(x):\n    """Return x plus {i}, the number {i} added to the value x given."""\n'
                    f'    return x + {i}\n\n\n' for i in range(6))
ALPACA = [{"instruction": f"Write a function that adds {i} to x.", "input": "",
           "output": f"def add(x):\n    return x + {i}"} for i in range(4)]


def sources(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``(source dir, mined-pairs file, Alpaca file)``."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "funcs.py").write_text(FUNCTIONS)
    mined = tmp_path / "sft_mined" / "0.jsonl"
    write_mined([src], [mined])
    alpaca = tmp_path / "alpaca.json"
    alpaca.write_text(json.dumps(ALPACA))
    return src, mined, alpaca


def mbpp_messages(cfg: SFTConfig, caplog) -> list[str]:
    caplog.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no Python warning at all: they are log records now
        Mixture.from_config(cfg)
    return [r.message for r in caplog.records if "MBPP" in r.message]


def test_mbpp_is_mentioned_only_for_sources_it_matters_for(tmp_path, caplog):
    src, mined, alpaca = sources(tmp_path)
    assert json.loads(mined.read_text().splitlines()[0])["id"].endswith("funcs.py:1")
    caplog.set_level(logging.WARNING, logger="codechat")
    assert mbpp_messages(SFTConfig(data=f"mine:{src}"), caplog) == []
    assert mbpp_messages(SFTConfig(data=f"{mined}#completion"), caplog) == []
    assert mbpp_messages(SFTConfig(data=f"{mined}#completion:1,{alpaca}:0"), caplog) == []  # weight 0: not drawn
    [msg] = mbpp_messages(SFTConfig(data=f"mine:{src},{alpaca}:0.5"), caplog)
    assert msg == (f"decontamination does not check MBPP's test problems for {alpaca}: give the MBPP file as "
                   "--sft.decontam_mbpp PATH/mbpp.jsonl")
    assert caplog.records[-1].name == "codechat.data.decontam" and caplog.records[-1].levelno == logging.WARNING
    cfg = SFTConfig(data=f"{mined}#completion,{alpaca},hf:org/name")
    assert third_party_sources(cfg.data, cfg) == [str(alpaca), "hf:org/name"]


def test_the_corpus_command_says_it_in_one_line(tmp_path, tok_dir, write_corpus):
    src = write_corpus(tmp_path / "code", {"train": [FUNCTIONS], "val": [FUNCTIONS.replace("plus", "and")]}, 0.5)
    p = subprocess.run([sys.executable, "-m", "codechat", "data", "corpus", "--src", str(src), "--tokenizer",
                        str(tok_dir), "--out", str(tmp_path / "data"), "--decontaminate", "--val-fraction", "0.5"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    said = [line for line in p.stderr.splitlines() if "warn" in line.lower() or "MBPP" in line]  # not progress bars
    assert "UserWarning" not in p.stderr and said == [f"codechat: warning: decontamination does not check MBPP's test problems for "
                                     f"{src}: give the MBPP file as --sft.decontam_mbpp PATH/mbpp.jsonl"]


def test_sft_on_mined_pairs_prints_no_warning(tmp_path, tok, tok_dir):
    src, mined, _ = sources(tmp_path)
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, n_layer=1, n_embd=32, n_head=2, n_kv_head=1,
                                    max_seq_len=128))
    init = ckpt.save(tmp_path / "pretrain" / "checkpoints", 0, model=model.state_dict(),
                     state={"step": 0, "meta": {"stage": "pretrain", "model": to_dict(model.cfg)}},
                     tokenizer_dir=tok_dir).parent.parent
    p = subprocess.run([sys.executable, "-m", "codechat", "sft", "--device", "cpu", "--init", str(init),
                        "--data", f"{mined}#completion,mine:{src}", "--out", str(tmp_path / "sft"), "--max-steps",
                        "1", "--train.micro_batch_size", "2"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "done: step 1" in p.stdout
    assert "warning" not in p.stderr.lower() and "MBPP" not in p.stderr, p.stderr
