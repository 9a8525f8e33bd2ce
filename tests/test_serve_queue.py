"""The server's bounded queue and disconnects, on a real uvicorn server in a thread of this process:
one cache slot and one waiting row, a model whose greedy rows never stop on their own (its control
ids' logits are 0, below the best of ~2000 random ones), so a request runs until its client leaves.
Over the bound a request gets 429 with ``Retry-After``; a client that disconnects, streaming or
not, frees its slot and the waiting request takes it."""
from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.client import HTTPConnection

import pytest
import torch
import uvicorn
from conftest import free_port, http, wait_healthy

from codechat.config.stages import ModelConfig
from codechat.engine import Engine, EngineConfig
from codechat.model import build_model
from codechat.serve.app import create_app
from codechat.serve.config import ServeConfig
from codechat.serve.worker import EngineWorker

LONG = 4000  # tokens a long request asks for: seconds of decoding, far more than a test step takes


@pytest.fixture(scope="module")
def server(tok):
    """``(url, worker)`` of a server with 1 slot and a queue of 1 row over a never-stopping model."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, n_layer=4, n_embd=128, n_head=4, n_kv_head=2,
                                    max_seq_len=LONG + 64))
    with torch.no_grad():
        model.lm_head.weight[sorted(tok.special_ids)] = 0.0
    worker = EngineWorker(Engine(model.eval(), EngineConfig(slots=1)), queue_size=1).start()
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(worker, tok, ServeConfig(retry_after_s=7)), host="127.0.0.1",
                                        port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        yield url, worker
    finally:
        srv.should_exit = True
        thread.join(10)
        worker.close()


def health(url: str) -> dict:
    return http("GET", url + "/health")[2]


def wait_for(url: str, **want: int) -> dict:
    """Poll /health until its fields equal ``want`` (10 s at most)."""
    deadline = time.monotonic() + 10
    while (h := health(url)) and any(h[k] != v for k, v in want.items()):
        assert time.monotonic() < deadline, f"/health is {h}, expected {want}"
        time.sleep(0.05)
    return h


def open_request(url: str, stream: bool, max_tokens: int = LONG) -> HTTPConnection:
    """Send a chat request on a connection of its own, leaving the answer unread."""
    conn = HTTPConnection(url.removeprefix("http://"), timeout=30)
    body = {"model": "codechat", "messages": [{"role": "user", "content": "go on"}], "temperature": 0,
            "max_tokens": max_tokens, "stream": stream}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn


def test_over_the_bound_is_429_and_a_client_that_leaves_frees_its_slot(server):
    url, _ = server
    a = open_request(url, stream=True)
    b = None
    try:
        first = a.getresponse()
        assert first.status == 200 and first.readline().startswith(b"data: {")  # the opening chunk
        wait_for(url, running=1, waiting=0, in_flight=1)
        b = open_request(url, stream=True)
        assert b.getresponse().status == 200
        wait_for(url, running=1, waiting=1, in_flight=2)
        status, headers, body = http("POST", url + "/v1/chat/completions",
                                     {"model": "codechat", "messages": [{"role": "user", "content": "hi"}]})
        assert status == 429 and headers["retry-after"] == "7"
        assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == "queue_full"
    finally:
        a.close()  # A leaves mid-stream: its slot frees and B, which waited, runs
    try:
        wait_for(url, running=1, waiting=0, in_flight=1)
    finally:
        b and b.close()
    wait_for(url, running=0, waiting=0, in_flight=0)
    status, _, body = http("POST", url + "/v1/chat/completions",  # greedy: sampled, a control id may come first
                           {"model": "codechat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                            "temperature": 0})
    assert status == 200 and body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 5


def test_a_client_that_leaves_before_a_whole_answer_frees_its_slot(server):
    url, _ = server
    c = open_request(url, stream=False)
    try:
        wait_for(url, running=1, in_flight=1)
    finally:
        c.close()
    wait_for(url, running=0, waiting=0, in_flight=0)


def test_more_choices_than_the_server_ever_holds_is_400_and_as_many_as_it_holds_run(server):
    url, _ = server
    ask = {"model": "codechat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    status, _, body = http("POST", url + "/v1/chat/completions", {**ask, "n": 3})  # 3 rows, capacity 2
    assert status == 400 and body["error"]["param"] == "n" and "holds at once (2" in body["error"]["message"]
    status, _, body = http("POST", url + "/v1/chat/completions", {**ask, "n": 2, "seed": 5, "temperature": 1})
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 6 and health(url)["in_flight"] == 0


def test_a_client_that_leaves_while_sending_its_body_is_not_an_error(server, caplog):
    url, _ = server
    caplog.set_level(logging.INFO, logger="codechat.serve")
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", int(url.rpartition(":")[2]))) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"model\": \"codechat\", \"mess")
            time.sleep(0.1)
    time.sleep(0.5)  # the server reads on and finds the client gone
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert health(url)["in_flight"] == 0
