"""Session fixtures shared by the whole suite: a small trained tokenizer and a token corpus.

Both are built once per session from the running Python's standard library (a few
seconds on 2 cores):

- ``tok_dir``: a 2048-id tokenizer trained on the train split (``VAL_FRACTION``) of the
  first ``N_FILES`` stdlib files, capped at ``TOK_MAX_BYTES`` of text;
- ``tok``: that tokenizer, loaded;
- ``corpus_dir``: the same ``N_FILES`` files tokenised with it (train and val shards + index.json);
- ``shared_dir``: the ``shared/`` folder beside the repository (the public data and failure cases; CI
  clones it there, a user's clone has none): a test that reads it skips, saying what is missing, when it
  is absent; tests parametrised by a shared file's cases use :func:`shared_params` (one skipped case
  when it is absent). Every behaviour such a test pins is also pinned on ``tests/fixtures/``;
- ``write_corpus``: writes texts into files whose names hash into a chosen split;
- ``memorise``: SFT a model on one conversation until it reproduces it;
- ``funcall_stage``: a tiny SFT stage taught one function-calling conversation, and its executor;
- ``served``: ``codechat serve`` of ``funcall_stage`` running on 127.0.0.1 (tests/test_serve*.py).
"""
from __future__ import annotations

import builtins
import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass
from pathlib import Path

import pytest

from codechat.config.stages import default_corpus_dirs
from codechat.data.corpus import build_corpus
from codechat.data.sources import iter_split_texts, split_of
from codechat.tokenizer import Tokenizer, train_tokenizer

TOK_VOCAB = 2048
N_FILES = 200
TOK_MAX_BYTES = 2_000_000
VAL_FRACTION = 0.1
WORKERS = 2


#: The public data and failure cases, beside the repository (the one place tests look for them).
SHARED = Path(__file__).resolve().parents[2] / "shared"
#: The project's own small inputs (always present).
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def shared_missing(rel: str = "") -> str | None:
    """Why ``SHARED / rel`` cannot be read, as a skip reason; None when it is there."""
    path = SHARED / rel
    if path.exists():
        return None
    return (f"{path} is missing: the public data (the shared/ folder beside the repository) is not here; "
            "the behaviour is also tested on tests/fixtures/")


def shared_file(rel: str) -> Path:
    """``SHARED / rel``, or skip the calling test (at test time) saying what is missing."""
    reason = shared_missing(rel)
    if reason:
        pytest.skip(reason)
    return SHARED / rel


