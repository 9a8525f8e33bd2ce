"""The memory planner (`codechat plan`, codechat.train.plan): counts against the real model and
optimizer, the seed's table, the logits at large vocabularies, layouts, bad input and the CLI."""
from __future__ import annotations

import logging
import re
import warnings
from dataclasses import replace

import pytest
import torch
from conftest import saved_for_backward

from codechat.cli import main
from codechat.config.stages import ConfigError, ModelConfig, OptimConfig, preset
from codechat.model import GPT, Block, rope_tables
from codechat.train.optim import build_optimizer
from codechat.train.plan import GIB, PlanConfig, activation_bytes, estimate, fits, param_counts, recommend
from codechat.train.plan_check import check_training_memory, print_plan, warn_if_exceeds

#: The seed system's settings: micro-batch 1 x 2048, checkpointing on, bf16 weights and
#: gradients, fp32 master copy and fp32 AdamW m and v (16 bytes per parameter).
SEED = dict(micro_batch_size=1, seq_len=2048, ac="full", param_bytes=2, grad_bytes=2, master_bytes=4,
            gpu_mem_gib=80.0)
SMALL = ModelConfig(vocab_size=512, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, intermediate_size=160,
                    max_seq_len=128)


def states(e) -> float:
    return e.weights + e.grads + e.optimizer + e.master


@pytest.mark.parametrize("cfg", [preset("tiny"), preset("d12"), preset("2b"), preset("8b"),
                                 preset("d12", tie_embeddings=True, qk_norm=False), SMALL])
def test_param_count_equals_the_model_built_on_meta(cfg):
    with torch.device("meta"):
        model = GPT(cfg)
    assert param_counts(cfg).total == model.num_params()


def test_activation_bytes_match_the_tensors_a_real_block_saves():
    B, T = 2, 128
    block = Block(SMALL)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    cos, sin = rope_tables(SMALL.head_dim, T, SMALL.rope_theta)
    skip = {t.untyped_storage().data_ptr() for t in (*block.parameters(), cos, sin)}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in skip:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(B, T, SMALL.n_embd, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, cos, sin, None, 0)
    # on a CPU, F.rms_norm runs decomposed and also keeps x * rstd of each norm (two of width
    # n_embd, QK-norm's of q and k); CUDA's fused kernel keeps only x and rstd
    h, q, kv = SMALL.n_embd, SMALL.n_head * SMALL.head_dim, SMALL.n_kv_head * SMALL.head_dim
    cpu_decomposition = 4 * (2 * h + q + kv)
    assert sum(saved.values()) == B * T * (activation_bytes(SMALL, "none", 4, 4) + cpu_decomposition)
    assert activation_bytes(SMALL, "full", 4, 2) == 4 * h  # the block's fp32 input only
    assert activation_bytes(SMALL, "full", 4, 2) < activation_bytes(SMALL, "selective", 4, 2) \
        < activation_bytes(SMALL, "none", 4, 2)


def test_compiled_activation_bytes_match_what_a_compiled_step_saves():
    """What AOTAutograd keeps for the backward of the whole compiled model (bf16 autocast on fp32
    weights, as on CUDA), counted per storage: the planner's compiled activations and logits to
    the byte (the bf16 copies of the weights are the planner's buffers, not counted here)."""
    B, T = 2, 48
    model = GPT(SMALL)
    model.init_weights()
    step = torch.compile(model)
    x, y = torch.randint(0, SMALL.vocab_size, (B, T)), torch.randint(0, SMALL.vocab_size, (B, T))
    saved_for_backward(model, step, x, y)  # the first call compiles
    e = estimate(PlanConfig(model=SMALL, micro_batch_size=B, seq_len=T, compiled=True))
    assert saved_for_backward(model, step, x, y) == e.activations + e.logits
    eager = estimate(PlanConfig(model=SMALL, micro_batch_size=B, seq_len=T))
    assert eager.activations + eager.logits > 2 * (e.activations + e.logits)
    assert e.tensors == e.weights + e.optimizer + e.master + e.activations + e.logits + e.buffers  # no grads yet


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_optimizer_bytes_match_the_real_optimizer_state(name):
    model = GPT(SMALL)
    model.init_weights()
    opt = build_optimizer(model, OptimConfig(name=name), torch.device("cpu"))
    model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long)).backward()
    opt.step()
    groups = [opt.muon, opt.adamw] if name == "muon" else [opt]
    held = sum(t.numel() * t.element_size() for o in groups for s in o.state.values() for t in s.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)  # AdamW's 0-dim step counters aside
    e = estimate(PlanConfig(model=SMALL, optim=name))
    assert e.optimizer == held
    assert e.weights == e.grads == 4 * model.num_params()


