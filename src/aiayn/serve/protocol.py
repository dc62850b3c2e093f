"""The HTTP side of a request, before and after the model: the body and its checks, the
error responses, the API key, the request counter, and noticing a client that went away.

Every error is a JSON body ``{"error": {"status": N, "message": "..."}}`` with a 4xx or
5xx status, never a 200 with an error inside.
"""

from __future__ import annotations

import codecs
import hmac
import json
import math
import time
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

from aiayn.data.tokenizer import unencodable
from aiayn.decode import DecodeOptions
from aiayn.errors import AiaynError, DecodeError
from aiayn.inspect.maps import ATTENTION_KINDS, AttentionMap
from aiayn.serve.metrics import Metrics

KNOWN_PATHS = {"/", "/translate", "/health", "/ready", "/info", "/metrics", "/docs"}
CLIENT_GONE = 499  # nginx's "client closed request": counted in /metrics, sent to nobody

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class TranslateRequest(BaseModel):
    """The body of ``POST /translate``. Unset decoding fields take the model's defaults
    (the paper's beam 4 and alpha 0.6, or an imported model's generation settings)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    src: list[str] = Field(description="sentences to translate, one per entry")
    beam: int | None = Field(None, description="beam size; 1 = greedy (default the model's)")
    alpha: float | None = Field(None, description="length penalty, >= 0 (default the model's)")
    n_best: int = Field(1, description="candidates per sentence, 1..beam (with sampling: samples)")
    sampling: bool | None = Field(
        None, description="draw each token instead of searching (default the model's)"
    )
    temperature: float | None = Field(None, description="sampling temperature (default 1)")
    top_k: int | None = Field(None, description="sample from the k most likely (default 0: all)")
    top_p: float | None = Field(None, description="sample from the nucleus of this mass (0, 1]")
    seed: int | None = Field(None, description="a sentence's samples depend on (seed, its index)")
    prefix: str | list[str] | None = Field(
        None, description="text every output starts with: one for all, or one per sentence"
    )
    scores: bool = Field(
        False, description="also return each sentence's outputs: text, tokens, score, logprob"
    )
    attention: bool = Field(False, description="also return every layer's attention weights")


class ApiError(Exception):
    """An HTTP error response with a one-line message."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = {"error": {"status": status, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


def attention_json(amap: AttentionMap | None) -> dict | None:
    """Pieces and weights ``[layer][head][row][col]``, rounded to 4 decimals."""
    if amap is None:
        return None
    out: dict = {"source": amap.source, "target": amap.target, "target_in": amap.target_in}
    for kind in ATTENTION_KINDS:  # in float64: 0.0014 in float32 prints as 0.00139999995008111
        out[kind] = [(w.double() * 1e4).round().div(1e4).tolist() for w in amap.weights[kind]]
    return out


def check_json(request: Request) -> None:
    """415 unless the body is declared ``application/json``. A web page may POST a
    "simple" body (text/plain, a form) to any origin, 127.0.0.1 included, without a CORS
    preflight; JSON needs one, which this server never grants."""
    given = request.headers.get("content-type", "")
    kind = given.split(";", 1)[0].strip().lower()
    if kind != "application/json":
        raise ApiError(415, f"the body must be application/json, not {given[:80] or 'undeclared'}")
    codings = [c.strip().lower() for v in request.headers.getlist("content-encoding")
               for c in v.split(",")]  # fmt: skip
    if coded := [c for c in codings if c not in ("", "identity")]:  # gzip: "not UTF-8"
        raise ApiError(415, f"the body must be sent uncompressed, not as {coded[0][:40]}")


def check_key(request: Request, key: str | None) -> None:
    if key is None:
        return
    given = request.headers.get("x-api-key")  # empty: as absent (a proxy may add one)
    auth = request.headers.get("authorization", "")
    if not given and auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    if not given:
        raise ApiError(401, "an API key is required", {"WWW-Authenticate": "Bearer"})
    # Header values arrive decoded as latin-1: encode them back to the bytes the client
    # sent, which for a non-ASCII key are its UTF-8 bytes.
    if not hmac.compare_digest(given.encode("latin-1"), key.encode()):
        raise ApiError(403, "the API key is wrong")


class RequestCounter:
    """ASGI middleware: counts every HTTP response by path and status and times
    ``/translate``. Plain ASGI rather than ``@app.middleware``: Starlette's
    BaseHTTPMiddleware costs a task and a stream per request, on the event loop that
    shares the GIL with a worker thread (and it would hide a client's disconnect from
    the endpoint, which reads it from ``receive``)."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in KNOWN_PATHS else "other"
        timed = path == "/translate" and scope["method"] == "POST"  # no preflight timings
        start, status = time.perf_counter(), 500  # an exception that escapes is a 500

        async def send_and_note(message: Message) -> None:
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


class HeadAsGet:
    """ASGI middleware: a ``HEAD`` request is served as the ``GET`` of its path, with the
    same status and headers (Content-Length included) and no body, as Starlette's own
    routes do; FastAPI's routes take only the methods they name, and load balancers and
    uptime checks probe with HEAD. A path without GET still answers 405."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":  # the server may not drop it
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


