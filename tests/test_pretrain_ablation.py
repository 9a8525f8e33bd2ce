"""The pretraining ablation harness (benchmarks/pretrain_ablation.py, issue 32) on the CPU: variants named or
spelled out, the trainer's clock that leaves the compiling first step out of an equal time budget, and one
small run of two variants end to end (shards built as the speedrun builds them, then reused)."""
from __future__ import annotations

import json
import math
import sysconfig
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import benchmark_module

from codechat.config.stages import ConfigError, ModelConfig, OptimConfig, RunConfig, TrainConfig
from codechat.data.corpus import read_split
from codechat.data.windows import eval_windows
from codechat.model import build_model
from codechat.train.trainer import Trainer


@pytest.fixture(scope="module")
def ablation():
    with benchmark_module("pretrain_ablation") as module:
        yield module


def test_variants_are_named_or_spelled_out_and_may_not_touch_the_equal_budget(ablation):
    assert ablation.parse_variant("relu2") == ("relu2", {"model.mlp_act": "relu2"})
    assert ablation.parse_variant("lr:optim.lr=3e-3,model.logit_softcap=15") == (
        "lr", {"optim.lr": "3e-3", "model.logit_softcap": "15"})
    with pytest.raises(ConfigError, match="unknown variant 'nope'"):
        ablation.parse_variant("nope")
    with pytest.raises(ConfigError, match="not SECTION.FIELD=VALUE"):
        ablation.parse_variant("x:lr=3")
    with pytest.raises(ConfigError, match="train.time_budget_s is set by the harness"):
        ablation.parse_variant("x:train.time_budget_s=5")
    with pytest.raises(ConfigError, match="--pretrain.train.compile is set by the harness"):
        ablation.main(["--pretrain.train.compile", "false"])


class SlowFirstBatch:
    """Random (2, 8) batches; the first takes ``delay`` seconds, as a compiling first step does."""

    def __init__(self, delay: float) -> None:
        self.delay, self.n = delay, 0

    def next_batch(self):
        if self.n == 0:
            time.sleep(self.delay)
        self.n += 1
        t = torch.randint(0, 32, (2, 9))
        return t[:, :-1], t[:, 1:]

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, state):
        self.n = state["n"]


@pytest.mark.parametrize("after_first", [False, True], ids=["counted", "left-out"])
def test_the_first_steps_time_is_left_out_of_the_budget_only_when_asked(after_first, tmp_path):
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=32, n_layer=1, n_embd=16, n_head=2, n_kv_head=2, max_seq_len=16))
    trainer = Trainer(model, train=TrainConfig(time_budget_s=0.3, micro_batch_size=2, log_every=10**6,
                                               eval_every=10**6, save_every=10**6),
                      optim=OptimConfig(warmup_steps=0), run=RunConfig(out=str(tmp_path), device="cpu"),
                      batches=SlowFirstBatch(0.6), out_dir=tmp_path, show_progress=False,
                      budget_after_first_step=after_first)
    out = trainer.fit()
    assert out["first_step_s"] >= 0.6
    if after_first:  # the 0.6 s step is outside the 0.3 s budget: more steps follow it, for 0.3 s
        assert out["step"] > 1 and out["elapsed_s"] - out["first_step_s"] >= 0.3
        assert trainer.untimed_s == out["first_step_s"] and trainer.budget_s_used() >= 0.3
    else:  # today's clock: the first step alone spends the budget
        assert out["step"] == 1 and trainer.untimed_s == 0.0


def source_files(root: Path, n: int = 30, chars: int = 6000) -> Path:
    """``n`` standard-library modules cut to ``chars`` characters: a corpus that builds in seconds."""
    root.mkdir()
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:n]:
        (root / f.name).write_text(f.read_text(encoding="utf-8")[:chars], encoding="utf-8")
    return root


