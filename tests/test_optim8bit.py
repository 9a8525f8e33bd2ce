"""``optim.name adamw8bit`` (torchao's 8-bit AdamW, codechat.train.optim8bit) on the CPU: its state bytes,
training and exact resume through the trainer, trainable parameters only, and what it refuses.

The model has two tensor shapes only ((64, 64) matrices, quantized; (64,) norms, fp32 moments): torchao
compiles its step once per shape, so the first test pays two compiles (seconds with a warm cache)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from codechat.config.stages import ConfigError, ModelConfig, OptimConfig, RunConfig, TrainConfig
from codechat.model import build_model
from codechat.train.optim import build_optimizer, set_lr
from codechat.train.optim8bit import BLOCK_SIZE, state_bytes
from codechat.train.trainer import Trainer

pytest.importorskip("torchao.optim")
SQUARE = ModelConfig(vocab_size=64, n_layer=1, n_embd=64, n_head=1, n_kv_head=1, head_dim=64, intermediate_size=64,
                     max_seq_len=64)


class Batches:
    """Random (x, y) micro-batches drawn in order from a seeded generator, with a position."""

    def __init__(self) -> None:
        self.i = 0

    def next_batch(self):
        g = torch.Generator().manual_seed(self.i)
        self.i += 1
        return torch.randint(0, 64, (2, 16), generator=g), torch.randint(0, 64, (2, 16), generator=g)

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, s):
        self.i = s["i"]


def held_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of the moments an optimizer holds: an 8-bit state's codes, scales and table, or the tensor."""
    total = 0
    for s in opt.state.values():
        for t in (s["exp_avg"], s["exp_avg_sq"]):
            parts = (t.codes, t.scale, t.qmap) if hasattr(t, "codes") else (t,)
            total += sum(x.numel() * x.element_size() for x in parts)
    return total


def fit(out: Path, max_steps: int, *, resume: bool = False, save_every: int = 100) -> tuple[Trainer, dict]:
    torch.manual_seed(0)
    t = Trainer(build_model(SQUARE), train=TrainConfig(max_steps=max_steps, log_every=1, eval_every=100,
                                                       save_every=save_every),
                optim=OptimConfig(name="adamw8bit", lr=1e-2, warmup_steps=2, schedule="linear"), batches=Batches(),
                run=RunConfig(out=str(out), resume=resume), out_dir=out, meta={"model": {"shape": "square"}},
                show_progress=False)
    t.fit()
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return t, {r["step"]: r for r in rows if "loss" in r}


def test_state_is_a_quarter_of_adamws_and_what_state_bytes_says():
    torch.manual_seed(0)
    model = build_model(SQUARE)
    opt = build_optimizer(model, OptimConfig(name="adamw8bit"), torch.device("cpu"))
    model(*Batches().next_batch()).backward()
    opt.step()
    assert type(opt).__name__ == "AdamW8bit"
    held = held_bytes(opt)
    assert held == sum(state_bytes(p.numel()) for p in model.parameters())
    n = sum(p.numel() for p in model.parameters())
    assert held < 8 * n / 3  # AdamW's: 8 bytes a parameter; each 4,096-element matrix keeps 2 KiB of tables here
    assert state_bytes(4096) == 2 * (4096 + 4 * 4096 // BLOCK_SIZE + 1024) and state_bytes(64) == 8 * 64
    assert state_bytes(2 ** 24) / 2 ** 24 == pytest.approx(2 + 2 * 4 / 256, rel=1e-3)  # at scale


def test_trains_and_resumes_exactly(tmp_path):
    full, rows = fit(tmp_path / "full", 6)
    assert rows[6]["loss"] < rows[1]["loss"]
    fit(tmp_path / "cut", 3, save_every=3)  # stops at step 3 with a checkpoint
    resumed, after = fit(tmp_path / "cut", 6, resume=True)
    for step in range(4, 7):
        assert after[step]["lr"] == rows[step]["lr"] and after[step]["loss"] == rows[step]["loss"]
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    s = resumed.optimizer.state[resumed.model.lm_head.weight]["exp_avg"]
    assert type(s).__name__ == "OptimState8bit"  # the resumed moments are still 8-bit


def test_only_trainable_parameters_get_state_and_change():
    """As under LoRA: a frozen parameter (requires_grad False) has no state and keeps its bits."""
    torch.manual_seed(0)
    model = build_model(SQUARE)
    frozen = [p for n, p in model.named_parameters() if "mlp" not in n]
    for p in frozen:
        p.requires_grad_(False)
    before = [p.clone() for p in model.parameters()]
    opt = build_optimizer(model, OptimConfig(name="adamw8bit", lr=1e-2), torch.device("cpu"))
    model(*Batches().next_batch()).backward()
    opt.step()
    assert len(opt.state) == 3  # gate, up, down
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b) == (not p.requires_grad)


def test_set_lr_writes_into_the_groups_lr_tensor():
    model = build_model(SQUARE)
    opt = build_optimizer(model, OptimConfig(name="adamw8bit", head_lr_mult=2.0), torch.device("cpu"))
    set_lr(opt, 0.5)
    assert [float(g["lr"]) for g in opt.param_groups] == [0.5, 0.5, 0.5, 1.0]  # decay, no decay, embedding, head
    assert all(isinstance(g["lr"], torch.Tensor) for g in opt.param_groups)  # torchao's step needs a tensor


def test_unsupported_device_and_bad_name_are_one_line_errors():
    model = build_model(SQUARE)
    with pytest.raises(ConfigError, match="optim.name adamw8bit runs on CUDA and CPU .*not on mps; use --optim.name "
                                          "adamw"):
        build_optimizer(model, OptimConfig(name="adamw8bit"), torch.device("mps"))
    with pytest.raises(ConfigError, match="optim.name must be one of adamw, muon, adamw8bit, got 'adam8'"):
        OptimConfig(name="adam8")


def test_a_sharded_checkpoints_template_holds_8bit_state_and_keeps_the_lr():
    """What a resume from a sharded checkpoint reads into (one step of LR 0 creates the state)."""
    from codechat.parallel.state import whole_template
    model = build_model(SQUARE)
    opt = build_optimizer(model, OptimConfig(name="adamw8bit", lr=1e-2), torch.device("cpu"))
    before = [p.clone() for p in model.parameters()]
    t = whole_template(model, opt)
    assert set(t["optim"]) == {n for n, _ in model.named_parameters()}
    assert type(t["optim"]["lm_head.weight"]["exp_avg"]).__name__ == "OptimState8bit"
    assert [float(g["lr"]) for g in opt.param_groups] == pytest.approx([1e-2] * len(opt.param_groups))
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