def shared_params(rel: str, cases: Callable[[Path], list], ids: Callable[[object], str] | None = None) -> list:
    """Parameters for a test built from a shared file's cases: ``cases(SHARED / rel)`` when the file is
    there, else one case marked skip with the reason (collection never fails on a missing file)."""
    reason = shared_missing(rel)
    if reason:
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="shared-missing")]
    return [pytest.param(c, id=ids(c) if ids else None) for c in cases(SHARED / rel)]


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``shared/`` beside the repository; the test skips (saying so) when it is absent."""
    reason = shared_missing()
    if reason:
        pytest.skip(reason)
    return SHARED


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of a 2048-id tokenizer trained on a slice of the stdlib's train split."""
    texts = iter_split_texts(default_corpus_dirs(), "train", val_fraction=VAL_FRACTION, max_files=N_FILES,
                             max_bytes=TOK_MAX_BYTES)
    return train_tokenizer(texts, TOK_VOCAB, show_progress=False).save(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def tok(tok_dir: Path) -> Tokenizer:
    return Tokenizer.load(tok_dir)


@pytest.fixture(scope="session")
def corpus_dir(tok_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of train/val shards + index.json: ``N_FILES`` stdlib files, ``VAL_FRACTION`` held out."""
    out = tmp_path_factory.mktemp("corpus")
    build_corpus(default_corpus_dirs(), tok_dir, out, val_fraction=VAL_FRACTION, max_files=N_FILES,
                 workers=WORKERS, show_progress=False)
    return out


@pytest.fixture(scope="session")
def write_corpus() -> Callable[..., Path]:
    """``write_corpus(root, {"train": [texts], "val": [texts]}, val_fraction)`` -> ``root``.

    Each text goes to its own ``.py`` file named so that :func:`split_of` puts it in the
    requested split; within a split, files sort in the order of the texts.
    """
    def write(root: Path, texts_by_split: dict[str, list[str]], val_fraction: float) -> Path:
        root.mkdir(parents=True, exist_ok=True)
        for split, texts in texts_by_split.items():
            k = 0
            for n, text in enumerate(texts):
                while split_of(name := f"{split}{n:04d}_{k}.py", val_fraction) != split:
                    k += 1
                (root / name).write_text(text, encoding="utf-8")
        return root
    return write


@pytest.fixture(scope="session")
def memorise(tok: Tokenizer) -> Callable:
    """``memorise(model, conv, steps, out_dir, max_length, max_prompt_length)``: SFT ``model`` on the
    one conversation ``conv`` for ``steps`` steps (the real renderer, collator and trainer) until it
    reproduces it."""
    from codechat.chat.budget import render_with_budget
    from codechat.config.sft import SFTConfig
    from codechat.config.stages import OptimConfig, RunConfig, TrainConfig
    from codechat.data.sft import collate
    from codechat.train.trainer import Trainer

    def fit(model, conv, steps: int, out_dir: Path, max_length: int, max_prompt_length: int) -> None:
        ex = render_with_budget(tok, conv, SFTConfig(max_length=max_length, max_prompt_length=max_prompt_length,
                                                     decontaminate=False))
        batch = collate([[ex]], pad_id=tok.end_id, pad_to_multiple=1, packed=False)

        class Same:
            def next_batch(self):
                return batch

            def state_dict(self):
                return {}

            def load_state_dict(self, s):
                pass
        Trainer(model, train=TrainConfig(max_steps=steps, log_every=steps), optim=OptimConfig(lr=3e-3, warmup_steps=5),
                run=RunConfig(out=str(out_dir)), batches=Same(), out_dir=out_dir, show_progress=False).fit()
    return fit


EXECUTORS = textwrap.dedent('''
    from pathlib import Path


    def weather(city: str) -> dict:
        """Current weather of a city.

        Args:
            city: the city's name.
        """
        Path(__file__).with_name("ran.txt").write_text(city)
        return {"temp_c": 21}
''')


@pytest.fixture(scope="session")
def funcall_stage(tok, tok_dir, tmp_path_factory, memorise):
    """``(stage directory, executors file)``: a tiny model SFT'd on one conversation (call
    weather(Tokyo), read 21, say so) and the file declaring ``weather``."""
    import torch

    from codechat import checkpoint as ckpt
    from codechat.chat.conversation import Conversation, Message
    from codechat.config.stages import ModelConfig, to_dict
    from codechat.model import build_model
    from codechat.tools import load_executors
    tmp = tmp_path_factory.mktemp("funcall")
    (tmp / "tools_demo.py").write_text(EXECUTORS)
    [tool] = load_executors(tmp / "tools_demo.py")
    conv = Conversation([Message("user", "Weather in Tokyo?"),
                         Message("assistant", "", {"name": "weather", "arguments": {"city": "Tokyo"}}),
                         Message("function_response", '{"temp_c": 21}'),
                         Message("assistant", "It is 21 C in Tokyo.")], (tool.schema(),))
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, n_layer=2, n_embd=64, n_head=2, n_kv_head=1,
                                    max_seq_len=256))
    memorise(model, conv, 120, tmp, max_length=256, max_prompt_length=224)
    stage = ckpt.save(tmp / "sft" / "checkpoints", 120, model=model.state_dict(),
                      state={"step": 120, "meta": {"stage": "sft", "model": to_dict(model.cfg)}},
                      tokenizer_dir=tok_dir).parent.parent
    return stage, tmp / "tools_demo.py"


@contextlib.contextmanager
def benchmark_module(name: str):
    """``benchmarks/NAME.py`` imported as a module (its ``main`` not run), forgotten on exit; its folder
    is on ``sys.path`` meanwhile, as when the script runs (the scripts import each other's helpers)."""
    import importlib.util
    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
        sys.path.remove(str(folder))


def save_random_base(tok_dir: Path, vocab_size: int, out: Path) -> Path:
    """A randomly initialised 2-layer model (seed 0, 128 positions) saved as a pretraining checkpoint under
    ``out/checkpoints`` with the tokenizer ``tok_dir``; returns the checkpoint directory."""
    import torch

    from codechat import checkpoint as ckpt
    from codechat.config.stages import ModelConfig, to_dict
    from codechat.model import build_model
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=vocab_size, n_layer=2, n_embd=64, n_head=2, n_kv_head=1,
                                    max_seq_len=128))
    return ckpt.save(out / "checkpoints", 0, model=model.state_dict(),
                     state={"step": 0, "meta": {"stage": "pretrain", "model": to_dict(model.cfg)}},
                     tokenizer_dir=tok_dir)


