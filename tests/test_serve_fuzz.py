"""A fuzz test of the request schema: hundreds of random and malformed bodies (wrong types,
huge numbers, NaN, deep nesting, huge strings, unicode edge cases, unknown fields, empty
lists, bytes that are not JSON) sent to a live server. Each gets a 2xx or a 4xx, never a
5xx and never a hang, and the server is still ready afterwards. A seeded generator, not
hypothesis: the same bodies on every run, and no dependency."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.serve import ServeConfig
from aiayn.translator import Translator
from sample_data import PAIRS
from serve_util import live_server

pytestmark = pytest.mark.timeout(180)

BODIES = 500
FIELDS = ["src", "beam", "alpha", "n_best", "sampling", "temperature", "top_k", "top_p"]
FIELDS += ["seed", "prefix", "scores", "attention"]
TEXTS = [
    "Ein Hund.", "", " ", "\u0000", "\ud800", "\udfff\ud800", "\U0001f600" * 50, "\u202e\u200f",
    "e\u0301" * 300, "\ufeff", "</s>", "<pad>", "<unk>", "<s>", "\u2581", "Ω" * 2000,
    "a" * 200_000, "\n\t\r", "\\", '"', "ﬁ", "\u0085", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "x\x7fy", "<pad> Hund </s>",
]  # fmt: skip
NUMBERS = [
    0, 1, -1, 2, 4, 16, 17, 2**31, 2**63, 2**64 + 1, 10**30, -(10**30), 10**300,
    0.0, -0.0, 0.5, 1.0, 1e-300, 5e-324, 1e308, -1e308, 1.5, 99.9, 1e-7,
]  # fmt: skip
CONSTANTS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]  # not JSON, or inf
PLAUSIBLE: dict[str, list[Any]] = {  # per field: values near and past its edges
    "beam": [1, 2, 4, 16, 0, -1, 17, 2**63, True, 1.0, "4", None],
    "alpha": [0, 0.6, 10, 10.5, -0.1, 1e308, 5e-324, None, "x", True],
    "n_best": [1, 2, 4, 16, 0, 17, None],
    "sampling": [True, True, False, None, 1, "true"],
    "temperature": [1e-300, 5e-324, 0.01, 1.0, 100.0, 1e308, 0, -1, None],
    "top_k": [0, 1, 5, 2**62, -1, None],
    "top_p": [1e-300, 0.5, 1.0, 0.0, 1.0000001, None],
    "seed": [0, 1, 2**63, 2**64 + 1, 10**30, -1, None],
    "prefix": ["", "A", "</s>", "<pad>", "<pad> A", ["A"], [], "a " * 3000, None, "\ud800"],
    "scores": [True, False, None, 0],
    "attention": [True, False, None, 0],
}


def value(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON value (and sometimes a marker for a raw constant)."""
    kind = rng.randrange(9 if depth < 3 else 5)
    if kind == 0:
        return rng.choice(NUMBERS)
    if kind == 1:
        return rng.choice(TEXTS)
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return Raw(rng.choice(CONSTANTS))
    if kind == 4:
        return rng.randint(-5, 40)
    if kind == 5:
        return []
    if kind == 6:
        return [value(rng, depth + 1) for _ in range(rng.randint(1, 4))]
    if kind == 7:
        return [rng.choice(TEXTS) for _ in range(rng.choice([1, 2, 3, 65]))]
    return {rng.choice([*FIELDS, "zz"]): value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


class Raw(str):
    """Text written into the body as it is (NaN, Infinity: what json.dumps would quote)."""


def dumps(obj: Any) -> str:
    if isinstance(obj, Raw):
        return str(obj)
    if isinstance(obj, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{dumps(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, list):
        return "[" + ",".join(dumps(v) for v in obj) + "]"
    return json.dumps(obj)


def body(rng: random.Random) -> tuple[bytes, str]:
    """One random body and its Content-Type."""
    kind = rng.random()
    if kind < 0.55:  # a valid request with some fields set at random
        texts = TEXTS[:16] if rng.random() < 0.3 else ["Ein Hund.", "", "Zwei Männer.", "</s>"]
        obj: dict[str, Any] = {"src": [rng.choice(texts) for _ in range(rng.randint(1, 3))]}
        for field in rng.sample(FIELDS[1:], rng.randint(0, 4)):
            obj[field] = value(rng, 2) if rng.random() < 0.2 else rng.choice(PLAUSIBLE[field])
        if rng.random() < 0.1:
            obj[rng.choice(["extra", "Src", "__proto__", ""])] = value(rng)
        if rng.random() < 0.1:
            obj["src"] = rng.choice([[], [value(rng)], value(rng)])
        data = dumps(obj).encode("utf-8", "surrogatepass")
    elif kind < 0.8:  # any JSON-ish value at all
        data = dumps(value(rng)).encode("utf-8", "surrogatepass")
    else:  # bytes that are not a request
        depth = rng.choice([10, 1000, 100_000])
        data = rng.choice(
            [
                b"[" * depth + b"]" * depth,
                b'{"src": ' + b"[" * depth,
                b'{"src": ["a"]',
                bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))),
                b'{"src": ["\xff\xfe"]}',
                b'{"src": ["a"], "src": 1}',
                b"",
                b"null",
                b'"' + b"x" * 300_000 + b'"',
                b'{"beam": ' + b"9" * 5000 + b', "src": ["a"]}',
            ]
        )
    kinds = ["application/json"] * 8 + ["text/plain", "application/json; charset=latin-1"]
    return data, rng.choice(kinds)


def test_random_and_malformed_bodies_get_4xx_never_5xx(sample_model_dir):
    rng = random.Random(42)
    bodies = [body(rng) for _ in range(BODIES)]
    translator = Translator(*load_model(resolve_checkpoint(sample_model_dir())))
    cfg = ServeConfig(max_queue=100_000, request_timeout_s=60)
    with live_server(translator, cfg) as base, httpx.Client(base_url=base, timeout=60) as c:

        def send(item: tuple[bytes, str]) -> tuple[int, str]:
            data, kind = item
            r = c.post("/translate", content=data, headers={"content-type": kind})
            return r.status_code, r.text[:300]

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(send, bodies))
        bad = [(i, status, text) for i, (status, text) in enumerate(answers) if status >= 500]
        assert not bad, bad[:5]
        assert all(200 <= s < 500 for s, _ in answers)
        assert sum(s == 200 for s, _ in answers) > 60  # valid requests were among them
        assert c.get("/ready").status_code == 200
        r = c.post("/translate", json={"src": [de for de, _ in PAIRS[:2]]})
        assert r.status_code == 200 and all(r.json()["translations"])
