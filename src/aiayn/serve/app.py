"""The HTTP API (FastAPI): ``POST /translate``, ``GET /health``, ``/ready``, ``/info``,
``/metrics``, the OpenAPI docs at ``/docs`` and the web page at ``/``.

Every error is a JSON body ``{"error": {"status": N, "message": "..."}}`` with a 4xx or
5xx status, never a 200 with an error inside; the server keeps serving after each.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from aiayn.errors import AiaynError
from aiayn.serve.batching import (
    BatchWorker,
    Job,
    QueueFullError,
    Settings,
    StoppedError,
    future_reply,
)
from aiayn.serve.metrics import Metrics
from aiayn.serve.process import ProcessWorker
from aiayn.translator import ATTENTION_KINDS, AttentionMap, Translator

STATIC = Path(__file__).parent / "static"
KNOWN_PATHS = {"/", "/translate", "/health", "/ready", "/info", "/metrics", "/docs"}
WARMUP_SENTENCE = "Hallo Welt."


@dataclass
class ServeConfig:
    """Limits and batching of one server (see ``aiayn serve --help``)."""

    worker: str = "process"  # where the model runs: "process" (its own) or "thread"
    max_batch_tokens: int = 4096
    batch_wait_ms: float = 5.0
    continuous: bool = True  # beam search: sentences join and leave between steps
    join_ratio: float = 0.25  # queued sentences join once they are this x those running
    join_wait_steps: int = 8  # ... or once the oldest has waited this many steps
    max_queue: int = 1024  # sentences waiting; more -> 429
    max_sentences: int = 64  # per request
    max_body_bytes: int = 1 << 20
    max_beam: int = 16
    max_alpha: float = 10.0
    api_key: str | None = None
    retry_after_s: int = 1


class TranslateRequest(BaseModel):
    """The body of ``POST /translate``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    src: list[str] = Field(description="sentences to translate, one per entry")
    beam: int = Field(4, description="beam size; 1 = greedy")
    alpha: float = Field(0.6, description="length penalty (GNMT), >= 0")
    n_best: int = Field(1, description="candidates per sentence, 1..beam")
    attention: bool = Field(False, description="also return every layer's attention weights")