def test_two_variants_train_equally_long_on_the_same_shards_and_are_scored_on_the_whole_val_split(
        ablation, tmp_path, capsys):
    src, work, out = source_files(tmp_path / "src"), tmp_path / "work", tmp_path / "ablation.json"
    small = ["--device", "cpu", "--src", str(src), "--work", str(work), "--train-s", "1",
             "--pretrain.data.vocab_size", "300", "--pretrain.data.val_fraction", "0.2",
             "--pretrain.model.n_layer", "1", "--pretrain.model.n_embd", "32", "--pretrain.data.seq_len", "64",
             "--pretrain.train.eval_tokens", "1024"]
    report = ablation.main([*small, "--variants", "relu2", "--json", str(out)])
    printed = capsys.readouterr().out
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["preset"] == "tiny" and not report["shards"]["reused"]
    base, relu2 = report["variants"]
    assert (base["name"], base["settings"], relu2["name"], relu2["settings"]) == (
        "baseline", {}, "relu2", {"model.mlp_act": "relu2"})
    assert (base["model"]["mlp_act"], relu2["model"]["mlp_act"]) == ("swiglu", "relu2")
    assert relu2["model"]["intermediate_size"] == 4 * 32 and relu2["model"]["n_layer"] == 1  # --pretrain.* for all
    data_dir = Path(report["baseline_config"]["data"]["data_dir"])
    val_tokens = eval_windows(read_split(data_dir, "val"), 64)[:, 1:].numel()
    for r in (base, relu2):
        assert r["train_s"] >= 1.0 and r["steps"] >= 2  # 1 s after the first step, whatever it cost
        assert math.isfinite(r["val_bpb"]) and 0 < r["val_bpb"] < 12
        assert r["val_tokens"] == val_tokens  # every val window, not the trainer's sample
        cfg = yaml.safe_load((work / "runs" / r["name"] / "config.yaml").read_text())
        assert (cfg["run"]["seed"], cfg["data"]["data_dir"], cfg["train"]["time_budget_s"]) == (1337, str(data_dir), 1.0)
        assert not (work / "runs" / r["name"] / "checkpoints").exists()  # deleted after scoring
    assert "| relu2 | model.mlp_act=relu2 |" in printed and f"{relu2['val_bpb'] - base['val_bpb']:+.4f}" in printed

    # again: the shards are reused, and a limit that no run fits starts none (each says why)
    again = ablation.main([*small, "--variants", "zero_init", "--stop-after-s", "1", "--json", str(out)])
    assert again["shards"]["reused"]
    assert [r["error"] for r in again["variants"]] == ["not run: would end after --stop-after-s 1"] * 2

    # --steps: equal steps; the same settings give the same losses (gap 0), another LR a gap, at logged steps > 10
    steps = ablation.main([*small, "--steps", "30", "--loss-after", "10", "--variant", "same:optim.lr=1e-2",
                           "--variant", "lr:optim.lr=3e-3", "--pretrain.optim.lr", "1e-2"])
    base, same, lr = steps["variants"]
    assert [r["steps"] for r in steps["variants"]] == [30, 30, 30]
    assert same["loss_gap_vs_baseline"] == {"max_rel_gap": 0.0, "at_step": 30, "windows_compared": 2, "window": 10,
                                            "max_step_rel_gap": 0.0, "at_single_step": 30, "after_step": 10}
    assert len([r for r in base["rows"] if "tokens_per_s" in r]) == 30  # every step logged
    assert lr["loss_gap_vs_baseline"]["max_step_rel_gap"] >= lr["loss_gap_vs_baseline"]["max_rel_gap"] > 0.001
    assert "same: loss within 0.00% of the baseline's over every 10-step window after step 10" in capsys.readouterr().out

    # a variant with document quality bands trains on shards of its own: same tokenizer, same val split
    q = ablation.main([*small, "--no-baseline", "--variant", "qfilter:data.quality=filter"])
    (qf,) = q["variants"]
    assert q["shards"]["reused"] and qf["val_tokens"] == base["val_tokens"]
    (own,) = [d for d in work.iterdir() if d.name.startswith("data-filter-")]
    index = json.loads((own / "index.json").read_text())
    assert index["quality"]["mode"] == "filter" and index["tokenizer"] == str((work / "tokenizer").resolve())
    assert index["splits"]["train"]["tokens"] < json.loads((work / "data" / "index.json").read_text())[
        "splits"]["train"]["tokens"]  # test files at half weight, generated files and data tables dropped


def test_loss_gap_compares_window_means_and_single_steps(ablation):
    ref = [{"step": s, "loss": 2.0, "tokens_per_s": 1.0} for s in range(1, 31)]
    # +2% at step 25 alone, -1% at step 26: one step's gap 2%, the window 21-30's mean 0.1%
    rows = [{**r, "loss": {25: 2.04, 26: 1.98}.get(r["step"], 2.0)} for r in ref]
    gap = ablation.loss_gap(rows, ref, after=10)
    assert gap == pytest.approx({"max_rel_gap": 0.001, "at_step": 30, "windows_compared": 2, "window": 10,
                                 "max_step_rel_gap": 0.02, "at_single_step": 25, "after_step": 10})
    assert ablation.loss_gap(rows, ref, after=25) is None  # no complete window after step 25