async def client_gone(receive: Receive) -> None:
    """Return once the client has closed its connection (call it after the body is read).

    uvicorn does not cancel a request's task when its client goes away, and Starlette does
    not either for a plain (non-streaming) endpoint: the endpoint runs to its end and its
    response is dropped. All it is told is that ``receive()``, which waits once the body
    has been read, returns ``http.disconnect`` when the connection is lost (or when the
    response has been sent, which is why this must stop before then)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or 413 as soon as it passes ``limit`` bytes (declared or streamed); 499
    if the client goes away while sending it."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the body has {declared} bytes, more than the limit of {limit}")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the body is over the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(CLIENT_GONE, "the client closed the connection") from None
    return b"".join(chunks)


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


class _Digits:
    """An integer too long for int() (Python's limit is 4,300 digits): its field refuses it."""

    def __init__(self, text: str):
        self.digits = len(text.lstrip("-"))


def _integer(text: str) -> int | _Digits:
    return _Digits(text) if len(text) > 4000 else int(text)


class _Object(dict):
    """A JSON object that remembers the first key it was given twice (json keeps the last)."""

    twice: str | None = None


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    found, seen = _Object(pairs), set()
    for key, _ in pairs if len(found) < len(pairs) else ():
        if key in seen:
            found.twice = key
            break
        seen.add(key)
    return found


def _check_fields(data: object) -> None:
    """422 for a field given twice (a proxy or a log may read the first, the server the
    last) or one the API does not know: before validation, which spent a second on 80,000
    unknown fields while every other request waited."""
    if not isinstance(data, _Object):
        return
    if data.twice is not None:
        raise ApiError(422, f"{json.dumps(data.twice)[:60]}: the field is given twice")
    if unknown := [k for k in data if k not in TranslateRequest.model_fields]:
        known = ", ".join(TranslateRequest.model_fields)
        raise ApiError(422, f"{json.dumps(unknown[0])[:60]}: no such field (known: {known})")


def parse_request(body: bytes, max_sentences: int) -> TranslateRequest:
    """Decode, parse and range-check a body: 400 for bytes that are not UTF-8 JSON (or
    nest too deeply to parse), 422 for JSON of the wrong shape, settings out of range or
    text that is not valid Unicode (a lone surrogate, escaped). A leading byte order mark
    is ignored, as RFC 8259 (8.1) allows: some clients (Windows PowerShell 5) send one."""
    bom = len(codecs.BOM_UTF8) if body.startswith(codecs.BOM_UTF8) else 0
    try:
        text = body[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not UTF-8 (byte {bom + e.start})") from None
    if "\0" in text:  # never in JSON text (escaped as \u0000): UTF-16 has one per letter
        raise ApiError(400, f"the body is not UTF-8 JSON (a NUL at byte {text.index(chr(0))})")
    try:
        data = json.loads(
            text, parse_constant=_no_constants, parse_int=_integer, object_pairs_hook=_object
        )
    except ValueError as e:
        raise ApiError(400, f"the body is not valid JSON ({e})") from None
    except RecursionError:  # deep nesting: json's C parser recurses
        raise ApiError(400, "the body is not valid JSON (nested too deeply)") from None
    _check_fields(data)
    # Counted before validating: a million items of the wrong type took seconds to refuse.
    for field, what in (("src", "sentences"), ("prefix", "prefixes")):
        items = data.get(field) if isinstance(data, dict) else None
        if isinstance(items, list) and len(items) > max_sentences:
            raise ApiError(422, f"{field}: {len(items)} {what}, at most {max_sentences}")
    try:
        req = TranslateRequest.model_validate(data)
    except ValidationError as e:
        # The deepest error: for a union field (prefix: text or list of texts) the branch
        # that matched the most. Its loc names the union's branch ("prefix.list[str].1"):
        # keep the field and the list indices only ("prefix.1").
        first = max(e.errors(), key=lambda error: len(error["loc"]))
        loc, message = first["loc"], first["msg"]
        where = ".".join(
            [str(p) for p in loc[:1]] + [str(p) for p in loc[1:] if isinstance(p, int)]
        )
        if isinstance(first.get("input"), _Digits):
            message = f"a number of {first['input'].digits} digits is out of range"
        raise ApiError(422, f"{where or 'body'}: {message}") from None
    if not req.src:
        raise ApiError(422, "src: the list of sentences is empty")
    one_prefix = isinstance(req.prefix, str)
    prefixes = [req.prefix] if isinstance(req.prefix, str) else req.prefix or []
    for field, texts in (("src", req.src), ("prefix", prefixes)):
        for i, text in enumerate(texts):
            if (at := unencodable(text)) is not None:  # JSON may escape a lone surrogate
                where = "prefix" if field == "prefix" and one_prefix else f"{field}.{i}"
                raise ApiError(422, f"{where}: not valid Unicode (character {at})")
    return req


def request_options(
    req: TranslateRequest,
    defaults: DecodeOptions,
    max_beam: int,
    max_alpha: float,
    vocab: int | None = None,
) -> DecodeOptions:
    """The decoding options of a request: the model's ``defaults`` with the fields it sets,
    checked (422 naming the field) against the server's limits, the model's ``vocab``
    target ids (no more beams than tokens to start them) and by DecodeOptions. A sampling
    setting (``seed`` too) with sampling off is a 422."""
    if req.beam is not None and not 1 <= req.beam <= max_beam:
        raise ApiError(422, f"beam: {req.beam} is out of range 1..{max_beam}")
    if req.alpha is not None and not (math.isfinite(req.alpha) and 0 <= req.alpha <= max_alpha):
        raise ApiError(422, f"alpha: {req.alpha} is out of range 0..{max_alpha}")
    try:  # each field given replaces the rule it is part of (DecodeOptions.given)
        options = defaults.given(
            beam=req.beam, alpha=req.alpha, n_best=1, sampling=req.sampling,
            temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, seed=req.seed,
        )  # fmt: skip
    except DecodeError as e:
        raise ApiError(422, str(e)) from None
    if options.sampling:  # n_best samples: as many rows as a beam of that size
        if not 1 <= req.n_best <= max_beam:
            raise ApiError(422, f"n_best: {req.n_best} samples is out of range 1..{max_beam}")
    else:
        if vocab is not None and options.beam > vocab:
            raise ApiError(
                422, f"beam: {options.beam} is larger than the target vocabulary ({vocab})"
            )
        if not 1 <= req.n_best <= options.beam:
            raise ApiError(422, f"n_best: {req.n_best} is out of range 1..beam ({options.beam})")
        # Refused like temperature, top_k and top_p: a seed without sampling changes
        # nothing, and the client that sent it expected samples. (DecodeOptions lets it
        # pass, as the CLI's --seed does: a library caller may keep one options object.)
        if req.seed is not None:
            raise ApiError(422, f"seed={req.seed} only applies with sampling, which is off")
    return options.replace(n_best=req.n_best)


def request_prefixes(
    req: TranslateRequest,
    encode: Callable[[str], list[int]],
    max_tokens: int,
    special: Collection[int],
) -> list[list[int]] | None:
    """Per sentence the forced target ids (``encode``: text to target ids, an AiaynError
    for text it cannot force), or None when the request forces nothing. A prefix over
    ``max_tokens`` tokens (it must leave room for EOS), one whose text the tokenizer turns
    into a ``special`` id (EOS, PAD, BOS: "</s>" in a Marian vocabulary) or that ``encode``
    refuses is a 422 naming it: refused here, it never reaches a batch, where it would
    fail the requests beside it."""
    if req.prefix is None:
        return None
    one = isinstance(req.prefix, str)
    texts = [req.prefix] * len(req.src) if isinstance(req.prefix, str) else req.prefix
    if len(texts) != len(req.src):
        raise ApiError(422, f"prefix: {len(texts)} prefixes for {len(req.src)} sentences")
    found: list[list[int]] = []
    for i, text in enumerate(texts):
        if one and i:
            found.append(found[0])
            continue
        where = "prefix" if one else f"prefix.{i}"
        try:  # text the vocabulary cannot write is refused, not forced as <unk>
            ids = encode(text) if text.strip() else []
        except AiaynError as e:
            raise ApiError(422, f"{where}: {e}") from None
        if len(ids) > max_tokens:
            raise ApiError(
                422, f"{where}: {len(ids)} tokens, at most {max_tokens} (EOS must still fit)"
            )
        if any(t in special for t in ids):
            raise ApiError(
                422, f"{where}: holds a special token (end of sentence, padding or start), "
                "which cannot be forced",
            )  # fmt: skip
        found.append(ids)
    return found if any(found) else None


def origin_problem(origin: str) -> str | None:
    """What keeps ``origin`` from being a CORS origin (a browser sends
    ``scheme://host[:port]``, no path; or "*" for any), or None."""
    if origin == "*":
        return None
    scheme, sep, rest = origin.partition("://")
    if not sep or scheme not in ("http", "https") or not rest or "/" in rest or "*" in rest:
        return "is not an origin: scheme://host[:port] (http or https, no path), or *"
    return None
