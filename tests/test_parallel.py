"""Data parallel training on real process groups (gloo, ``torchrun`` on 127.0.0.1, 2 CPU processes).

Each run is the real command: ``torchrun --nproc_per_node 2 -m codechat pretrain ...`` (the tiny
recipe: Muon, whose Newton-Schulz step gathers whole matrices under FSDP) against one process with
the same global batch (losses equal to 1e-5 in fp32), a 2-rank FSDP checkpoint (DCP, written by
both ranks) resumed by one process and by 4 DDP ranks (the same loss curve), ``--pp 2`` against one
process and its checkpoint resumed on 2 stages x 2 replicas, SFT under DDP, and the trainer under DDP step by
step in a worker script (parameters bit-identical on both ranks after every step; the loss of
micro-batches with unequal supervised-token counts normalised over both ranks, ``shared/cases/05``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run(args: list[str], launcher: list[str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = (launcher or [sys.executable]) + ["-m", "codechat", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)


def losses(out: Path) -> list[float]:
    return [json.loads(ln)["loss"] for ln in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in ln]


@pytest.fixture(scope="module")
def pretrain_args(tok_dir, corpus_dir):
    def args(out: Path, steps: int, *extra: str) -> list[str]:
        return ["pretrain", "--preset", "tiny", "--max-steps", str(steps), "--data", str(corpus_dir), "--tokenizer",
                str(tok_dir), "--out", str(out), "--device", "cpu", "--train.log_every", "1",
                "--train.eval_tokens", "2048", *extra]
    return args


def test_ddp_and_fsdp_on_two_ranks_train_like_one_process_and_fsdp_checkpoints_resume_in_one(pretrain_args, tmp_path):
    one = run(pretrain_args(tmp_path / "one", 4, "--train.micro_batch_size", "8"))
    assert one.returncode == 0, one.stderr[-3000:]
    fsdp = run(pretrain_args(tmp_path / "fsdp", 3, "--parallel", "fsdp", "--ac", "full", "--train.micro_batch_size", "4"),
               TORCHRUN)  # activation checkpointing recomputes, it does not change a number
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    ddp = run(pretrain_args(tmp_path / "ddp", 3, "--parallel", "ddp", "--train.micro_batch_size", "2",
                            "--train.grad_accum", "2"), TORCHRUN)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    ref = losses(tmp_path / "one")
    assert len(ref) == 4
    for name in ("fsdp", "ddp"):
        assert losses(tmp_path / name) == pytest.approx(ref[:3], rel=1e-5, abs=1e-5), name
    assert fsdp.stdout.count("done: step 3") == 1  # rank 0 speaks
    # the 2-rank FSDP checkpoint (optimizer state keyed by name) continues in one process, and on 4 ranks (DDP)
    (tmp_path / "fsdp4").mkdir()
    import shutil
    shutil.copytree(tmp_path / "fsdp" / "checkpoints", tmp_path / "fsdp4" / "checkpoints")
    shutil.copy(tmp_path / "fsdp" / "metrics.jsonl", tmp_path / "fsdp4" / "metrics.jsonl")
    resumed = run(pretrain_args(tmp_path / "fsdp", 4, "--train.micro_batch_size", "8", "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert losses(tmp_path / "fsdp") == pytest.approx(ref, rel=1e-5, abs=1e-5)
    four = run(pretrain_args(tmp_path / "fsdp4", 4, "--parallel", "ddp", "--train.micro_batch_size", "2", "--resume"),
               TORCHRUN[:-1] + ["4"])
    assert four.returncode == 0, four.stderr[-3000:]
    assert losses(tmp_path / "fsdp4") == pytest.approx(ref, rel=1e-5, abs=1e-5)


def test_sft_under_ddp_on_two_ranks_trains_like_one_process(pretrain_args, tmp_path):
    base = run(pretrain_args(tmp_path / "base", 1))
    assert base.returncode == 0, base.stderr[-3000:]
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Write f{i}."},
                                                     {"role": "assistant", "content": "def f():\n    return " + "1" * i}]})
                            + "\n" for i in range(1, 40)))
    common = ["sft", "--init", str(tmp_path / "base"), "--data", str(data), "--max-steps", "3", "--device", "cpu",
              "--train.log_every", "1", "--sft.decontaminate", "false", "--sft.max_length", "64"]
    one = run(common + ["--out", str(tmp_path / "one"), "--train.micro_batch_size", "8"])
    assert one.returncode == 0, one.stderr[-3000:]
    two = run(common + ["--out", str(tmp_path / "two"), "--train.micro_batch_size", "4", "--parallel", "ddp"], TORCHRUN)
    assert two.returncode == 0, two.stderr[-3000:]
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-5, abs=1e-5)


WORKER = r'''
import hashlib, json, sys
import torch, torch.distributed as dist
from codechat.config.stages import ModelConfig, OptimConfig, RunConfig, TrainConfig
from codechat.data.batch import Batch
from codechat.model import build_model
from codechat.parallel.world import RankSlice, init_world
from codechat.train.trainer import Trainer


# in a function, not module globals: the FSDP model (which holds the process group) is freed
# before the interpreter shuts down
def main():
    world = init_world("cpu")
    g = torch.Generator().manual_seed(1)
    # four sequences, 5 + 20 supervised tokens for rank 0 and 11 + 101 for rank 1 (shared/cases/05), in two micro-steps
    x = torch.randint(0, 64, (4, 128), generator=g)
    y = torch.randint(0, 64, (4, 128), generator=g)
    for row, n in enumerate((5, 11, 20, 101)):
        y[row, n:] = -100

    class Global:  # global micro-batches of 2 rows: (5, 11) then (20, 101); rank r takes row r of each
        i = 0
        def next_batch(self):
            b = Batch(x[self.i % 2 * 2: self.i % 2 * 2 + 2], y[self.i % 2 * 2: self.i % 2 * 2 + 2])
            self.i += 1
            return b
        def state_dict(self): return {"i": self.i}
        def load_state_dict(self, s): self.i = s["i"]

    cfg = ModelConfig(vocab_size=64, n_layer=2, n_embd=32, n_head=2, n_kv_head=2, max_seq_len=128)
    torch.manual_seed(0)
    model = build_model(cfg)
    strategy, _, variant = sys.argv[1].partition("-")  # fsdp-bf16: FSDP gathering bf16 parameters; fsdp-offload
    seen = set()  # the dtype of a block's weight as its forward sees it
    model.layers[0].mlp.down_proj.register_forward_pre_hook(lambda m, a: seen.add(str(m.weight.dtype)))
    trainer = Trainer(model, train=TrainConfig(max_steps=3, micro_batch_size=1, grad_accum=2, parallel=strategy,
                                               dtype="bf16" if variant == "bf16" else "auto", ddp_bucket_cap_mb=0.05,
                                               fsdp_reshard_after_forward=variant != "bf16",
                                               cpu_offload=variant == "offload"),
                      optim=OptimConfig(lr=1e-2, warmup_steps=0), run=RunConfig(out=sys.argv[2]),
                      batches=RankSlice(Global(), world), out_dir=sys.argv[2], show_progress=False, world=world)
    out = []
    for step in range(3):
        stats = trainer.train_step([trainer.batches.next_batch() for _ in range(2)])
        digest = hashlib.sha256(b"".join(p.detach().full_tensor().numpy().tobytes() if hasattr(p, "full_tensor")
                                         else p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        digests = [None] * world.size
        dist.all_gather_object(digests, digest)
        out.append({"loss": float(stats["loss"]), "supervised": stats["supervised"], "same": len(set(digests)) == 1})
    shards = trainer.par.shards(trainer.optimizer)  # what this rank writes of a checkpoint
    held = [None] * world.size
    dist.all_gather_object(held, sum((t.to_local() if hasattr(t, "to_local") else t).numel()
                                     for t in shards["model"].values()))
    state = model._get_fsdp_state()._fsdp_param_group if strategy == "fsdp" else None  # FSDP2's own record
    if world.main:
        cap = getattr(trainer.par.module, "bucket_bytes_cap", None)  # DDP's, from train.ddp_bucket_cap_mb
        buckets = len(trainer.par.module.reducer._get_zeros_like_grad_buckets()) if cap else None
        block = model.layers[0]._get_fsdp_state()._fsdp_param_group if strategy == "fsdp" else None
        print(json.dumps({"steps": out, "held": held, "seen": sorted(seen), "bucket_cap": cap, "buckets": buckets,
                          "resharded": block.post_forward_mesh_info is not None if block else None,
                          "params": sorted({str(p.dtype) for p in model.parameters()}),
                          "offloaded": sorted({f.offload_to_cpu for f in state.fsdp_params}) if state else None}))


main()
'''


@pytest.fixture(scope="module")
def worker_report(tmp_path_factory):
    """``worker_report(variant)``: rank 0's report of WORKER on 2 gloo ranks, run once per variant."""
    reports: dict[str, dict] = {}

    def report(variant: str) -> dict:
        if variant not in reports:
            d = tmp_path_factory.mktemp(variant)
            (d / "worker.py").write_text(WORKER)
            p = subprocess.run(TORCHRUN + [str(d / "worker.py"), variant, str(d / "w")], capture_output=True, text=True,
                               timeout=240, env={**ENV, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
            assert p.returncode == 0, p.stderr[-3000:]
            reports[variant] = json.loads(p.stdout.strip().splitlines()[-1])
        return reports[variant]
    return report


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp-bf16"])
def test_steps_keep_ranks_identical_and_normalise_unequal_token_counts_globally(worker_report, strategy):
    import torch

    from codechat.config.stages import ModelConfig
    from codechat.model import build_model
    report = worker_report(strategy)
    steps = report["steps"]
    assert [s["same"] for s in steps] == [True] * 3  # bit-identical parameters after every step
    assert [s["supervised"] for s in steps] == [137] * 3
    # the first step's loss is the token mean over all four sequences (137 tokens), as one batch of all
    torch.manual_seed(0)
    m = build_model(ModelConfig(vocab_size=64, n_layer=2, n_embd=32, n_head=2, n_kv_head=2, max_seq_len=128))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 64, (4, 128), generator=g), torch.randint(0, 64, (4, 128), generator=g)
    for row, n in enumerate((5, 11, 20, 101)):
        y[row, n:] = -100
    with torch.no_grad():
        whole = float(m(x, y, reduction="sum")) / 137
    bf16 = strategy == "fsdp-bf16"  # parameters gathered in bf16, sharded copies and reduced gradients fp32
    assert steps[0]["loss"] == pytest.approx(whole, rel=2e-2 if bf16 else 1e-6)
    assert report["seen"] == ["torch.bfloat16" if bf16 else "torch.float32"]
    assert report["params"] == ["torch.float32"]
    whole = sum(t.numel() for t in m.state_dict().values())
    if strategy.startswith("fsdp"):  # each rank writes its shard of the parameters
        assert sum(report["held"]) == whole and 0 < report["held"][0] < whole
        assert report["offloaded"] == [False]
        # train.fsdp_reshard_after_forward (false in the bf16 variant): the blocks' gathered weights kept
        assert report["resharded"] is (strategy == "fsdp")
    else:  # replicas: each holds all (the checkpoint writes one copy)
        assert report["held"] == [whole, whole]
        # buckets of train.ddp_bucket_cap_mb (0.05 MiB): the model's fp32 gradients over several of them
        assert report["bucket_cap"] == int(0.05 * 1024 * 1024) and report["buckets"] > 1


def test_fsdp_with_cpu_offload_trains_like_fsdp_and_refuses_what_it_cannot_do(worker_report, tmp_path, pretrain_args):
    reports = {v: worker_report(v) for v in ("fsdp", "fsdp-offload")}  # plain FSDP's run is the test above's
    off = reports["fsdp-offload"]
    assert off["offloaded"] == [True]  # every parameter's shard lives in host memory
    assert [s["same"] for s in off["steps"]] == [True] * 3
    # the optimizer steps on the host copies: the same losses as FSDP on the device, step after step
    assert [s["loss"] for s in off["steps"]] == pytest.approx([s["loss"] for s in reports["fsdp"]["steps"]],
                                                              rel=1e-6)
    assert off["held"] == reports["fsdp"]["held"]
    # what offload cannot do is said before step 0: Muon (the tiny recipe's optimizer), DDP, one process
    for extra, message in ((["--parallel", "fsdp"], "use --optim.name adamw with offload"),
                           (["--parallel", "ddp"], "it needs --parallel fsdp or hsdp"),
                           (["--parallel", "fsdp", "--optim.name", "adamw"], "run under torchrun")):
        bad = run(pretrain_args(tmp_path / "bad", 2, "--train.cpu_offload", "true", *extra))
        assert bad.returncode != 0 and message in bad.stderr, bad.stderr[-2000:]


@pytest.mark.parametrize("extra, message", [
    (["--parallel", "ddp", "--train.batch_size", "6", "--train.micro_batch_size", "2"],
     "train.batch_size=6 does not divide into micro-batches of train.micro_batch_size=2 x 2 rank(s)"),
    (["--parallel", "hsdp"], "this world is a single node"),
    (["--pp", "3", "--train.micro_batch_size", "6"], "--pp 3 does not divide the world size 2"),
])
def test_layouts_that_cannot_work_fail_on_every_rank_before_training(pretrain_args, tmp_path, extra, message):
    # the ranks start as torchrun would start them on one node (its environment), but with no agent that stops
    # the others when one fails: each rank must fail by itself, whatever the order the machine runs them in
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    ranks = [subprocess.Popen([sys.executable, "-m", "codechat", *pretrain_args(tmp_path / "bad", 2, *extra)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**ENV, **world, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in (0, 1)]
    errs = [r.communicate(timeout=180)[1] for r in ranks]  # nobody hangs
    for rank, err in zip(ranks, errs):
        assert rank.returncode == 2 and message in err, err[-3000:]  # each rank says it
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()


def test_two_nodes_on_one_machine_train_hsdp_like_one_process(pretrain_args, tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = pretrain_args(tmp_path / "hsdp", 3, "--parallel", "hsdp", "--train.micro_batch_size", "4")
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                               "--node_rank", str(r), "--master_addr", "127.0.0.1", "--master_port", str(port),
                               "-m", "codechat", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=ENV) for r in (0, 1)]
    outs = [n.communicate(timeout=300) for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    one = run(pretrain_args(tmp_path / "one", 3, "--train.micro_batch_size", "8"))
    assert one.returncode == 0, one.stderr[-3000:]
    assert losses(tmp_path / "hsdp") == pytest.approx(losses(tmp_path / "one"), rel=1e-5, abs=1e-5)


def test_an_fsdp_checkpoint_exports_to_safetensors_that_every_command_loads(pretrain_args, tmp_path):
    import torch

    from codechat import checkpoint as ckpt
    p = run(pretrain_args(tmp_path / "fsdp", 2, "--parallel", "fsdp", "--train.micro_batch_size", "2"), TORCHRUN)
    assert p.returncode == 0, p.stderr[-3000:]
    e = run(["export", "--model", str(tmp_path / "fsdp"), "--out", str(tmp_path / "export")])
    assert e.returncode == 0, e.stderr[-3000:]
    assert sorted(f.name for f in (tmp_path / "export").iterdir()) == ["model.safetensors", "state.json", "tokenizer"]
    a, tok, _ = ckpt.load_model(tmp_path / "fsdp")
    b, _, state = ckpt.load_model(tmp_path / "export")
    assert state["step"] == 2 and b.cfg == a.cfg and b.cfg.tie_embeddings  # the tied head was stored once
    ids = torch.tensor([tok.encode("def f(x):\n    return x")])
    with torch.no_grad():
        assert torch.equal(a(ids), b(ids))
    s = run(["sample", "--model", str(tmp_path / "export"), "--prompt", "def f(", "--max-new-tokens", "4",
             "--device", "cpu"])
    assert s.returncode == 0 and s.stdout.startswith("def f("), s.stderr[-2000:]
    again = run(["export", "--model", str(tmp_path / "fsdp"), "--out", str(tmp_path / "fsdp")])
    assert again.returncode == 2 and "exists and is not an export" in again.stderr


def test_two_pipeline_stages_train_like_one_process_and_their_checkpoint_resumes_on_two_by_two(pretrain_args, tmp_path):
    """--pp 2 (GPipe, 4 pipeline micro-batches; the tiny model's tied head split from its embedding)
    gives one process's losses, validation included; its checkpoint is one process's and continues
    the same curve on 4 ranks as 2 stages x 2 data-parallel replicas (1F1B)."""
    import shutil
    one = run(pretrain_args(tmp_path / "one", 4, "--train.micro_batch_size", "8"))
    assert one.returncode == 0, one.stderr[-3000:]
    pp = run(pretrain_args(tmp_path / "pp", 3, "--pp", "2", "--train.micro_batch_size", "8", "--train.pp_schedule",
                           "gpipe", "--train.pp_microbatches", "4"), TORCHRUN)
    assert pp.returncode == 0, pp.stderr[-3000:]
    ref = losses(tmp_path / "one")
    assert losses(tmp_path / "pp") == pytest.approx(ref[:3], rel=1e-5, abs=1e-5)
    val = [[json.loads(ln)["val_loss"] for ln in (tmp_path / d / "metrics.jsonl").read_text().splitlines()
            if "val_loss" in ln][0] for d in ("one", "pp")]
    assert val[1] == pytest.approx(val[0], rel=1e-6)  # validation through the stages, reduced to rank 0
    assert pp.stdout.count("done: step 3") == 1
    (tmp_path / "pp4").mkdir()
    shutil.copytree(tmp_path / "pp" / "checkpoints", tmp_path / "pp4" / "checkpoints")
    shutil.copy(tmp_path / "pp" / "metrics.jsonl", tmp_path / "pp4" / "metrics.jsonl")
    import torch

    from codechat import checkpoint as ckpt  # each stage wrote its part; one process reads the whole model
    d = ckpt.resolve(tmp_path / "pp")
    assert ckpt.is_sharded(d)
    assert sorted(f.name for f in (d / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    model, tok, state = ckpt.load_model(d)
    assert state["step"] == 3 and torch.isfinite(model(torch.tensor([tok.encode("def f(x):")]))).all()
    four = run(pretrain_args(tmp_path / "pp4", 4, "--pp", "2", "--train.micro_batch_size", "4", "--resume"),
               TORCHRUN[:-1] + ["4"])
    assert four.returncode == 0, four.stderr[-3000:]
    assert losses(tmp_path / "pp4") == pytest.approx(ref, rel=1e-5, abs=1e-5)
