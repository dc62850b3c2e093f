"""Running the app under uvicorn: one event loop, one model worker (by default in a
process of its own).

If the model worker dies (the OOM killer, a crash in a kernel), the server does not try
to carry on without it or to restart it (restarting would mean holding a second copy of
the model here, or reloading it from disk): every waiting request gets a 503, ``/health``
and ``/ready`` answer 503 with the reason, and :func:`serve` stops and raises
:class:`WorkerDiedError`, so that ``aiayn serve`` exits non-zero and its supervisor
(systemd, Docker, Kubernetes) restarts it, as TGI does.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import socket
import sys
from collections.abc import Callable
from types import FrameType

import torch

from aiayn.errors import AiaynError
from aiayn.serve.app import ServeConfig, create_app
from aiayn.serve.process import refuse_in_bootstrap
from aiayn.translator import Translator


class WorkerDiedError(AiaynError):
    """The model worker died while serving; the server stopped."""


def serve(
    translator: Translator | Callable[[], Translator],
    cfg: ServeConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    threads: int | None = None,
    graceful_s: float = 30.0,
    log_level: str = "info",
    sock: socket.socket | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM. On a signal uvicorn stops accepting connections, lets
    requests in flight finish (up to ``graceful_s`` seconds), then the worker stops.
    ``threads`` sets torch's intra-op threads, here and in a worker process (default:
    torch's choice); ``sock`` is an already bound socket to serve on instead of
    ``host``/``port``. ``translator`` may be a function that loads it: then nothing but
    the worker keeps the model (with a worker process, this process frees its copy),
    where a caller that passes the translator itself holds it as long as it keeps it.
    Raises WorkerDiedError once stopped if the model worker died."""
    refuse_in_bootstrap()  # before the translator is loaded or a port is taken
    import uvicorn

    if threads is not None:
        if threads < 1:
            raise AiaynError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    if not 0 <= port <= 65535:
        raise AiaynError(f"port {port} is out of range 0..65535")
    died: list[str] = []

    def stop(reason: str) -> None:  # from the worker's thread: uvicorn polls the flag
        died.append(reason)
        server.should_exit = True

    if not isinstance(translator, Translator):
        translator = translator()
    app = create_app(translator, cfg, on_worker_death=stop)
    del translator  # with a worker process, the weights now live in that process alone
    gc.collect()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        # uvicorn annotates an int but passes it to asyncio.wait_for: any number of seconds
        # (unused-ignore: uvicorn is not pinned, and a release may fix the annotation)
        timeout_graceful_shutdown=graceful_s,  # type: ignore[arg-type, unused-ignore]
        access_log=False,  # /metrics counts requests; a line per request costs throughput
        # h11, not httptools: httptools drops the body of a request that offers an upgrade
        # (`Upgrade: h2c`, which Java's HttpClient and `curl --http2` send; uvicorn#2722),
        # where h11 ignores the offer, as a server may. Both served the load benchmark at
        # the same rate (BENCHMARKS.md, Serving).
        http="h11",
    )
    announce = ""
    if sock is None:  # bind here so a taken port is one clear error, not a traceback
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as e:
            raise AiaynError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None
        # uvicorn names the address only when it binds: say it (with port 0, which one).
        bound, port = sock.getsockname()[:2]
        where = f"[{bound}]" if ":" in bound else bound
        announce = f"aiayn serve: listening on http://{where}:{port}"
    _no_delay(sock)

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            # Said once connections are accepted (the worker has the model), so that a
            # script that waits for the line can send its first request at once.
            if self.started and announce:
                print(announce, file=sys.stderr, flush=True)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            if self.force_exit:  # a second Ctrl-C: the user asked for what follows
                errors.addFilter(_below_error)

    # uvicorn's errors logger: on a forced quit each request and the lifespan task it
    # cancels logs its CancelledError as an error with a traceback.
    errors = logging.getLogger("uvicorn.error")
    server = Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        errors.removeFilter(_below_error)
    if died:
        raise WorkerDiedError(f"the model worker died, so the server stopped: {died[0]}")


def _below_error(record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR


def _no_delay(sock: socket.socket) -> None:
    """Nagle's algorithm off for the connections ``sock`` accepts (they inherit the option;
    asyncio sets it too, but only on a socket made with ``IPPROTO_TCP``, not 0). With it on,
    every answer after the first on a kept-alive connection waited for the client's delayed
    ACK, about 40 ms, since uvicorn sends an answer's head and body apart."""
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
        with contextlib.suppress(OSError):  # not TCP after all: nothing to turn off
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
