"""The model worker in a process of its own (the server's default): errors keep their
meaning across the pipe, a worker that dies fails the waiting requests instead of hanging
them, a client that goes away is dropped, and a translator that cannot be copied is one
clear error. (Most API tests, and the parallel-requests test, run this worker too.)"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
from fastapi.testclient import TestClient

from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.errors import AiaynError
from aiayn.serve import ServeConfig, create_app, process
from aiayn.serve.server import WorkerDiedError, serve
from aiayn.translator import Translator
from sample_data import PAIRS
from serve_util import (
    BrokenTranslator,
    ControlledTranslator,
    GatedTranslator,
    SlowTranslator,
    gauges,
    live_server,
    serving,
    wait_for,
    wait_ready,
    wait_warmed_up,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def parts(sample_model_dir):
    return load_model(resolve_checkpoint(sample_model_dir()))


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_a_failing_model_is_a_500_and_ready_says_why(parts, worker):
    with TestClient(create_app(BrokenTranslator(*parts), ServeConfig(worker=worker))) as c:
        r = wait_warmed_up(c)
        assert r.status_code == 503
        assert "warm-up translation failed: the model fell over" in r.json()["reason"]
        for beam in (1, 4):  # a whole batch, and a continuous one
            r = c.post("/translate", json={"src": ["Ein Hund."], "beam": beam})
            assert r.status_code == 500, r.text
            assert r.json()["error"]["message"] == (
                "translation failed: RuntimeError: the model fell over"
            )
        assert c.get("/health").status_code == 200
        assert "aiayn_batch_errors_total 3" in c.get("/metrics").text  # + the warm-up


def test_the_queue_limit_holds_across_the_pipe(parts):
    # Whole batches (continuous off): a request queued behind a running one stays queued.
    app = create_app(SlowTranslator(*parts, step_s=0.2), ServeConfig(max_queue=2, continuous=False))
    with serving(app) as base, httpx.Client(base_url=base, timeout=60) as client:
        answers: dict[str, httpx.Response] = {}

        def send(name: str, src: list[str]) -> threading.Thread:
            body = {"src": src, "beam": 4}
            post = lambda: answers.__setitem__(name, client.post("/translate", json=body))  # noqa: E731
            thread = threading.Thread(target=post)
            thread.start()
            return thread

        threads = [send("running", ["Ein Hund."])]
        wait_for(lambda: gauges(base)["aiayn_running_sentences"] == 1, "the first one running")
        threads.append(send("queued", ["Eine Katze.", "Ein Mann."]))
        wait_for(lambda: gauges(base)["aiayn_queue_sentences"] == 2, "the second one queued")
        r = client.post("/translate", json={"src": ["Eine Frau."]})
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        assert "the queue is full" in r.json()["error"]["message"]
        # More sentences than the queue ever holds: no retry would help, so 413, not 429.
        r = client.post("/translate", json={"src": ["Ein Hund.", "Eine Katze.", "Ein Mann."]})
        assert r.status_code == 413, r.text
        assert r.json()["error"]["message"] == (
            "this request has 3 sentences, more than the queue holds (2)"
        )
        for t in threads:
            t.join(60)
        assert [answers[k].status_code for k in ("running", "queued")] == [200, 200]
        assert len(answers["queued"].json()["translations"]) == 2
        assert client.post("/translate", json={"src": ["Ein Hund."]}).status_code == 200
        metrics = client.get("/metrics").text
        assert 'aiayn_jobs_total{outcome="failed"} 0' in metrics  # refusals are no failures
        assert 'aiayn_jobs_total{outcome="done"} 4' in metrics  # + the warm-up


def test_a_killed_worker_fails_the_8_requests_in_flight_and_health_says_why(parts):
    deaths: list[str] = []
    app = create_app(
        SlowTranslator(*parts, step_s=0.2), ServeConfig(join_ratio=0), on_worker_death=deaths.append
    )
    with serving(app) as base, httpx.Client(base_url=base, timeout=60) as client:
        answers: list[httpx.Response] = []

        def send(sentence: str) -> None:
            answers.append(client.post("/translate", json={"src": [sentence], "beam": 4}))

        threads = [threading.Thread(target=send, args=(de,)) for de, _ in PAIRS[:8]]
        for t in threads:
            t.start()
        wait_for(lambda: gauges(base)["aiayn_jobs_pending"] == 8, "8 requests in flight")
        os.kill(_worker_pid(base), signal.SIGKILL)
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a request was left hanging"
        reason = "the model worker process has stopped (exit code -9)"
        assert [r.status_code for r in answers] == [503] * 8, [r.text for r in answers]
        assert all(r.json()["error"]["message"] == reason for r in answers)
        assert wait_for(lambda: deaths, "on_worker_death called") == [reason]
        for path in ("/health", "/ready"):
            r = client.get(path)
            assert r.status_code == 503 and r.json()["reason"] == reason, r.text
        r = client.post("/translate", json={"src": ["Ein Hund."]})
        assert r.status_code == 503  # refused at once, not hanging
    assert deaths == [reason]  # once; stopping the server afterwards is no death


def test_a_stopped_worker_stalls_no_request_and_health_says_so(parts, monkeypatch):
    """A worker process that stops reading (SIGSTOP here; a frozen machine) while requests
    pour in: the server's sends to it filled the pipe and blocked the event loop, so every
    request and /health hung. Now the server answers throughout, /health and /ready are
    503 once the worker has been silent for STALLED_S, new requests are refused at once,
    and all is well again when the worker goes on."""
    monkeypatch.setattr(process, "STALLED_S", 2.0)
    translator = Translator(*parts)
    sentences = [de for de, _ in PAIRS[:64]]
    app = create_app(translator, ServeConfig(request_timeout_s=4, max_queue=100_000))
    with serving(app) as base, httpx.Client(base_url=base, timeout=8) as client:
        pid = _worker_pid(base)
        os.kill(pid, signal.SIGSTOP)
        try:
            answers: list[int] = []
            body = {"src": sentences, "beam": 1}
            send = lambda: answers.append(client.post("/translate", json=body).status_code)  # noqa: E731
            threads = [threading.Thread(target=send) for _ in range(60)]  # 200 KB of jobs
            for t in threads:
                t.start()
            health = client.get("/health", timeout=1)  # at once, beside the full pipe
            assert health.status_code in (200, 503), health.text
            stalled = wait_for(
                lambda: (r := client.get("/health", timeout=1)).status_code == 503 and r.json(),
                "health says the worker is stalled",
            )
            assert stalled["status"] == "stalled" and "has not answered for" in stalled["reason"]
            assert client.get("/ready", timeout=1).status_code == 503
            refused = client.post("/translate", json={"src": ["Ein Hund."]}, timeout=1)
            assert refused.status_code == 503 and "stopped or hung" in refused.text
            for t in threads:
                t.join(30)
            assert not any(t.is_alive() for t in threads), "a request was left hanging"
            assert set(answers) <= {503, 504} and len(answers) == 60, answers
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: client.get("/health").status_code == 200, "the worker answers again")
        r = client.post("/translate", json={"src": sentences[:3], "beam": 1})
        assert r.status_code == 200
        assert r.json()["translations"] == [
            t[0] for t in translator.translate(sentences[:3], beam=1)
        ]


def test_a_stalled_worker_holds_up_neither_metrics_nor_shutdown(parts, monkeypatch):
    """A stopped worker answers no metrics request: each /metrics scrape waited 5 s for one
    until the worker counted as stalled, and a shutdown waited 30 s for its jobs to finish
    and 5 s more for it to exit, though it had stopped answering altogether."""
    monkeypatch.setattr(process, "STALLED_S", 2.0)
    app = create_app(Translator(*parts), ServeConfig())
    pid = None
    try:
        with serving(app) as base, httpx.Client(base_url=base, timeout=8) as client:
            pid = _worker_pid(base)
            os.kill(pid, signal.SIGSTOP)
            start = time.monotonic()
            assert client.get("/metrics").status_code == 200
            assert time.monotonic() - start < process.QUIET_S + 0.5  # not the 5 s timeout
            wait_for(lambda: client.get("/health").status_code == 503, "the worker stalls")
            start = time.monotonic()
            assert client.get("/metrics").status_code == 200
            assert time.monotonic() - start < 1.0
            start = time.monotonic()
        assert time.monotonic() - start < 10.0  # the shutdown: not 30 + 5 s
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def test_a_worker_that_dies_fails_the_waiting_requests(parts, tmp_path):
    translator = GatedTranslator(*parts, tmp_path)
    with live_server(translator) as base, httpx.Client(base_url=base, timeout=60) as client:
        assert client.get("/ready").status_code == 200
        (tmp_path / "armed").touch()  # the next batch waits at the gate, never opened
        answers: list[httpx.Response] = []
        slow = {"src": [de for de, _ in PAIRS[:64]], "beam": 12}
        thread = threading.Thread(
            target=lambda: answers.append(client.post("/translate", json=slow))
        )
        thread.start()
        wait_for(lambda: (tmp_path / "entered").exists(), "the request at the gate")
        os.kill(_worker_pid(base), signal.SIGKILL)  # in the middle of its work
        thread.join(60)
        assert answers[0].status_code == 503, answers[0].text
        assert "worker process has stopped" in answers[0].json()["error"]["message"]
        r = client.get("/ready")
        assert r.status_code == 503 and "stopped" in r.json()["reason"]
        r = client.post("/translate", json={"src": ["Ein Hund."]})
        assert r.status_code == 503  # refused at once, not hanging


def test_serve_stops_with_an_error_when_its_worker_dies(parts):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # handed to serve() as it is: no other process can take it
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    errors: list[BaseException] = []

    def run() -> None:
        try:
            serve(Translator(*parts), ServeConfig(), sock=sock, log_level="warning")
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_ready(base, timeout=60)
        os.kill(_worker_pid(base), signal.SIGKILL)
        thread.join(30)
    finally:
        sock.close()
    assert not thread.is_alive(), "the server went on without its worker"
    assert len(errors) == 1 and isinstance(errors[0], WorkerDiedError), errors
    assert str(errors[0]) == (
        "the model worker died, so the server stopped: "
        "the model worker process has stopped (exit code -9)"
    )


def test_a_script_without_a_main_guard_stops_with_one_line_instead_of_hanging(
    sample_model_dir, tmp_path
):
    """The spawned worker imports the script that called serve(): unguarded, it used to
    load the model again, start a second server from inside the worker, and leave the
    first one waiting for good (the spawn pipe full of the model it never read)."""
    script = tmp_path / "serve_me.py"
    script.write_text(
        "from aiayn.serve import serve\n"
        "from aiayn.translator import Translator\n"
        "print('script ran', flush=True)\n"
        f"serve(Translator.from_dir({str(sample_model_dir())!r}), port=0, threads=1)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100, env=env
    )
    assert done.returncode == 1
    assert done.stdout.count("script ran") == 2  # the server, and the worker importing it
    guard = 'start the server under `if __name__ == "__main__":`'
    assert done.stderr.count(guard) == 1 and done.stderr.count("listening on") == 1
    assert done.stderr.rstrip().endswith(
        "WorkerDiedError: the model worker died, so the server stopped: "
        "the model worker process has stopped (exit code 1)"
    )


def _worker_pid(base: str) -> int:
    return httpx.get(f"{base}/info").json()["worker"]["pid"]


def test_a_translator_that_cannot_be_copied_is_one_clear_error(parts):
    with pytest.raises(AiaynError, match="cannot be copied to a worker process"):
        create_app(ControlledTranslator(*parts))  # its thread events do not pickle
    with pytest.raises(AiaynError, match='worker must be "process" or "thread"'):
        create_app(Translator(*parts), ServeConfig(worker="gpu"))


def test_a_cancel_racing_the_workers_stop_raises_nothing():
    """stop() lets the pipe go (None) outside the lock: a cancel that checked it under the
    lock, then read it again to post, raised AttributeError on the event loop."""
    from types import SimpleNamespace

    from aiayn.serve.jobs import Status

    posted: list[tuple] = []

    class StoppedRightAfter:  # the lock, released just as stop() lets the pipe go
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            worker._pipe = None

    job = SimpleNamespace(id=7)
    pipe = SimpleNamespace(post=lambda *message: posted.append(message))
    worker = SimpleNamespace(_lock=StoppedRightAfter(), _pipe=pipe, _pending={7: job})
    process.ProcessWorker.cancel(worker, job)  # type: ignore[arg-type]
    assert posted == [("cancel", 7, Status.CANCELLED.value)]  # to the pipe it saw


def test_a_metrics_scrape_racing_the_workers_stop_raises_nothing():
    """The same race in refresh_metrics: stop() let the pipe go between the check and the
    post (both under the lock, which stop() does not take)."""
    import asyncio
    import threading
    from types import SimpleNamespace

    posted: list[tuple] = []

    class StoppedMeanwhile(list):  # the waiters' queue, appended to just as stop() runs
        def append(self, item):
            super().append(item)
            worker._pipe = None

    pipe = SimpleNamespace(post=lambda *message: posted.append(message))
    worker = SimpleNamespace(
        _lock=threading.Lock(), _pipe=pipe, _metric_waiters=StoppedMeanwhile(), alive=True,
        silent=lambda: 0.0, metrics=None,
    )  # fmt: skip
    asyncio.run(process.ProcessWorker.refresh_metrics(worker, timeout=0.05))  # type: ignore[arg-type]
    assert posted == [("metrics",)]  # to the pipe it saw; no answer: metrics stay as they were
