"""A translation server: FastAPI + uvicorn, dynamic batching across requests in one
worker thread that owns the model, Prometheus metrics and a web page (``static/``)."""

from aiayn.serve.app import ServeConfig, create_app
from aiayn.serve.batching import BatchWorker
from aiayn.serve.server import serve

__all__ = ["BatchWorker", "ServeConfig", "create_app", "serve"]
