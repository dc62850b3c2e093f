"""The model worker in a process of its own (the server's default): errors keep their
meaning across the pipe, a worker that dies fails the waiting requests instead of hanging
them, a client that goes away is dropped, and a translator that cannot be copied is one
clear error. (Most API tests, and the parallel-requests test, run this worker too.)"""

from __future__ import annotations

import os
import signal
import threading

import httpx
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
from fastapi.testclient import TestClient

from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.errors import AiaynError
from aiayn.serve import ServeConfig, create_app
from aiayn.translator import Translator
from sample_data import PAIRS
from serve_util import (
    BrokenTranslator,
    ControlledTranslator,
    GatedTranslator,
    live_server,
    wait_for,
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
    with TestClient(create_app(Translator(*parts), ServeConfig(max_queue=2))) as c:
        assert wait_warmed_up(c).status_code == 200
        r = c.post("/translate", json={"src": ["Ein Hund.", "Eine Katze.", "Ein Mann."]})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert "the queue is full" in r.json()["error"]["message"]
        r = c.post("/translate", json={"src": ["Ein Hund."]})
        assert r.status_code == 200 and r.json()["translations"][0]


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
        assert client.get("/health").status_code == 200


def _worker_pid(base: str) -> int:
    return httpx.get(f"{base}/info").json()["worker"]["pid"]


def test_a_translator_that_cannot_be_copied_is_one_clear_error(parts):
    with pytest.raises(AiaynError, match="cannot be copied to a worker process"):
        create_app(ControlledTranslator(*parts))  # its thread events do not pickle
    with pytest.raises(AiaynError, match='worker must be "process" or "thread"'):
        create_app(Translator(*parts), ServeConfig(worker="gpu"))
