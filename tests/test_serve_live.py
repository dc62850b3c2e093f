"""`aiayn serve` under real concurrency: many parallel requests batched together, each
answered with exactly its own translations; SIGTERM lets a request in flight finish, and
one still running when the grace period ends gets a 503."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.serve import ServeConfig
from aiayn.translator import Translator
from sample_data import PAIRS
from serve_util import ControlledTranslator, live_server, wait_for, wait_ready

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(240)

SETTINGS = [
    {"beam": 1},
    {"beam": 4},
    {"beam": 4},
    {"beam": 3, "n_best": 2, "alpha": 0.2},
]


@pytest.mark.parametrize(
    "worker, continuous",
    [("thread", True), ("thread", False), ("process", True)],
    ids=["continuous", "whole-batches", "worker-process"],
)
def test_parallel_requests_get_exactly_their_own_translations(sample_model_dir, worker, continuous):
    # The thread worker runs a ControlledTranslator here, which records its batches; the
    # process worker needs a plain (picklable) Translator, and /metrics tells its batches.
    translator = ControlledTranslator(*load_model(resolve_checkpoint(sample_model_dir())))
    served = translator
    if worker == "process":
        served = Translator(translator.model, translator.tokenizer)
    rng = random.Random(0)
    german = [de for de, _ in PAIRS]
    requests = []
    for i in range(60):  # 1-3 sentences each, several settings, some blank lines
        src = rng.sample(german, rng.randint(1, 3))
        if i % 10 == 3:
            src.append("")
        requests.append({"src": src, **SETTINGS[i % len(SETTINGS)]})
    # What the Translator gives for each request's sentences on their own.
    expected = []
    for req in requests:
        out = translator.translate(
            req["src"], beam=req["beam"], alpha=req.get("alpha", 0.6), n_best=req.get("n_best", 1)
        )
        expected.append(out)

    # Requests of another beam size wait up to 100 steps for the running batch (not the
    # default 8): long enough, with these short runs of mixed settings, to see joins.
    cfg = ServeConfig(worker=worker, batch_wait_ms=30, continuous=continuous, join_wait_steps=100)
    with live_server(served, cfg) as base:
        translator.forget()

        def send(i_request: tuple[int, dict]) -> httpx.Response:
            # Arrivals spread over 0-70 ms, as clients' are: answered without Nagle's 40 ms
            # each, 16 requests at once would otherwise meet a batch just finished together.
            time.sleep(i_request[0] % 8 * 0.01)
            return client.post(f"{base}/translate", json=i_request[1])

        with httpx.Client(timeout=60) as client, ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(send, enumerate(requests)))
        metrics = httpx.get(f"{base}/metrics").text

    for req, answer, want in zip(requests, answers, expected):
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["translations"] == [c[0] for c in want], req
        if req.get("n_best", 1) > 1:
            assert body["n_best"] == want
    # Requests really were batched together: a batch held more sentences than any single
    # request, and fewer batches ran than there were requests; continuously, sentences
    # joined batches that were running, and without, never.
    most = max(len(r["src"]) for r in requests)
    if worker == "process":
        assert most <= 4
        at_most = re.search(r'aiayn_batch_sentences_bucket\{le="4"\} (\d+)', metrics)
        batches = re.search(r"aiayn_batch_sentences_count (\d+)", metrics)
        assert int(at_most.group(1)) < int(batches.group(1)), metrics  # bigger ones ran
    elif continuous:
        assert max(translator.steps) > most, translator.steps
        assert translator.late_joins >= 5, translator.joins
        assert 0 < len(translator.batches) < len(requests) // 4, translator.batches
    else:
        assert max(translator.batches) > most, translator.batches
        assert len(translator.batches) < len(requests), translator.batches
        assert translator.late_joins == 0, translator.joins
    sentences = sum(len(r["src"]) for r in requests) + 1  # + the warm-up sentence
    assert f"aiayn_sentences_translated_total {sentences}\n" in metrics
    assert re.search(r'aiayn_requests_total\{path="/translate",status="200"\} 60\n', metrics)


SERVE = """\
import socket, sys
from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.serve import serve
from serve_util import GatedTranslator
translator = GatedTranslator(*load_model(resolve_checkpoint(sys.argv[1])), sys.argv[2])
sock = socket.socket(fileno=int(sys.argv[3]))
serve(translator, threads=1, sock=sock, graceful_s=float(sys.argv[4]))
"""


@contextlib.contextmanager
def gated_server(model_dir: Path, tmp_path: Path, graceful_s: float):
    """`serve` in a process of its own, on a socket bound here and handed over (no port
    found free, closed and reused), with a translator that holds its batches at a gate
    (``tmp_path / "gate"``, armed once the server is ready). Yields the process, its URL
    and the gate; the log (``serve.log``) must hold no traceback."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    paths = [str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    log = (tmp_path / "serve.log").open("w")
    gate = tmp_path / "gate"
    gate.mkdir()
    cmd = [sys.executable, "-c", SERVE, str(model_dir), str(gate), str(sock.fileno())]
    proc = subprocess.Popen(
        [*cmd, str(graceful_s)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        pass_fds=[sock.fileno()],
    )
    sock.close()  # the server holds it now
    try:
        wait_ready(base, timeout=60)
        (gate / "armed").touch()
        yield proc, base, gate
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


def _post_at_the_gate(base: str, gate: Path) -> tuple[threading.Thread, list]:
    body = {"src": [de for de, _ in PAIRS[:64]], "beam": 12, "n_best": 2}
    answer: list = []
    thread = threading.Thread(
        target=lambda: answer.append(httpx.post(f"{base}/translate", json=body, timeout=120))
    )
    thread.start()
    wait_for(lambda: (gate / "entered").exists(), "the request at the gate", 60)
    return thread, answer


def test_sigterm_lets_the_request_in_flight_finish(sample_model_dir, tmp_path):
    """SIGTERM comes while a request is known to be running, the server stops listening,
    and only then is the gate opened; the request still gets its whole answer."""
    with gated_server(sample_model_dir(), tmp_path, graceful_s=30) as (proc, base, gate):
        thread, answer = _post_at_the_gate(base, gate)
        proc.send_signal(signal.SIGTERM)

        def refused() -> bool:
            try:
                httpx.get(f"{base}/health", timeout=5)
            except httpx.ConnectError:
                return True
            except (httpx.RemoteProtocolError, httpx.ReadError):
                # Accepted just as the shutdown began, and closed unanswered (uvicorn
                # closes connections with no request under way): not closed yet, ask again.
                return False
            return False

        wait_for(refused, "the port closed after SIGTERM", 30)  # shutting down
        assert thread.is_alive() and not answer  # the request is still waiting
        (gate / "open").touch()
        thread.join(120)
        # uvicorn re-raises the signal once it has shut down cleanly (exit by SIGTERM).
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        response = answer[0]
        assert response.status_code == 200, response.text
        assert len(response.json()["translations"]) == 64


def test_a_request_still_running_when_the_grace_period_ends_gets_a_503(sample_model_dir, tmp_path):
    """Past the grace period uvicorn cancels the request: it gets a JSON 503 saying so (it
    was a bare 500, and a traceback in the log), and the server still exits cleanly."""
    with gated_server(sample_model_dir(), tmp_path, graceful_s=0.5) as (proc, base, gate):
        thread, answer = _post_at_the_gate(base, gate)
        proc.send_signal(signal.SIGTERM)
        thread.join(60)  # the gate stays shut: the batch is still running
        response = answer[0]
        assert response.status_code == 503, response.text
        message = response.json()["error"]["message"]
        assert message == "the server stopped before this translation finished"
        (gate / "open").touch()  # the worker finishes its step and stops
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)