def test_reproduces_the_seed_verdicts_and_16_bytes_per_parameter():
    n2, n8 = param_counts(preset("2b")).total, param_counts(preset("8b")).total
    one_2b = PlanConfig(model=preset("2b"), **SEED)
    one_8b = PlanConfig(model=preset("8b"), **SEED)
    fsdp_8b = PlanConfig(model=preset("8b"), gpus=8, parallel="fsdp", **SEED)
    e2, e8, ef = estimate(one_2b), estimate(one_8b), estimate(fsdp_8b)
    assert states(e2) == 16 * n2 and states(e8) == 16 * n8 and states(ef) == 16 * n8 / 8  # ZeRO's 2 + 2 + 12
    assert fits(one_2b, e2) and not fits(one_8b, e8) and fits(fsdp_8b, ef)
    assert e8.total / GIB == pytest.approx(160, rel=0.15)
    # 2b and 8b FSDP sit far below the seed's 60 and 55 GB: 1.51e9 and 8.99e9 / 8 parameters at 16
    # bytes, small checkpointed activations, per-block FSDP2 gathers; see the module's note
    assert e2.total / GIB == pytest.approx(27.0, abs=0.5) and ef.total / GIB == pytest.approx(24.2, abs=0.5)
    tokens, h = 2048, 2304
    assert e2.logits == 3 * 4 * tokens * 32768
    assert e2.activations == (24 * tokens * h * 2 + tokens * activation_bytes(one_2b.model, "none", 2, 2)
                              + tokens * (2 * h * 2 + 4))


def test_logits_dominate_memory_at_a_large_vocabulary():
    big = estimate(PlanConfig(model=preset("d12", vocab_size=151_936), micro_batch_size=4, seq_len=2048))
    terms = {k: getattr(big, k) for k in ("weights", "grads", "optimizer", "activations", "logits", "buffers")}
    assert max(terms, key=terms.get) == "logits"
    small = estimate(PlanConfig(model=preset("d12"), micro_batch_size=4, seq_len=2048))
    assert small.logits < small.activations  # at vocabulary 32768 the blocks' activations are larger


def test_layouts_shard_states_and_split_layers():
    m, c = preset("8b"), param_counts(preset("8b"))
    ddp = estimate(PlanConfig(model=m, gpus=16))
    assert estimate(PlanConfig(model=m, gpus=16, parallel="fsdp")).weights == ddp.weights / 16
    assert estimate(PlanConfig(model=m, gpus=16, parallel="hsdp", gpus_per_node=8)).weights == ddp.weights / 8
    pp = estimate(PlanConfig(model=m, gpus=16, pp=4))  # stage 0 is the fullest: 4 micro-batches in flight (1F1B)
    assert pp.weights == 4 * (10 * c.block + c.embedding) and pp.logits == 0
    assert estimate(PlanConfig(model=m, ac="full")).activations < estimate(PlanConfig(model=m)).activations / 5


def test_recommendation_names_the_cheapest_fix():
    d20 = PlanConfig(model=preset("d20"), micro_batch_size=32, seq_len=2048)
    assert not fits(d20, estimate(d20))
    assert recommend(d20).startswith("use: --parallel ddp --ac selective")
    assert recommend(PlanConfig(model=preset("8b"), gpus=8)).startswith("use: --parallel fsdp --ac none")
    assert "needs about 2 GPUs" in recommend(PlanConfig(model=preset("8b")))
    fsdp_full = PlanConfig(model=preset("8b"), gpus=8, parallel="fsdp", ac="full", micro_batch_size=1)
    assert recommend(fsdp_full).startswith("a cheaper layout fits too: --parallel fsdp --ac none")


