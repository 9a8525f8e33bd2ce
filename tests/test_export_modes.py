"""Exports keep the file mode a plain ``open()`` gives (``0o666 & ~umask``): safetensors writes its
files ``0o600``, and ``write_dir`` (codechat.config.atomic) sets the usual mode on every file of
the directory before it is renamed into place. Real ``codechat export`` subprocesses, both formats,
under two umasks."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from codechat import checkpoint as ckpt
from codechat.config.atomic import current_umask, write_dir
from codechat.config.stages import ModelConfig, to_dict
from codechat.model import build_model


@pytest.fixture(scope="module")
def stage(tok, tok_dir, tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, n_layer=1, n_embd=32, n_head=2, n_kv_head=1,
                                    max_seq_len=64))
    root = tmp_path_factory.mktemp("export-modes")
    return ckpt.save(root / "sft" / "checkpoints", 3, model=model.state_dict(),
                     state={"step": 3, "meta": {"stage": "sft", "model": to_dict(model.cfg)}},
                     tokenizer_dir=tok_dir).parent.parent


def modes(root: Path) -> dict[str, int]:
    """Permission bits of every file under ``root``, by relative path."""
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_every_exported_file_has_the_mode_a_plain_open_gives(stage, tmp_path, umask, mode):
    for fmt in ("codechat", "hf"):
        out = tmp_path / fmt
        p = subprocess.run([sys.executable, "-m", "codechat", "export", "--model", str(stage), "--out", str(out),
                            "--format", fmt], capture_output=True, text=True, timeout=300,
                           preexec_fn=lambda: os.umask(umask))
        assert p.returncode == 0, p.stderr
        found = modes(out)
        assert "model.safetensors" in found and len(found) >= (3 if fmt == "codechat" else 6), found
        assert found == dict.fromkeys(found, mode), (fmt, {k: oct(v) for k, v in found.items()})


def test_write_dir_gives_private_files_the_usual_mode_and_keeps_executables_executable(tmp_path):
    mask = current_umask()
    with write_dir(tmp_path / "out") as tmp:
        private = tmp / "private.bin"
        private.write_bytes(b"x")
        private.chmod(0o600)  # as safetensors and tempfile.mkstemp create their files
        script = tmp / "sub" / "run.sh"
        script.parent.mkdir()
        script.write_text("#!/bin/sh\n")
        script.chmod(0o700)
    assert modes(tmp_path / "out") == {"private.bin": 0o666 & ~mask, "sub/run.sh": 0o777 & ~mask}
    assert current_umask() == mask  # reading it changed nothing
