"""Configuration: validation messages that name the setting, YAML + CLI overrides, round trip."""
from __future__ import annotations

import pytest
import yaml

from codechat.config.stages import (ConfigError, DataConfig, ModelConfig, OptimConfig, PretrainConfig, TrainConfig,
                                    load, parse_overrides, preset, pretrain_recipe, save_yaml)
from codechat.config.sft import SFTConfig, SFTStageConfig


@pytest.mark.parametrize("make,match", [
    (lambda: ModelConfig(n_head=6, n_kv_head=4), "model.n_head .* multiple of model.n_kv_head"),
    (lambda: ModelConfig(n_embd=100, n_head=3, n_kv_head=3), "model.n_embd .* not divisible"),
    (lambda: DataConfig(vocab_size=100), "data.vocab_size=100 .* byte tokens"),
    (lambda: DataConfig(src=("/no/such/dir",)), "/no/such/dir"),
    (lambda: OptimConfig(lr=-1), "optim.lr"),
    (lambda: OptimConfig(schedule="step"), "optim.schedule"),
    (lambda: OptimConfig(name="sgd"), "optim.name must be one of adamw, muon, adamw8bit"),
    (lambda: TrainConfig(max_steps=0, time_budget_s=0), "none of train.max_steps, train.time_budget_s, train.epochs"),
    (lambda: TrainConfig(micro_batch_size=0), "train.micro_batch_size"),
    (lambda: TrainConfig(max_steps=1, micro_batch_size=3, batch_size=8), "train.batch_size=8 does not divide"),
    (lambda: PretrainConfig(model=ModelConfig(max_seq_len=128), data=DataConfig(seq_len=256)),
     "data.seq_len=256 is over the model's limit"),
    (lambda: PretrainConfig(model=preset("tiny"), train=TrainConfig(max_steps=1, pp=6, micro_batch_size=6)),
     "--pp 6 stages for a model of 4 layers"),
    (lambda: TrainConfig(max_steps=1, pp=2, micro_batch_size=3), "train.pp_microbatches=2 does not divide"),
    (lambda: TrainConfig(max_steps=1, pp=4, pp_microbatches=2, micro_batch_size=4), "1f1b needs train.pp_micro"),
    (lambda: TrainConfig(max_steps=1, pp=2, pp_schedule="zb"), "train.pp_schedule must be one of gpipe, 1f1b"),
    (lambda: SFTStageConfig(sft=SFTConfig(packing=True), train=TrainConfig(epochs=1, pp=2)), "--packing with --pp"),
])
def test_invalid_settings_fail_at_construction_naming_the_setting(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_yaml_then_cli_overrides_then_round_trip(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"optim": {"lr": 0.01}, "train": {"max_steps": 7}}))
    over = parse_overrides(["--optim.lr", "3e-4", "--train.compile=true", "--data.extensions", ".py,.pyi"])
    cfg = load(PretrainConfig, f, over, base=pretrain_recipe("tiny"))
    assert (cfg.optim.lr, cfg.train.max_steps, cfg.train.compile) == (3e-4, 7, True)
    assert cfg.data.extensions == (".py", ".pyi")
    assert cfg.model.n_layer == pretrain_recipe("tiny").model.n_layer
    save_yaml(cfg, tmp_path / "out.yaml")
    assert load(PretrainConfig, tmp_path / "out.yaml") == cfg


def test_overriding_a_shape_derives_head_dim_and_mlp_width_again(tmp_path):
    base = pretrain_recipe("tiny")  # 2 heads of 48, MLP 256
    assert (base.model.head_dim, base.model.intermediate_size) == (48, 256)
    heads = load(PretrainConfig, None, {"model.n_head": "4", "model.n_kv_head": "4"}, base=base).model
    assert heads.head_dim == 24  # not the preset's stale 48 (4 heads of 48: a bigger model than asked for)
    wide = load(PretrainConfig, None, {"model.n_embd": "128"}, base=base).model
    assert (wide.head_dim, wide.intermediate_size) == (64, 384)
    both = load(PretrainConfig, None, {"model.n_head": "4", "model.head_dim": "48"}, base=base).model
    assert both.head_dim == 48  # set together: kept
    save_yaml(base, tmp_path / "saved.yaml")  # a saved config lists the derived values
    assert load(PretrainConfig, tmp_path / "saved.yaml", base=base).model.head_dim == 48
    assert load(PretrainConfig, tmp_path / "saved.yaml", {"model.n_head": "4", "model.n_kv_head": "4"},
                base=base).model.head_dim == 24


@pytest.mark.parametrize("over,match", [
    ({"optim.lrr": "1"}, "unknown setting --optim.lrr"),
    ({"train.max_steps": "ten"}, "train.max_steps: cannot read 'ten'"),
    ({"train.compile": "maybe"}, "expected true/false"),
])
def test_bad_overrides_are_named(over, match):
    with pytest.raises(ConfigError, match=match):
        load(PretrainConfig, None, over)


def test_bad_yaml_is_named(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("optim: {lr: [")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load(PretrainConfig, f)
    f.write_text("optimizer: {lr: 1}")
    with pytest.raises(ConfigError, match="unknown setting 'optimizer'"):
        load(PretrainConfig, f)


def test_batch_size_sets_grad_accum_per_rank():
    t = TrainConfig(max_steps=1, micro_batch_size=4, batch_size=32)
    assert (t.accum_steps(1), t.accum_steps(2), t.accum_steps(8)) == (8, 4, 1)
    with pytest.raises(ConfigError, match="multiple of 12"):
        t.accum_steps(3)


def budgets(cfg: SFTConfig) -> tuple[int, int]:
    return cfg.max_length, cfg.max_prompt_length


def test_sft_budgets_follow_the_model_unless_set(tmp_path):
    tiny = preset("tiny").max_seq_len  # 512: the default no longer asks for 1024
    assert budgets(SFTConfig().for_model(tiny)) == (512, 384)  # the prompt gets prompt_share (0.75)
    assert budgets(SFTConfig(prompt_share=0.5).for_model(tiny)) == (512, 256)
    assert budgets(SFTConfig(max_prompt_length=100).for_model(tiny)) == (512, 100)
    assert budgets(SFTConfig(max_length=256).for_model(tiny)) == (256, 192)  # an explicit length wins
    with pytest.raises(ConfigError, match=r"sft.max_length=1024 is over the model's limit max_seq_len=512 "
                                          r"\(runs/x\); lower --sft.max_length to at most 512"):
        SFTConfig(max_length=1024).for_model(tiny, "runs/x")
    with pytest.raises(ConfigError, match="max_prompt_length=600 leaves no tokens .* max_seq_len=512"):
        SFTConfig(max_prompt_length=600).for_model(tiny)
    with pytest.raises(ConfigError, match="sft.prompt_share must be in"):
        SFTConfig(prompt_share=1.0)
    cfg = load(SFTStageConfig, None, {"sft.max_length": "256"})  # --sft.max_length alone derives the prompt budget
    assert budgets(cfg.sft) == (256, 192)
    save_yaml(cfg, tmp_path / "sft.yaml")  # a saved config lists both; a new length derives the prompt again
    assert budgets(load(SFTStageConfig, tmp_path / "sft.yaml", {"sft.max_length": "128"}).sft) == (128, 96)


def test_pipeline_stages_split_the_blocks_evenly_and_refuse_more_stages_than_blocks():
    from codechat.parallel.pipeline import stage_blocks
    assert [list(stage_blocks(10, 4, s)) for s in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    with pytest.raises(ConfigError, match="--pp 5 stages for a model of 4 layers"):
        stage_blocks(4, 5, 0)