@pytest.mark.parametrize("kwargs, message", [
    (dict(gpus=0), "--gpus must be >= 1"),
    (dict(parallel="zero3"), "unknown strategy --parallel 'zero3'"),
    (dict(gpus=3, pp=3), "--pp 3 does not divide the model's 40 layers"),
    (dict(gpus=6, pp=4), "--pp 4 does not divide --gpus 6"),
    (dict(gpus=12, parallel="hsdp"), "needs whole nodes"),
    (dict(master_bytes=4), "master copy of fp32 weights"),
])
def test_bad_input_is_a_config_error(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        PlanConfig(model=preset("8b"), **kwargs)


def test_cli_prints_the_table_and_the_verdict(capsys):
    seed = ["--train.micro_batch_size", "1", "--data.seq_len", "2048", "--gpu-mem-gb", "80",
            "--param-dtype", "bf16", "--master-weights", "--train.compile", "false"]  # the seed trains eagerly
    assert main(["plan", "--preset", "8b", "--gpus", "8", "--parallel", "fsdp", "--ac", "full", *seed]) == 0
    out = capsys.readouterr().out
    assert "verdict: fsdp on 8 GPU(s) needs about 24.2 GiB per GPU of 80.0 GiB: fits" in out
    assert "* fsdp" in out and "dtypes: weights bf16, grads bf16, optimizer state fp32, master copy fp32" in out
    assert main(["plan", "--preset", "8b", "--ac", "full", *seed]) == 1
    assert "does not fit" in capsys.readouterr().out
    assert main(["plan", "--preset", "tiny", "--gpu-mem-gb", "80"]) == 0  # the vocabulary its recipe would train
    assert "parameters (4 layers, width 96, vocab 4096)" in capsys.readouterr().out


def test_cli_bad_input_exits_2_with_one_line(capsys):
    assert main(["plan", "--preset", "8b", "--gpus", "3", "--pp", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("codechat plan: error: --pp 3 does not divide") and err.count("\n") == 1
    assert main(["plan", "--gpus", "0"]) == 2
    with pytest.raises(SystemExit) as e:
        main(["plan", "--parallel", "zero3"])
    assert e.value.code == 2 and "invalid choice: 'zero3'" in capsys.readouterr().err


def test_training_start_warns_only_when_the_plan_exceeds_the_device(caplog):
    lines: list[str] = []
    cfg = PlanConfig(model=preset("8b"), gpu_mem_gib=80.0)
    est = print_plan(cfg, lines.append)
    assert len(lines) == 1 and lines[0].startswith(f"memory plan: ~{est.total / GIB:.1f} GiB per GPU of 80.0 GiB")
    with caplog.at_level(logging.WARNING, logger="codechat"):  # a log record (one line), not a Python warning
        assert warn_if_exceeds(cfg, est)
    [rec] = caplog.records
    assert rec.name == "codechat.train.plan_check" and re.search("does not fit .* Try nothing fits on 1 GPU", rec.message)
    caplog.clear()
    small = PlanConfig(model=preset("tiny"))
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="codechat"):
        warnings.simplefilter("error")
        assert not warn_if_exceeds(small, estimate(small))
    assert caplog.records == []


def test_training_check_prints_one_line_on_cuda_and_nothing_on_cpu(monkeypatch, caplog):
    from codechat.config.stages import TrainConfig
    from codechat.train import plan_check
    lines: list[str] = []
    train = TrainConfig(max_steps=1, micro_batch_size=2)
    assert check_training_memory(preset("8b"), train, OptimConfig(), 2048, torch.device("cpu"), lines.append) is None
    assert lines == []
    monkeypatch.setattr(plan_check, "device_memory_gib", lambda device: 139.8)  # an H200, as torch reports it
    with caplog.at_level(logging.WARNING, logger="codechat"):
        est = check_training_memory(preset("8b"), train, OptimConfig(), 2048, torch.device("cuda"), lines.append)
    assert re.search("ddp on 1 GPU.* of 139.8 GiB: does not fit", caplog.records[0].message)
    assert len(lines) == 1 and lines[0].startswith("memory plan: ~")
    assert est == estimate(PlanConfig(model=preset("8b"), micro_batch_size=2, seq_len=2048))  # the run's settings
    # FSDP resharding after forward where keeping the gathered blocks fits too: one more line, saying so
    lines.clear()
    fsdp = dict(gpus=8, gpus_per_node=8, parallel="fsdp")
    check_training_memory(preset("1b"), train, OptimConfig(), 2048, torch.device("cuda"), lines.append, **fsdp)
    assert len(lines) == 2 and lines[1].startswith("memory plan: --train.fsdp_reshard_after_forward false fits too")
    lines.clear()
    kept = replace(train, fsdp_reshard_after_forward=False)
    check_training_memory(preset("1b"), kept, OptimConfig(), 2048, torch.device("cuda"), lines.append, **fsdp)
    assert len(lines) == 1


def test_regional_compilation_plans_compiled_activations_and_the_eager_peak():
    """``train.compile_scope blocks`` compiles each block and the head apart: the plan counts the
    compiled activations and logits of the whole-model compile, but the eager peak (grads held),
    since no graph spans the step; with ``--pp`` the head runs eager (fp32 logits copies)."""
    from codechat.config.stages import TrainConfig
    from codechat.train.plan import FP32, LOGITS_FP32_COPIES, _stage, plan_config
    m = preset("d20", vocab_size=32768)
    whole, blocks = (estimate(plan_config(m, TrainConfig(max_steps=1, micro_batch_size=16, compile=True,
                                                         compile_scope=scope), OptimConfig(), 2048))
                     for scope in ("model", "blocks"))
    tokens = 16 * 2048
    assert whole.compiled and not blocks.compiled
    assert whole.logits == blocks.logits == 2 * tokens * 32768 and whole.activations == blocks.activations
    staged = PlanConfig(model=m, micro_batch_size=16, seq_len=2048, compiled=True, pp=2, gpus=2)
    last = _stage(staged, param_counts(m), first=False, last=True)  # the stage that holds the head
    assert last.logits == LOGITS_FP32_COPIES * FP32 * tokens * 32768
    # the eager peak holds the gradients beside the backward's working set; the compiled one does not
    assert blocks.tensors >= blocks.weights + blocks.optimizer + blocks.grads + blocks.activations + blocks.logits
    assert whole.tensors < whole.weights + whole.optimizer + whole.grads + whole.activations + whole.logits


def test_cpu_offload_moves_the_model_states_to_host_memory(capsys):
    from dataclasses import replace
    fsdp = PlanConfig(model=preset("8b"), gpus=8, parallel="fsdp", **SEED)
    on_gpu, off = estimate(fsdp), estimate(replace(fsdp, cpu_offload=True))
    assert states(off) == 0 and off.host == pytest.approx(states(on_gpu))  # 16 bytes per parameter / 8 ranks
    assert off.host == pytest.approx(16 * param_counts(preset("8b")).total / 8)
    assert (off.activations, off.logits, off.buffers) == (on_gpu.activations, on_gpu.logits, on_gpu.buffers)
    assert off.total < on_gpu.total / 2
    # 8b on one 80 GB GPU fits nowhere without offload; offloaded, it fits and the recommendation says so
    one = PlanConfig(model=preset("8b"), **SEED)
    assert "needs about 2 GPUs of 80 GiB; or, at AdamW's speed on the CPU, --parallel fsdp --ac full " \
           "--train.cpu_offload true at micro-batch 1 fits now" in recommend(one)
    with pytest.raises(ConfigError, match="train.cpu_offload needs --parallel fsdp or hsdp"):
        PlanConfig(model=preset("8b"), cpu_offload=True)
    with pytest.raises(ConfigError, match="optim.name adamw"):
        PlanConfig(model=preset("8b"), gpus=8, parallel="fsdp", optim="muon", cpu_offload=True)
    args = ["plan", "--preset", "8b", "--gpus", "8", "--parallel", "fsdp", "--gpu-mem-gb", "80",
            "--train.cpu_offload", "true", "--optim.name", "adamw"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "host memory per rank (--train.cpu_offload): " in out and "\n  ddp " in out  # DDP's row, unoffloaded


#: Every weight of one shape family: (64, 64) matrices that torchao's 8-bit AdamW quantizes, (64,) norms it does not.
SQUARE = ModelConfig(vocab_size=64, n_layer=2, n_embd=64, n_head=1, n_kv_head=1, head_dim=64, intermediate_size=64,
                     max_seq_len=64)


def test_lora_trains_the_adapters_of_the_real_model_and_freezes_the_base():
    """``--peft lora``: the trainable parameters are those ``apply_lora`` leaves trainable, rank * (in + out)
    per targeted projection; the base is stored in bf16 without gradients, optimizer state or master copy."""
    from codechat.config.lora import LoraConfig
    from codechat.peft.lora import apply_lora
    for targets in (("q", "k", "v", "o", "gate", "up", "down"), ("q", "v")):
        model = GPT(SMALL)
        base = model.num_params()
        apply_lora(model, LoraConfig(rank=4, targets=targets))
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        e = estimate(PlanConfig(model=SMALL, lora_rank=4, lora_targets=targets))
        assert e.grads == 4 * trainable and e.optimizer == 8 * trainable and e.master == 0
        # fp32 adapters; of the frozen base the blocks' projections in the compute dtype (bf16), the rest in fp32
        blocks = 2 * sum(r * c for r, c in param_counts(SMALL).block_matrices)
        assert e.weights == 4 * trainable + 2 * blocks + 4 * (base - blocks)
    h, kv, i = 64, 32, 160
    assert trainable == 2 * 4 * ((h + h) + (h + kv))  # q (64 x 64) and v (32 x 64) in both blocks
    full = estimate(PlanConfig(model=preset("8b"), ac="full"))
    lora = estimate(PlanConfig(model=preset("8b"), ac="full", lora_rank=16))
    assert lora.total < full.total / 4
    with pytest.raises(ConfigError, match="lora.rank 40 is larger than k's smaller dimension"):
        estimate(PlanConfig(model=SMALL, lora_rank=40))
    with pytest.raises(ConfigError, match="'gate' matches no layer of this model"):
        estimate(PlanConfig(model=preset("tiny", mlp_act="relu2"), lora_rank=4, lora_targets=("gate",)))
    with pytest.raises(ConfigError, match="--peft lora trains its adapters with AdamW"):
        PlanConfig(model=SMALL, lora_rank=4, optim="muon")
    assert i == SMALL.intermediate_size


def test_adamw8bit_optimizer_bytes_are_torchaos_state_bytes():
    """The planner's 8-bit state is :func:`codechat.train.optim8bit.state_bytes` of every trainable tensor
    (``tests/test_optim8bit.py`` holds that to a real torchao optimizer): ~2.03 bytes a parameter at scale."""
    from codechat.train.optim8bit import state_bytes
    model = GPT(SQUARE)
    assert estimate(PlanConfig(model=SQUARE, optim="adamw8bit")).optimizer == sum(
        state_bytes(p.numel()) for p in model.parameters())
    n8 = param_counts(preset("8b")).total
    assert estimate(PlanConfig(model=preset("8b"), optim="adamw8bit")).optimizer / n8 == pytest.approx(2.03, abs=0.01)
    lora = PlanConfig(model=SQUARE, optim="adamw8bit", lora_rank=64)  # A (64, 64) and B (64, 64): quantized
    assert estimate(lora).optimizer == 2 * 7 * 2 * state_bytes(64 * 64)


def test_recommends_lora_and_8bit_states_when_nothing_else_fits(capsys):
    """8b on one H200 (139.8 GiB): full AdamW does not fit; LoRA and the 8-bit optimizer do."""
    cfg = PlanConfig(model=preset("8b"), ac="full", gpu_mem_gib=139.8, compiled=True)
    text = recommend(cfg)
    assert not fits(cfg, estimate(cfg)) and text.startswith("nothing fits on 1 GPU(s) with full adamw")
    assert re.search(r"`--peft lora --lora.rank 16` fits at about \d+\.\d GiB per GPU \(--parallel ddp", text)
    assert re.search(r"`--optim.name adamw8bit` with fp32 weights fits at about \d+\.\d GiB per GPU", text)
    bf16 = PlanConfig(model=preset("8b"), ac="full", gpu_mem_gib=80.0, param_bytes=2, grad_bytes=2)
    assert "`--optim.name adamw8bit` with bf16 weights fits" in recommend(bf16)
    args = ["plan", "--preset", "8b", "--gpu-mem-gb", "139.8", "--ac", "full", "--peft", "lora", "--lora.rank", "8",
            "--lora.targets", "q,v"]
    assert main(args) == 0
    assert "--peft lora rank 8 on q,v: 4,259,840 trainable parameters, the blocks' projections frozen in bf16" in \
        capsys.readouterr().out  # 40 layers x 8 x ((4096 + 4096) + (4096 + 1024))


#: DDP over one rank (torchrun, NCCL, a ``DistributedDataParallel`` module in place), 1b compiled, micro-batch 8
#: x 2048, AdamW: ``torch.cuda.max_memory_allocated`` in benchmarks/RESULTS.md (2026-12-01: 25 MiB buckets;
#: 2026-12-06: 200 MiB), GiB.
DDP_1B_MEASURED, DDP_1B_200_MEASURED, PLAIN_1B_MEASURED = 39.26, 34.62, 31.30


def test_ddp_buckets_are_a_second_copy_of_the_gradients_and_match_the_measured_peak():
    one = dict(model=preset("1b"), micro_batch_size=8, seq_len=2048, compiled=True)
    plain, ddp = estimate(PlanConfig(**one)), estimate(PlanConfig(**one, distributed=True, ddp_bucket_cap_mb=25))
    assert plain.buckets == 0 and ddp.buckets == ddp.grads == 4 * param_counts(preset("1b")).total
    assert ddp.tensors / GIB == pytest.approx(DDP_1B_MEASURED, rel=0.03)  # 39.99: within 2%
    default = estimate(PlanConfig(**one, distributed=True))  # 200 MiB buckets: each block's graph whole
    assert default.tensors / GIB == pytest.approx(DDP_1B_200_MEASURED, rel=0.02)  # 34.30: within 1%
    assert plain.tensors / GIB == pytest.approx(PLAIN_1B_MEASURED, rel=0.01)
    # the graph cut at every 25 MiB bucket saves what the eager blocks save; a cut every few blocks (LoRA) does not
    assert ddp.activations > plain.activations
    lora = dict(one, lora_rank=16)
    assert estimate(PlanConfig(**lora, distributed=True)).activations == estimate(PlanConfig(**lora)).activations
    # buckets larger than a block's gradients (train.ddp_bucket_cap_mb): the blocks' graphs whole, as without DDP
    big = estimate(PlanConfig(**one, distributed=True, ddp_bucket_cap_mb=1024))
    assert big.activations == default.activations == plain.activations and big.buckets == ddp.buckets
    from codechat.config.stages import TrainConfig
    from codechat.train.plan import plan_config
    cfg = plan_config(preset("1b"), TrainConfig(max_steps=1, micro_batch_size=8, ddp_bucket_cap_mb=1024), OptimConfig(),
                      2048, distributed=True)
    assert cfg.ddp_bucket_cap_mb == 1024
    with pytest.raises(ConfigError, match="train.ddp_bucket_cap_mb must be > 0"):
        TrainConfig(max_steps=1, ddp_bucket_cap_mb=0)
    fsdp = estimate(PlanConfig(**one, distributed=True, parallel="fsdp"))
    assert fsdp.buckets == 0
    # train.fsdp_reshard_after_forward false: every block's gathered bf16 parameters held, not two
    kept = estimate(PlanConfig(**one, distributed=True, parallel="fsdp", fsdp_reshard_after_forward=False))
    assert kept.buffers - fsdp.buffers == (preset("1b").n_layer - 2) * param_counts(preset("1b")).block * 2
    assert estimate(PlanConfig(**one, gpus=8)).buckets == ddp.buckets  # replicas: every rank holds all buckets


def test_ddp_buckets_hold_one_element_per_trainable_parameter(tmp_path):
    """The formula against torch's reducer: a real ``DistributedDataParallel`` (gloo, world of one) over a
    model with LoRA's frozen base reports buckets of exactly the trainable parameters' bytes."""
    import torch.distributed as dist
    from codechat.config.lora import LoraConfig
    from codechat.config.stages import DDP_GRADIENT_AS_BUCKET_VIEW
    from codechat.peft.lora import apply_lora
    from codechat.train.plan_states import ddp_bucket_bytes
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        for lora in (None, LoraConfig(rank=4, targets=("q", "v"))):
            model = GPT(SMALL)
            if lora:
                apply_lora(model, lora)
            ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=DDP_GRADIENT_AS_BUCKET_VIEW)
            held = sum(int(b) for b in str(ddp._get_ddp_logging_data()["bucket_sizes"]).split(","))
            trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            assert held == ddp_bucket_bytes(trainable, 4)
            adapters = dict(lora_rank=4, lora_targets=("q", "v")) if lora else {}
            assert estimate(PlanConfig(model=SMALL, distributed=True, **adapters)).buckets == held
    finally:
        dist.destroy_process_group()
