"""The HTTP API (FastAPI): ``POST /translate``, ``GET /health``, ``/ready``, ``/info``,
``/metrics``, the OpenAPI docs at ``/docs`` and the web page at ``/``.

Every error is a JSON body ``{"error": {"status": N, "message": "..."}}`` with a 4xx or
5xx status, never a 200 with an error inside; the server keeps serving after each.

A request's job ends one way or another, and always in the model worker: with its
result, with an error, when its client goes away (the worker stops decoding it), or at its
deadline (``request_timeout_s``: a 504, and the worker drops it). Requests are admitted
by :mod:`aiayn.serve.admission` (every size checked before any heavy work). If the worker
dies, every waiting request gets a 503, ``/health`` and ``/ready`` say why, and the
server stops (:func:`aiayn.serve.server.serve` exits non-zero, for its supervisor).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from aiayn.decode import DecodeOptions
from aiayn.errors import AiaynError
from aiayn.serve.admission import (
    ModelInfo,
    answer,
    attention_weights,
    check_attention_sentences,
    check_attention_weights,
    encode_request,
)
from aiayn.serve.batching import DEFAULT_CACHE_TOKENS, BatchWorker
from aiayn.serve.jobs import (
    Job,
    Outcome,
    QueueFullError,
    Status,
    StoppedError,
    TooLargeError,
    future_reply,
)
from aiayn.serve.metrics import Metrics
from aiayn.serve.process import ProcessWorker, refuse_in_bootstrap
from aiayn.serve.protocol import (
    CLIENT_GONE,
    ApiError,
    HeadAsGet,
    RequestCounter,
    TranslateRequest,
    attention_json,
    check_json,
    check_key,
    client_gone,
    error_response,
    origin_problem,
    parse_request,
    read_body,
    request_options,
)
from aiayn.translator import Translator

STATIC = Path(__file__).parent / "static"
WARMUP = "Hallo Welt."  # the sentence translated once before /ready says ready
ENDING_S = 1.0  # how long a request at its deadline waits for the worker's answer to its cancel


@dataclass
class ServeConfig:
    """Limits and batching of one server (see ``aiayn serve --help``)."""

    worker: str = "process"  # where the model runs: "process" (its own) or "thread"
    worker_device: str | None = None  # process: move the model there, in that process
    max_batch_tokens: int = 4096  # padded source tokens of a batch
    max_cache_tokens: int = DEFAULT_CACHE_TOKENS  # decoder-cache positions of a batch
    batch_wait_ms: float = 5.0
    continuous: bool = True  # sentences join a running batch between steps (else: whole)
    join_ratio: float = 0.25  # queued sentences join once they are this x those running
    join_wait_steps: int = 8  # ... or once the oldest has waited this many steps
    max_queue: int = 1024  # sentences waiting; more -> 429
    max_sentences: int = 64  # per request
    max_body_bytes: int = 1 << 20
    max_attention_sentences: int = 4  # per request with "attention": true; more -> 413
    max_attention_weights: int = 1 << 22  # the maps' weights a request may get; more -> 413
    max_beam: int = 16
    max_alpha: float = 10.0
    request_timeout_s: float = 60.0  # a request's deadline: then 504, and its job is dropped
    api_key: str | None = None
    public_metrics: bool = False  # with an API key: /metrics and /info need none
    retry_after_s: int = 1
    # Web pages of other origins that may call the API from a browser (CORS), e.g.
    # "http://localhost:3000"; "*": any. None: only the server's own page.
    cors_origins: tuple[str, ...] = ()


def create_app(
    translator: Translator,
    cfg: ServeConfig | None = None,
    on_worker_death: Callable[[str], None] | None = None,
) -> FastAPI:
    """The app around a loaded ``translator``; its batching worker starts and stops with
    the app (lifespan), and a first real translation through it makes ``/ready`` pass.
    If the worker dies (its process killed, its thread failed), every waiting request
    gets a 503 with the reason, ``/health`` and ``/ready`` answer 503 with it from then
    on, and ``on_worker_death(reason)`` is called (from another thread) once:
    :func:`~aiayn.serve.server.serve` stops the server there, to exit non-zero.
    With ``cfg.worker == "process"`` (the default) the model runs in a child process
    that gets a copy of ``translator``, which must therefore be picklable, and the app
    keeps no reference to the model; with ``cfg.worker_device`` that process moves it to
    that device (load it on the CPU, and the server process never holds its weights on
    a GPU)."""
    refuse_in_bootstrap()
    cfg = cfg or ServeConfig()
    metrics = Metrics()
    batching: dict[str, Any] = {
        "max_batch_tokens": cfg.max_batch_tokens,
        "max_cache_tokens": cfg.max_cache_tokens,
        "batch_wait_ms": cfg.batch_wait_ms,
        "max_queue": cfg.max_queue,
        "continuous": cfg.continuous,
        "join_ratio": cfg.join_ratio,
        "join_wait_steps": cfg.join_wait_steps,
    }
    if not cfg.request_timeout_s > 0:
        raise AiaynError(f"the request timeout must be > 0 seconds, got {cfg.request_timeout_s}")
    if cfg.max_attention_sentences < 0 or cfg.max_attention_weights < 0:
        raise AiaynError("the attention limits must be >= 0 (0: no attention maps)")
    for origin in cfg.cors_origins:
        if problem := origin_problem(origin):
            raise AiaynError(f"cors_origins: {origin!r} {problem}")
    for model in translator.models:  # for good: the batch and the attention maps run at once
        model.eval()
    info = ModelInfo.of(translator, cfg.worker_device)
    state = {"ready": False, "reason": "warming up: the first translation has not finished"}

    def died(reason: str) -> None:  # the requests it held have their answers already
        state.update(ready=False, reason=reason)
        if on_worker_death is not None:
            on_worker_death(reason)

    if cfg.worker == "process":  # no GIL shared between the model and the HTTP side
        worker: BatchWorker | ProcessWorker = ProcessWorker(
            translator, metrics, cfg.worker_device, on_death=died, **batching
        )
        del translator  # the worker process has its copy: keep none here
    elif cfg.worker_device is not None:
        raise AiaynError(
            "a worker device needs the worker process; with a worker thread, "
            "load the translator on its device"
        )
    elif cfg.worker == "thread":
        worker = BatchWorker(translator, metrics, on_death=died, **batching)
        del translator  # the worker holds it
    else:
        raise AiaynError(f'worker must be "process" or "thread", got {cfg.worker!r}')

    async def run(
        src: list[list[int]],
        settings: DecodeOptions,
        attention: bool,
        request: Request | None = None,
        deadline: float | None = None,
        prefix: list[list[int]] | None = None,
    ) -> Outcome:
        """Submit a job and wait for whichever comes first: its outcome, its client going
        away (ApiError 499) or the deadline (ApiError 504, on the loop's clock); a server
        stopping past its grace period is an ApiError 503. Whichever it is, the job ends in
        the worker (all but the outcome cancel it)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        job = Job(src, settings, attention, future_reply(loop, future), prefix)
        worker.submit(job)
        gone = asyncio.ensure_future(client_gone(request.receive)) if request else None
        timeout = None if deadline is None else max(deadline - loop.time(), 0.0)
        waits: list[asyncio.Future[Any]] = [future] if gone is None else [future, gone]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server stops, past its grace period
            worker.cancel(job)
            raise  # answered by translate()
        finally:
            left = gone is not None and gone.done()
            if gone is not None:
                gone.cancel()
        if future.done():
            return future.result()
        worker.cancel(job, Status.CANCELLED if left else Status.TIMED_OUT)  # nobody will read it
        # Its ending as the worker counts it: done, where it finished as the cancel came.
        await asyncio.wait([future], timeout=ENDING_S)
        if future.done() and (outcome := future.result()).status is Status.DONE:
            return outcome
        if left:
            raise ApiError(CLIENT_GONE, "the client closed the connection")
        raise ApiError(504, f"no translation within the {cfg.request_timeout_s:g} s deadline")

    async def warm_up() -> None:
        try:
            ids = [worker.budget.fit(info.tokenizer.encode(WARMUP, info.max_source_tokens))]
            result = (await run(ids, DecodeOptions(beam=1), attention=False)).unwrap()
            if len(result.ids) != 1:
                raise AiaynError("the warm-up translation returned no result")
            state.update(ready=True, reason="")
        except Exception as e:  # /ready says why; /health still answers
            state.update(ready=False, reason=f"warm-up translation failed: {e}")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
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
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, str(exc.errors()[0].get("msg", "invalid request")))

    if cfg.cors_origins:  # answers browsers' preflight requests before any route
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cfg.cors_origins),
            allow_methods=["GET", "HEAD", "POST"],
            allow_headers=["authorization", "content-type", "x-api-key"],
            max_age=600,
        )
    app.add_middleware(RequestCounter, metrics=metrics)  # outside CORS: preflights count
    app.add_middleware(HeadAsGet)  # outermost: everything inside sees HEAD as GET

    @app.post(
        "/translate",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": TranslateRequest.model_json_schema()}},
            }
        },
        responses={
            200: {"content": {"application/json": {"schema": {"type": "object"}}}},
            **{code: {} for code in (400, 401, 403, 408, 413, 415, 422, 429, 500, 503, 504)},
        },
        response_model=None,  # a dict, or the JSON of one encoded off the loop
    )
    async def translate(request: Request) -> dict[str, Any] | JSONResponse:
        """Translate ``src``; with ``attention`` also every layer's attention weights of the
        best translation (``[layer][head][row][col]`` per kind, with the pieces)."""
        try:
            return await translation(request)
        except asyncio.CancelledError:  # the server stops, past its grace period
            # uvicorn cancels the request's task, wherever it is (reading the body too), and
            # would log a traceback and send a bare 500: answer, as a dead worker's requests
            # are answered. (It cancels no request task for any other reason: client_gone.)
            raise ApiError(503, "the server stopped before this translation finished") from None

    async def translation(request: Request) -> dict[str, Any] | JSONResponse:
        deadline = asyncio.get_running_loop().time() + cfg.request_timeout_s
        check_key(request, cfg.api_key)
        check_json(request)
        try:
            body = await asyncio.wait_for(
                read_body(request, cfg.max_body_bytes), cfg.request_timeout_s
            )
        except asyncio.TimeoutError:
            raise ApiError(408, "the body did not arrive within the request's deadline") from None
        req = parse_request(body, cfg.max_sentences)
        vocab = info.cfg.tgt_vocab_size  # a beam over it is the request's fault: a 422
        options = request_options(req, info.defaults, cfg.max_beam, cfg.max_alpha, vocab)
        check_attention_sentences(req, cfg.max_attention_sentences)
        src, prefix = await asyncio.to_thread(encode_request, req, info)  # off the loop
        if req.attention:
            forced = prefix or [[] for _ in src]  # a prefix lengthens its output
            limits = [worker.budget.output_limit(len(s), len(p)) for s, p in zip(src, forced)]
            check_attention_weights(
                attention_weights(src, info.cfg, limits), cfg.max_attention_weights
            )
        try:
            outcome = await run(src, options, req.attention, request, deadline, prefix)
            result = answer(outcome)
        except ApiError:
            raise
        except QueueFullError as e:
            raise ApiError(429, str(e), {"Retry-After": str(cfg.retry_after_s)}) from None
        except (TooLargeError, StoppedError) as e:  # refused by submit
            raise ApiError(413 if isinstance(e, TooLargeError) else 503, str(e)) from None
        n_best = [info.detokenize(c, req.n_best) for c in result.ids]
        body_out: dict[str, Any] = {"translations": [c[0] for c in n_best]}
        if req.n_best > 1:
            body_out["n_best"] = n_best
        if req.scores:  # the objects of `aiayn translate --format jsonl`'s n_best lists
            piece = info.tokenizer.id_to_piece
            body_out["outputs"] = [
                [
                    {"text": text, "tokens": [piece(t) for t in h.tokens], "score": h.score,
                     "logprob": h.log_prob}
                    for text, h in zip(texts, hyps)
                ]
                for texts, hyps in zip(n_best, result.hypotheses)
            ]  # fmt: skip
        if not req.attention:
            return body_out

        def encoded() -> JSONResponse:  # megabytes of weights: seconds of the loop's time
            body_out["attention"] = [attention_json(a) for a in result.attention or []]
            return JSONResponse(body_out)

        return await asyncio.to_thread(encoded)

    def unwell() -> str | None:
        """Why the model worker cannot serve: it has died, or its process is stalled."""
        if not worker.alive:
            return worker.failure or "the batching worker has stopped"
        return worker.stalled() if isinstance(worker, ProcessWorker) else None

    @app.get("/health", responses={503: {}})
    async def health() -> Any:
        """200 while the model worker lives (it may still be warming up: see /ready); 503
        with the reason once it has died (the server then exits: see create_app) or while
        its process answers nothing (stopped or hung)."""
        if (reason := unwell()) is None:
            return {"status": "ok"}
        status = "failed" if not worker.alive else "stalled"
        return JSONResponse({"status": status, "reason": reason}, status_code=503)

    @app.get("/ready", responses={503: {}})
    async def ready() -> Any:
        """200 once the model is loaded and a real translation went through the worker,
        while the worker can serve."""
        if (reason := unwell()) is not None:
            if not worker.alive:
                state.update(ready=False, reason=reason)
            return JSONResponse({"ready": False, "reason": reason}, status_code=503)
        if state["ready"]:
            return {"ready": True}
        return JSONResponse({"ready": False, "reason": state["reason"]}, status_code=503)

    def check_reader(request: Request) -> None:
        if not cfg.public_metrics:
            check_key(request, cfg.api_key)

    @app.get("/info", responses={401: {}, 403: {}})
    async def model_info(request: Request) -> dict[str, Any]:
        """The model's configuration (of the first member of an ensemble; ``models``
        counts them, ``parameters`` sums theirs), its default output length and this server's
        limits (with an API key set, the key is needed unless ``public_metrics``)."""
        check_reader(request)
        return {
            "model": {
                "encoder_layers": info.cfg.encoder_layers,
                "decoder_layers": info.cfg.decoder_layers,
                "heads": info.cfg.n_heads,
                "d_model": info.cfg.d_model,
                "vocab_size": info.tokenizer.vocab_size,
                "max_source_tokens": info.max_source_tokens,
                "models": info.models,
                "parameters": info.parameters,
                "device": info.device,
                "length_rule": info.length_rule,
            },
            "worker": {"kind": cfg.worker, "pid": worker.pid},
            "limits": {k: v for k, v in asdict(cfg).items() if k != "api_key"},
            "api_key_required": cfg.api_key is not None,
        }

    @app.get("/metrics", response_class=PlainTextResponse, responses={401: {}, 403: {}})
    async def prometheus(request: Request) -> PlainTextResponse:
        """Prometheus text: requests by status, latency, batch sizes, queue length, jobs
        (with an API key set, the key is needed unless ``public_metrics``)."""
        check_reader(request)
        await worker.refresh_metrics()
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
