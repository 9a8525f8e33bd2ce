"""LoRA on two gloo ranks (``torchrun --nproc_per_node 2`` on 127.0.0.1): ``codechat sft --peft lora`` under DDP
and under FSDP2 (the frozen base sharded, activation checkpointing on) trains like one process with the same
global batch, and FSDP's sharded checkpoint (the adapters only) loads and resumes in one process."""
from __future__ import annotations

import pytest
import torch

from codechat import checkpoint as ckpt
from test_lora import data, save_base  # noqa: F401 (data: a fixture)
from test_parallel import TORCHRUN, losses, run


@pytest.fixture(scope="module")
def base(tok, tok_dir, tmp_path_factory):
    return save_base(tmp_path_factory.mktemp("lora_parallel") / "base", tok, tok_dir)


def test_lora_under_ddp_and_fsdp_on_two_ranks_trains_like_one_process_and_resumes_in_one(base, data, tok, tmp_path):
    common = ["sft", "--init", str(base), "--data", str(data), "--device", "cpu", "--train.log_every", "1",
              "--sft.decontaminate", "false", "--sft.max_length", "64", "--peft", "lora", "--lora.rank", "4",
              "--optim.lr", "1e-2", "--optim.schedule", "constant", "--optim.warmup_steps", "0"]
    one = run(common + ["--out", str(tmp_path / "one"), "--max-steps", "4", "--train.micro_batch_size", "8"])
    assert one.returncode == 0, one.stderr[-3000:]
    ddp = run(common + ["--out", str(tmp_path / "ddp"), "--max-steps", "3", "--train.micro_batch_size", "4",
                        "--parallel", "ddp"], TORCHRUN)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    fsdp = run(common + ["--out", str(tmp_path / "fsdp"), "--max-steps", "3", "--train.micro_batch_size", "4",
                         "--parallel", "fsdp", "--ac", "full"], TORCHRUN)
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    ref = losses(tmp_path / "one")
    assert len(ref) == 4 and ref[-1] < ref[0]
    for name in ("ddp", "fsdp"):
        assert losses(tmp_path / name) == pytest.approx(ref[:3], rel=1e-5, abs=1e-5), name
    sharded = ckpt.resolve(tmp_path / "fsdp")
    assert ckpt.is_sharded(sharded)
    assert all(".lora_" in k for k in ckpt.load(sharded)["model"])  # the adapters only: the base is named
    ids = torch.tensor([tok.encode("def add(a, b):\n    return a + b\n")[:24]])
    with torch.no_grad():
        assert torch.allclose(ckpt.load_model(sharded)[0](ids), ckpt.load_model(tmp_path / "ddp")[0](ids), atol=1e-5)
    resumed = run(common + ["--out", str(tmp_path / "fsdp"), "--max-steps", "4", "--train.micro_batch_size", "8",
                            "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert losses(tmp_path / "fsdp") == pytest.approx(ref, rel=1e-5, abs=1e-5)