def test_a_body_still_arriving_when_the_grace_period_ends_gets_a_503(sample_model_dir, tmp_path):
    """Cancelled while it read a slow client's body (not while it waited for the model),
    the request got uvicorn's bare text/plain 500, and the log a traceback."""
    with gated_server(sample_model_dir(), tmp_path, graceful_s=0.5) as (proc, base, _):
        body = json.dumps({"src": ["Ein Hund."], "beam": 1}).encode()
        head = "POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(body)}\r\n\r\n"
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=60) as client:
            client.sendall(head.encode() + body[:5])  # the rest never comes
            time.sleep(1)  # the request is read: its handler waits for the body
            proc.send_signal(signal.SIGTERM)
            reply = b""
            while chunk := client.recv(65536):
                reply += chunk
        status, _, rest = reply.partition(b"\r\n")
        assert status.startswith(b"HTTP/1.1 503"), reply
        error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
        assert error["message"] == "the server stopped before this translation finished"
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)


def test_serve_cli_errors_are_one_line(sample_model_dir, tmp_path, capsys):
    from aiayn.cli import main

    assert main(["serve", "--model", str(tmp_path / "none")]) == 2
    assert "no such model directory" in capsys.readouterr().err
    assert (
        main(["serve", "--model", str(sample_model_dir()), "--api-key-env", "AIAYN_NO_SUCH"]) == 2
    )
    assert "AIAYN_NO_SUCH holds no API key" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert main(["serve", "--model", str(sample_model_dir()), "--port", port]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_serve_cli_keeps_no_model_in_the_server_process(sample_model_dir, monkeypatch):
    """With the worker process (the default) the weights live there alone: once the app
    is made, nothing in this process refers to the model that `aiayn serve` loaded."""
    import gc
    import weakref

    import uvicorn

    from aiayn.cli import main, serving

    loaded, load = [], serving.translator_for

    def recording(*args, **kwargs):
        translator = load(*args, **kwargs)
        loaded.append(weakref.ref(translator.model))
        return translator

    held: list[bool] = []

    def run(self, sockets=None):  # where the server would serve: is the model still here?
        gc.collect()
        held.append(loaded[0]() is not None)
        for sock in sockets or []:
            sock.close()

    monkeypatch.setattr(serving, "translator_for", recording)
    monkeypatch.setattr(uvicorn.Server, "run", run)
    assert main(["serve", "--model", str(sample_model_dir()), "--port", "0"]) == 0
    assert held == [False], "the server process still holds the model"


NODELAY_SERVE = """\
import socket, sys
from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.serve import serve
from aiayn.translator import Translator
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0)  # proto 0: as socket.socket()
sock.bind(("127.0.0.1", 0))
print("listening on http://127.0.0.1:%d" % sock.getsockname()[1], file=sys.stderr, flush=True)
serve(Translator(*load_model(resolve_checkpoint(sys.argv[1]))), threads=1, sock=sock)
"""


@pytest.mark.parametrize("how", ["cli", "own-socket"])
def test_answers_on_a_kept_alive_connection_do_not_wait_for_a_delayed_ack(sample_model_dir, how):
    """Nagle's algorithm held each answer's body (uvicorn sends it apart from the head) until
    the client's delayed ACK: every request after the first on a kept-alive connection
    (browsers, pooled clients) took about 40 ms more, on the socket `aiayn serve` makes and
    on one the caller hands to serve(). The fastest of 10 then took >= 40 ms; now ~1 ms."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    model = str(sample_model_dir())
    cmd = [sys.executable, "-m", "aiayn", "serve", "--model", model, "--port", "0"]
    if how == "own-socket":
        cmd = [sys.executable, "-c", NODELAY_SERVE, model]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        base = next(ln.split("listening on ")[1].strip() for ln in proc.stderr if "listening" in ln)
        wait_ready(base, timeout=60)
        with httpx.Client(timeout=10) as client:
            client.post(f"{base}/translate", json={"src": ["Ein Hund."]}).raise_for_status()
            times = []
            for _ in range(10):
                start = time.perf_counter()
                client.get(f"{base}/health").raise_for_status()
                times.append(time.perf_counter() - start)
        assert min(times) < 0.03, times
    finally:
        proc.kill()
        proc.wait()


def test_a_second_ctrl_c_quits_at_once_and_takes_the_worker_along(sample_model_dir):
    """uvicorn offers a second Ctrl-C to force quit while a request is in flight; that
    skips the app's shutdown, and the server then waited forever at exit for its worker
    process (which ignores the SIGTERM multiprocessing sends it). Now it exits (130) at
    once and the worker process is gone too, without the tracebacks of the request and
    lifespan tasks that uvicorn cancels (their CancelledError, logged as errors)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "aiayn", "serve", "--model", str(sample_model_dir())]
    proc = subprocess.Popen(
        [*cmd, "--port", "0", "--threads", "1"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "listening on" in line:
                base = line.split("listening on ")[1].strip()
                break
        wait_ready(base, timeout=60)
        worker = httpx.get(f"{base}/info").json()["worker"]["pid"]
        host, port = base.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port))) as client:  # a body still coming
            head = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            client.sendall(head + b'Content-Length: 30\r\n\r\n{"src"')
            proc.send_signal(signal.SIGINT)
            wait_for(lambda: "Waiting for connections" in proc.stderr.readline(), "draining", 30)
            proc.send_signal(signal.SIGINT)  # force quit
            _, rest = proc.communicate(timeout=30)
            assert proc.returncode == 130
        assert rest.splitlines()[-1] == "interrupted"
        assert "Traceback" not in rest and "Error" not in rest, rest
        stat = Path(f"/proc/{worker}/stat")  # gone, or a zombie for init to reap
        wait_for(lambda: not stat.exists() or stat.read_text().split()[2] == "Z", "no worker", 10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
