"""Helpers for the server tests: a real uvicorn server on a free loopback port, in a
thread of the test process, and translators that can be held or made to fail."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import httpx

from aiayn.serve import ServeConfig, create_app
from aiayn.translator import Translator


class ControlledTranslator(Translator):
    """A Translator whose running batch's steps can be held at a gate (to fill the queue)
    or made to raise (to check that every waiting request gets an error)."""

    def __init__(self, model, tokenizer):
        super().__init__(model, tokenizer)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set when a batch reaches the gate
        self.fail = False
        self.batches: list[int] = []  # sentences per batch, at its first step
        self.steps: list[int] = []  # sentences per decoding step
        self.widths: list[int] = []  # longest source running, per step
        self.joins: list[tuple[int, int]] = []  # (sentences running, joining) per add
        self.late_joins = 0  # adds to a batch that had stepped already
        self.left: list[tuple[list, int]] = []  # (tags done, sentences still running)
        self.fail_at_running: int | None = None  # a step with this many sentences raises

    def forget(self) -> None:
        """Forget the batches recorded so far (the server's warm-up translation)."""
        for record in (self.batches, self.steps, self.widths, self.joins, self.left):
            record.clear()
        self.late_joins = 0

    def _hold(self) -> None:
        self.entered.set()
        if not self.gate.wait(timeout=30):
            raise TimeoutError("the test never opened the gate")
        if self.fail:
            raise RuntimeError("the model fell over")

    def continuous_search(self, *args, **kwargs):
        search = super().continuous_search(*args, **kwargs)
        add, step, stepped = search.add, search.step, []

        def held_add(src, tags, *args, **kwargs):
            self.joins.append((len(search), len(tags)))
            self.late_joins += bool(stepped)
            return add(src, tags, *args, **kwargs)

        def held_step():
            if not stepped:
                self.batches.append(len(search))
                stepped.append(True)
            self.steps.append(len(search))
            self.widths.append(search.width)
            self._hold()
            if self.fail_at_running is not None and len(search) >= self.fail_at_running:
                raise RuntimeError("the model fell over")
            done = step()
            self.left.append(([tag for tag, _ in done], len(search)))
            return done

        search.add, search.step = held_add, held_step
        return search


def wait_ready(base: str, timeout: float = 30.0, path: str = "/ready") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}{path}", timeout=5).status_code == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{base} never became ready")


def wait_warmed_up(client, timeout: float = 60.0):
    """``GET /ready`` once the warm-up translation has finished (or failed), through a
    TestClient; returns that response."""
    deadline = time.monotonic() + timeout
    while "warming up" in (r := client.get("/ready")).text and time.monotonic() < deadline:
        time.sleep(0.05)
    return r


@contextlib.contextmanager
def live_server(translator: Translator, cfg: ServeConfig | None = None):
    """Serve ``translator`` on 127.0.0.1 (a free port) in a thread; yields the base URL."""
    with serving(create_app(translator, cfg)) as base:
        yield base


@contextlib.contextmanager
def serving(app, ready: bool = True):
    """Serve ``app`` on 127.0.0.1 (a free port) in a thread; yields the base URL once
    ``/ready`` passes (with ``ready``) or ``/health`` answers."""
    import uvicorn

    # IPPROTO_TCP, as serve(): with 0 asyncio leaves Nagle's algorithm on (40 ms a request)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        http="h11",  # as serve()
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, path="/ready" if ready else "/health")
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        assert not thread.is_alive(), "the server thread did not stop"


class BrokenTranslator(Translator):
    """A picklable Translator whose model always raises: for the worker process, which
    gets a copy of its translator (a ControlledTranslator's events do not pickle)."""

    def continuous_search(self, *args, **kwargs):
        raise RuntimeError("the model fell over")


def open_request(base: str, body: dict) -> socket.socket:
    """Send ``POST /translate`` with ``body`` on a raw connection and return the socket
    without reading the answer: closing it is a client that goes away."""
    import json

    host, port = base.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = (
        f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def gauges(base: str) -> dict[str, float]:
    """The unlabelled samples of ``GET /metrics`` (gauges and plain counters) by name."""
    found = {}
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if not line.startswith("#") and "{" not in line:
            name, value = line.split()
            found[name] = float(value)
    return found


def wait_for(condition, what: str, timeout: float = 20.0, every: float = 0.02):
    """Poll ``condition()`` until it returns something true; that value."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw {what} within {timeout} s")
        time.sleep(every)
    return value


class SlowTranslator(Translator):
    """A picklable Translator (so it serves in a worker process too) whose continuous
    decoding steps take at least ``step_s`` seconds each: a running batch that lasts long
    enough to be cancelled in the middle. With ``fail_remove``, taking sentences out of
    the running batch raises: an error outside any model call, which must not leave a
    request waiting."""

    def __init__(self, model, tokenizer, step_s: float = 0.1, fail_remove: bool = False):
        super().__init__(model, tokenizer)
        self.step_s, self.fail_remove = step_s, fail_remove

    def continuous_search(self, *args, **kwargs):
        search = super().continuous_search(*args, **kwargs)
        step, step_s, fail_remove = search.step, self.step_s, self.fail_remove

        def slow_step():
            time.sleep(step_s)
            return step()

        def failing_remove(tags):
            raise RuntimeError("remove fell over")

        search.step = slow_step
        if fail_remove:
            search.remove = failing_remove
        return search


class GatedTranslator(Translator):
    """A picklable Translator (it serves in a worker process too) whose batches wait at a
    gate made of files in ``gate_dir``, once the test has created ``armed`` there (the
    warm-up translation passes freely): each batch creates ``entered`` and then waits for
    ``open``. A request is thus known to be in the middle of its work when the test acts,
    without a sleep."""

    def __init__(self, model, tokenizer, gate_dir):
        super().__init__(model, tokenizer)
        self.gate_dir = Path(gate_dir)

    def _hold(self) -> None:
        if not (self.gate_dir / "armed").exists():
            return
        (self.gate_dir / "entered").touch()
        deadline = time.monotonic() + 60
        while not (self.gate_dir / "open").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the test never opened the gate")
            time.sleep(0.01)

    def continuous_search(self, *args, **kwargs):
        search = super().continuous_search(*args, **kwargs)
        step, hold = search.step, self._hold

        def held_step():
            hold()
            return step()

        search.step = held_step
        return search