class ApiError(Exception):
    """An HTTP error response with a one-line message."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def error_response(status: int, message: str, headers=None) -> JSONResponse:
    body = {"error": {"status": status, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


def attention_json(amap: AttentionMap | None) -> dict | None:
    """Pieces and weights ``[layer][head][row][col]``, rounded to 4 decimals."""
    if amap is None:
        return None
    out: dict = {"source": amap.source, "target": amap.target, "target_in": amap.target_in}
    for kind in ATTENTION_KINDS:
        out[kind] = [(w * 1e4).round().div(1e4).tolist() for w in amap.weights[kind]]
    return out


def _check_key(request: Request, key: str | None) -> None:
    if key is None:
        return
    given = request.headers.get("x-api-key")
    auth = request.headers.get("authorization", "")
    if given is None and auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    if not given:
        raise ApiError(401, "an API key is required", {"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(given.encode(), key.encode()):
        raise ApiError(403, "the API key is wrong")


class RequestCounter:
    """ASGI middleware: counts every HTTP response by path and status and times
    ``/translate``. Plain ASGI rather than ``@app.middleware``: Starlette's
    BaseHTTPMiddleware costs a task and a stream per request, on the event loop that
    shares the GIL with a worker thread."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in KNOWN_PATHS else "other"
        timed = path == "/translate"
        start, status = time.perf_counter(), 500  # an exception that escapes is a 500

        async def send_and_note(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        if timed:
            self.metrics.add_in_flight(1)
        try:
            await self.app(scope, receive, send_and_note)
        finally:
            if timed:
                self.metrics.add_in_flight(-1)
            seconds = time.perf_counter() - start if timed else None
            self.metrics.request_done(path, status, seconds)


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, or 413 as soon as it passes ``limit`` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the body has {declared} bytes, more than the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


def parse_request(body: bytes, cfg: ServeConfig) -> TranslateRequest:
    """Decode, parse and range-check a body: 400 for bytes that are not UTF-8 JSON, 422
    for JSON of the wrong shape or settings out of range."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not UTF-8 (byte {e.start})") from None
    try:
        data = json.loads(text, parse_constant=_no_constants)
    except ValueError as e:
        raise ApiError(400, f"the body is not valid JSON ({e})") from None
    try:
        req = TranslateRequest.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(422, f"{where}: {first['msg']}") from None
    if not req.src:
        raise ApiError(422, "src: the list of sentences is empty")
    if len(req.src) > cfg.max_sentences:
        raise ApiError(422, f"src: {len(req.src)} sentences, at most {cfg.max_sentences}")
    if not 1 <= req.beam <= cfg.max_beam:
        raise ApiError(422, f"beam: {req.beam} is out of range 1..{cfg.max_beam}")
    if not 1 <= req.n_best <= req.beam:
        raise ApiError(422, f"n_best: {req.n_best} is out of range 1..beam ({req.beam})")
    if not (math.isfinite(req.alpha) and 0 <= req.alpha <= cfg.max_alpha):
        raise ApiError(422, f"alpha: {req.alpha} is out of range 0..{cfg.max_alpha}")
    return req


def create_app(translator: Translator, cfg: ServeConfig | None = None) -> FastAPI:
    """The app around a loaded ``translator``; its batching worker starts and stops with
    the app (lifespan), and a first real translation through it makes ``/ready`` pass.
    With ``cfg.worker == "process"`` (the default) the model runs in a child process
    that gets a copy of ``translator``, which must therefore be picklable."""
    cfg = cfg or ServeConfig()
    metrics = Metrics()
    batching = {
        "max_batch_tokens": cfg.max_batch_tokens,
        "batch_wait_ms": cfg.batch_wait_ms,
        "max_queue": cfg.max_queue,
        "continuous": cfg.continuous,
        "join_ratio": cfg.join_ratio,
        "join_wait_steps": cfg.join_wait_steps,
    }
    if cfg.worker == "process":  # no GIL shared between the model and the HTTP side
        worker: BatchWorker | ProcessWorker = ProcessWorker(translator, metrics, **batching)
    elif cfg.worker == "thread":
        worker = BatchWorker(translator, metrics, **batching)
    else:
        raise AiaynError(f'worker must be "process" or "thread", got {cfg.worker!r}')
    state = {"ready": False, "reason": "warming up: the first translation has not finished"}

    async def submit(src: list[list[int]], settings: Settings, attention: bool):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        job = Job(src, settings, attention, future_reply(loop, future))
        worker.submit(job)
        try:
            return await future
        except asyncio.CancelledError:  # the client went away: stop decoding its sentences
            worker.cancel(job)
            raise

    async def warm_up() -> None:
        try:
            ids = [translator.encode(WARMUP_SENTENCE)]
            result = await submit(ids, Settings(beam=1), attention=False)
            if len(result.ids) != 1:
                raise AiaynError("the warm-up translation returned no result")
            state.update(ready=True, reason="")
        except Exception as e:  # /ready says why; /health still answers
            state.update(ready=False, reason=f"warm-up translation failed: {e}")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await asyncio.to_thread(worker.start)  # spawning a process takes a moment
        task = asyncio.create_task(warm_up())
        yield
        task.cancel()
        await asyncio.to_thread(worker.stop)  # in-flight work finishes first

    app = FastAPI(
        title="aiayn translation server",
        description="The original Transformer behind HTTP, with continuous batching.",
        version="1",
        lifespan=lifespan,
    )
    app.state.worker, app.state.metrics, app.state.ready = worker, metrics, state

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        return error_response(422, str(exc.errors()[0].get("msg", "invalid request")))

    app.add_middleware(RequestCounter, metrics=metrics)

    @app.post(
        "/translate",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": TranslateRequest.model_json_schema()}},
            }
        },
        responses={400: {}, 401: {}, 403: {}, 413: {}, 422: {}, 429: {}, 500: {}, 503: {}},
    )
    async def translate(request: Request):
        """Translate ``src``; with ``attention`` also every layer's attention weights of the
        best translation (``[layer][head][row][col]`` per kind, with the pieces)."""
        _check_key(request, cfg.api_key)
        req = parse_request(await _read_body(request, cfg.max_body_bytes), cfg)
        src = []
        limit = translator.max_source_tokens
        for i, line in enumerate(req.src):
            ids = translator.tokenizer.encode(line) if line.strip() else []
            if len(ids) > limit:
                raise ApiError(422, f"src.{i}: {len(ids)} tokens, the model takes at most {limit}")
            src.append(ids)
        try:
            result = await submit(src, Settings(req.beam, req.alpha, req.n_best), req.attention)
        except QueueFullError as e:
            raise ApiError(429, str(e), {"Retry-After": str(cfg.retry_after_s)}) from None
        except StoppedError as e:
            raise ApiError(503, str(e)) from None
        except Exception as e:  # the model raised: this request fails, the server goes on
            raise ApiError(500, f"translation failed: {type(e).__name__}: {e}") from None
        n_best = [translator.detokenize(c, req.n_best) for c in result.ids]
        body: dict = {"translations": [c[0] for c in n_best]}
        if req.n_best > 1:
            body["n_best"] = n_best
        if req.attention:
            body["attention"] = await asyncio.to_thread(
                lambda: [attention_json(a) for a in result.attention or []]
            )
        return body

    @app.get("/health")
    async def health():
        """The process answers (it does not check the model: see /ready)."""
        return {"status": "ok"}

    @app.get("/ready", responses={503: {}})
    async def ready():
        """200 once the model is loaded and a real translation went through the worker."""
        if not worker.alive:
            state.update(ready=False, reason="the batching worker has stopped")
        if state["ready"]:
            return {"ready": True}
        return JSONResponse({"ready": False, "reason": state["reason"]}, status_code=503)

    @app.get("/info")
    async def info():
        """The model's configuration and this server's limits."""
        model_cfg = translator.model.cfg
        return {
            "model": {
                "encoder_layers": model_cfg.encoder_layers,
                "decoder_layers": model_cfg.decoder_layers,
                "heads": model_cfg.n_heads,
                "d_model": model_cfg.d_model,
                "vocab_size": translator.tokenizer.vocab_size,
                "max_source_tokens": translator.max_source_tokens,
                "parameters": translator.model.num_parameters(),
                "device": str(translator.device),
            },
            "worker": {"kind": cfg.worker, "pid": worker.pid},
            "limits": {k: v for k, v in asdict(cfg).items() if k != "api_key"},
            "api_key_required": cfg.api_key is not None,
        }

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus():
        """Prometheus text: requests by status, latency, batch sizes, queue length."""
        await worker.refresh_metrics()
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
