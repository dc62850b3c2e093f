"""`aiayn serve`'s limit flags: each reaches its ServeConfig field (or the server call),
their bad values are one-line errors before anything is served, and a max_batch_tokens
below its default really bounds the batches."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

import aiayn.serve
from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.cli import main
from aiayn.serve import ServeConfig
from sample_data import PAIRS
from serve_util import ControlledTranslator, live_server, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def served(monkeypatch, sample_model_dir):
    """Run ``aiayn serve`` with the given flags up to the server call, which records what
    it was given instead of serving; (exit code, calls)."""
    calls: list[dict] = []

    def fake_serve(translator, cfg, host, port, threads):
        calls.append({"cfg": cfg, "host": host, "port": port, "threads": threads})

    monkeypatch.setattr(aiayn.serve, "serve", fake_serve)

    def run(*flags: str) -> tuple[int, list[dict]]:
        calls.clear()
        return main(["serve", "--model", str(sample_model_dir()), *flags]), calls

    return run


def test_each_limit_flag_reaches_its_field(served):
    code, calls = served(
        "--max-batch-tokens", "512", "--max-cache-tokens", "9000", "--request-timeout", "2.5",
        "--batch-wait-ms", "7", "--no-continuous", "--worker", "thread", "--max-queue", "33",
        "--max-sentences", "5", "--threads", "1", "--host", "127.0.0.2", "--port", "8123",
        "--cors-origin", "http://localhost:3000", "--cors-origin", "https://app.example:8443",
    )  # fmt: skip
    assert code == 0 and len(calls) == 1
    cfg = calls[0]["cfg"]
    assert (cfg.max_batch_tokens, cfg.max_cache_tokens, cfg.request_timeout_s) == (512, 9000, 2.5)
    assert (cfg.batch_wait_ms, cfg.continuous, cfg.worker) == (7.0, False, "thread")
    assert (cfg.max_queue, cfg.max_sentences) == (33, 5)
    assert (calls[0]["host"], calls[0]["port"], calls[0]["threads"]) == ("127.0.0.2", 8123, 1)
    assert cfg.cors_origins == ("http://localhost:3000", "https://app.example:8443")


def test_no_flag_keeps_every_default(served):
    code, calls = served()
    assert code == 0
    cfg, default = calls[0]["cfg"], ServeConfig()
    for field in (
        "max_batch_tokens", "max_cache_tokens", "request_timeout_s", "batch_wait_ms",
        "continuous", "worker", "max_queue", "max_sentences", "api_key", "cors_origins",
    ):  # fmt: skip
        assert getattr(cfg, field) == getattr(default, field), field
    assert (calls[0]["host"], calls[0]["port"], calls[0]["threads"]) == ("127.0.0.1", 8000, None)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--request-timeout", "0"], "--request-timeout must be > 0 seconds, got 0.0"),
        (["--request-timeout", "-3"], "--request-timeout must be > 0 seconds, got -3.0"),
        (["--request-timeout", "nan"], "--request-timeout must be > 0 seconds, got nan"),
        (["--max-cache-tokens", "0"], "--max-cache-tokens must be >= 1, got 0"),
        (["--max-cache-tokens", "-5"], "--max-cache-tokens must be >= 1, got -5"),
        (
            ["--threads", "0"],
            "--threads must be in 1..",
        ),
        (["--threads", "100000"], "--threads must be in 1..1024, got 100000"),
        (["--batch-wait-ms", "nan"], "--batch-wait-ms must be in [0, 60000], got nan"),
        (["--batch-wait-ms", "inf"], "--batch-wait-ms must be in [0, 60000], got inf"),
        (["--batch-wait-ms", "-1"], "--batch-wait-ms must be in [0, 60000], got -1.0"),
        (["--max-sentences", "0"], "--max-sentences must be >= 1, got 0"),
        (["--api-key-env", ""], "--api-key-env names no environment variable"),
        (["--api-key-env", "AIAYN_TEST_BLANK_KEY"], "AIAYN_TEST_BLANK_KEY holds no API key"),
        (["--cors-origin", "localhost:3000"], "--cors-origin localhost:3000: is not an origin"),
    ],
)
def test_bad_limits_are_one_line_errors_before_serving(served, capsys, monkeypatch, flags, message):
    monkeypatch.setenv("AIAYN_TEST_BLANK_KEY", " \n")  # whitespace only: no key
    code, calls = served(*flags)
    err = capsys.readouterr().err
    assert code == 2 and calls == []
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert "Traceback" not in err


def test_a_small_max_batch_tokens_bounds_each_batch(sample_model_dir):
    """Six one-sentence requests queue while the model is held; with room for three of
    them per batch they run in batches of at most three; a request over the limit alone
    runs alone, whole."""
    translator = ControlledTranslator(*load_model(resolve_checkpoint(sample_model_dir())))
    shapes: list[tuple[int, int]] = []  # (sentences, longest source) per batch started
    continuous_search = translator.continuous_search

    def recording(*args, **kwargs):
        search = continuous_search(*args, **kwargs)
        add = search.add

        def recorded(src, tags, **settings):
            if len(search):  # continuous batching is off: jobs join an empty batch only
                raise AssertionError(f"{len(tags)} sentences joined a running batch")
            shapes.append((len(tags), src.size(1)))
            return add(src, tags, **settings)

        search.add = recorded
        return search

    translator.continuous_search = recording
    sentence = PAIRS[0][0]
    length = len(translator.encode(sentence)) + 1  # with its EOS
    limit = 3 * length
    assert limit < ServeConfig().max_batch_tokens
    cfg = ServeConfig(worker="thread", continuous=False, max_batch_tokens=limit, batch_wait_ms=50)
    with live_server(translator, cfg) as base:
        shapes.clear()
        translator.entered.clear()
        translator.gate.clear()
        answers: list[httpx.Response] = []

        def post(src: list[str]) -> threading.Thread:
            body = {"src": src, "beam": 1}
            thread = threading.Thread(
                target=lambda: answers.append(
                    httpx.post(f"{base}/translate", json=body, timeout=60)
                )
            )
            thread.start()
            return thread

        threads = [post([sentence])]
        wait_for(translator.entered.is_set, "the first batch held")
        threads += [post([sentence]) for _ in range(5)]
        wait_for(lambda: _gauge(base, "aiayn_queue_sentences") == 5, "five queued")
        translator.gate.set()
        for t in threads:
            t.join(60)
        assert [r.status_code for r in answers] == [200] * 6
        assert sum(n for n, _ in shapes) == 6 and all(n <= 3 for n, _ in shapes), shapes
        assert max(n for n, _ in shapes) == 3  # they did batch, up to the limit
        assert all(n * longest <= limit for n, longest in shapes), shapes
        shapes.clear()
        post([sentence] * 4).join(60)  # 4 x length > limit: runs alone, whole
        assert answers[-1].status_code == 200 and len(answers[-1].json()["translations"]) == 4
        assert shapes == [(4, length - 1)] or shapes == [(4, length)], shapes


def _gauge(base: str, name: str) -> float:
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return math.nan


def test_a_key_read_with_its_newline_is_the_key(served, monkeypatch):
    monkeypatch.setenv("AIAYN_TEST_KEY", "s3cret\n")  # as `KEY=$(cat key.txt)` may leave it
    code, calls = served("--api-key-env", "AIAYN_TEST_KEY")
    assert code == 0 and calls[0]["cfg"].api_key == "s3cret"


def test_serve_says_where_it_listens_once_it_accepts_connections(sample_model_dir):
    """`aiayn serve --port 0` names the port it was given, and only once it accepts
    connections (the model worker started): a script that waits for the line may send its
    first request at once, with no retry. The line came when the port was bound, seconds
    before the worker had the model, and such a first request was refused."""
    cmd = [sys.executable, "-m", "aiayn", "serve", "--model", str(sample_model_dir())]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*cmd, "--port", "0", "--threads", "1"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if found := re.match(r"aiayn serve: listening on (http://127\.0\.0\.1:(\d+))$", line):
                break
        assert found and int(found[2]) > 0, lines
        response = httpx.post(f"{found[1]}/translate", json={"src": [PAIRS[0][0]]}, timeout=60)
        assert response.status_code == 200 and response.json()["translations"][0]
        assert sum("listening on" in line for line in lines) == 1
        assert h2c_offer(int(found[2])).startswith(b"HTTP/1.1 200 ")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def h2c_offer(port: int) -> bytes:
    """All the server answers to a POST that offers an HTTP/2 upgrade, as Java's HttpClient
    and `curl --http2` do, its body sent after the headers. The offer may be ignored (RFC
    9110, 7.8); httptools dropped the body instead (a 400 "not valid JSON"), and then read
    it as a second request (a second 400 nobody asked for)."""
    body = json.dumps({"src": [PAIRS[0][0]]}).encode()
    head = (
        "POST /translate HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(head.encode())
        time.sleep(0.2)  # the body in a write of its own
        conn.sendall(body)
        answer = b""
        conn.settimeout(5)  # for the answer and anything after it: none should come
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except TimeoutError:  # keep-alive: the server waits for the next request
            pass
    assert answer.count(b"HTTP/1.1 ") == 1, answer
    return answer
