"""A translation server: FastAPI + uvicorn, dynamic batching across requests in one
worker that owns the model (in a process of its own, or a thread), Prometheus metrics and
a web page (``static/``)."""

from aiayn.serve.app import ServeConfig, create_app
from aiayn.serve.batching import BatchWorker
from aiayn.serve.process import ProcessWorker
from aiayn.serve.server import WorkerDiedError, serve

__all__ = [
    "BatchWorker",
    "ProcessWorker",
    "ServeConfig",
    "WorkerDiedError",
    "create_app",
    "serve",
]