def hide_module(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    """For the rest of the test, ``import`` of any module whose name starts with ``prefix`` raises
    ImportError, as when an optional extra (``llguidance``: ``codechat[grammar]``) is not installed."""
    real = builtins.__import__

    def guarded(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith(prefix):
            raise ImportError(name)
        return real(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", guarded)


@contextlib.contextmanager
def serve_in_thread(model: Any, tok: Tokenizer, *, slots: int, queue_size: int, config: Any = None,
                    api_key: str | None = None):
    """The base URL of ``codechat serve``'s app over ``model`` (uvicorn on 127.0.0.1 in a thread of
    this process, an engine of ``slots`` slots and ``queue_size`` waiting rows, ``config`` a
    ``ServeConfig``, requiring ``api_key`` when given); stopped on exit."""
    import threading

    import uvicorn

    from codechat.engine import Engine, EngineConfig
    from codechat.serve.app import create_app
    from codechat.serve.config import ServeConfig
    from codechat.serve.worker import EngineWorker
    worker = EngineWorker(Engine(model, EngineConfig(slots=slots)), queue_size=queue_size).start()
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(worker, tok, config or ServeConfig(), api_key=api_key),
                                        host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        yield url
    finally:
        srv.should_exit = True
        thread.join(10)
        worker.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None = None, log: Path | None = None,
                 timeout: float = 120.0) -> None:
    """Poll ``url``/health until it answers 200; fails with the server's ``log`` if it died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode}:\n{log.read_text() if log else ''}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"{url} did not answer /health within {timeout} s")


def http(method: str, url: str, body: object = None, *, key: str | None = None, headers: dict | None = None,
         timeout: float = 60.0) -> tuple[int, dict[str, str], object]:
    """One HTTP request with the standard library: ``(status, headers, body)``, header names in
    lower case, the body decoded from JSON when it is JSON. ``body`` is sent as is when bytes,
    else as JSON."""
    import json
    import urllib.error
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    h = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, hdrs, raw = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, e.headers, e.read()
    hdrs = {k.lower(): v for k, v in hdrs.items()}
    try:
        return status, hdrs, json.loads(raw)
    except ValueError:
        return status, hdrs, raw.decode()


@dataclass(frozen=True)
class Served:
    """A running ``codechat serve``: its base ``url``, the ``api_key`` it requires, the ``stage``
    it serves, its ``log`` file and its limits."""

    url: str
    api_key: str
    stage: Path
    log: Path
    max_messages: int
    max_body_bytes: int
    max_n: int
    slots: int
    queue_size: int


@pytest.fixture(scope="session")
def served(funcall_stage, tmp_path_factory):
    """``codechat serve --model funcall_stage`` in a subprocess on a free port of 127.0.0.1 (the engine
    in a process of its own, the default: the servers in a thread of the tests' process,
    :func:`serve_in_thread`, run it in a thread), the key from ``CODECHAT_API_KEY``; 16 slots and room
    for 64 rows, small message and body limits."""
    stage, _ = funcall_stage
    port, key = free_port(), "test-key-123"
    log = tmp_path_factory.mktemp("served") / "server.log"
    s = Served(f"http://127.0.0.1:{port}", key, stage, log, max_messages=64, max_body_bytes=64_000, max_n=8, slots=16,
               queue_size=48)
    proc = subprocess.Popen([sys.executable, "-m", "codechat", "serve", "--model", str(stage), "--port", str(port),
                             "--device", "cpu", "--slots", str(s.slots), "--queue-size", str(s.queue_size),
                             "--max-messages", str(s.max_messages), "--max-body-bytes", str(s.max_body_bytes),
                             "--max-n", str(s.max_n), "--log-level", "warning"],
                            env={**os.environ, "CODECHAT_API_KEY": key}, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    try:
        wait_healthy(s.url, proc, log)
        yield s
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def saved_for_backward(model: Any, step: Callable, x: Any, y: Any) -> int:
    """Bytes of the storages one step of ``step(x, y)`` (``model``, compiled or not; bf16 autocast on the CPU)
    saves for its backward, each storage once, leaving out ``model``'s parameters and buffers, the inputs
    and tensors shaped as a parameter (the autocast copies of the weights are the planner's buffers); then runs
    the backward."""
    import torch
    skip = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers(), x, y)}
    weight_shapes = {tuple(p.shape) for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in skip and tuple(t.shape) not in weight_shapes:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", torch.bfloat16):
        loss = step(x, y)
    loss.backward()
    return sum(saved.values())
