"""Running the app under uvicorn: one event loop, one model worker (by default in a
process of its own)."""

from __future__ import annotations

import socket

import torch

from aiayn.errors import AiaynError
from aiayn.serve.app import ServeConfig, create_app
from aiayn.translator import Translator


def serve(
    translator: Translator,
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
    ``host``/``port``."""
    import uvicorn

    if threads is not None:
        if threads < 1:
            raise AiaynError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    if not 0 <= port <= 65535:
        raise AiaynError(f"port {port} is out of range 0..65535")
    app = create_app(translator, cfg)
    del translator  # with a worker process, the weights now live in that process alone
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        # uvicorn annotates an int but passes it to asyncio.wait_for: any number of seconds
        # (unused-ignore: uvicorn is not pinned, and a release may fix the annotation)
        timeout_graceful_shutdown=graceful_s,  # type: ignore[arg-type, unused-ignore]
        access_log=False,  # /metrics counts requests; a line per request costs throughput
        # uvicorn parses HTTP with httptools (C) when it is installed, as the serve extra
        # makes sure: less CPU beside the model on the event loop.
    )
    server = uvicorn.Server(config)
    if sock is None:  # bind here so a taken port is one clear error, not a traceback
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as e:
            raise AiaynError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None
    server.run(sockets=[sock])
