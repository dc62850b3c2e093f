"""The HTTP API of `aiayn serve`: every endpoint, every bad input (each a JSON 4xx, and the
server keeps serving), the queue limit, and a model that raises."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
from fastapi.testclient import TestClient

from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.decode import DecodeOptions
from aiayn.errors import AiaynError
from aiayn.serve import ServeConfig, create_app
from aiayn.serve.protocol import ApiError, TranslateRequest, parse_request, request_options
from aiayn.translator import Translator
from serve_util import ControlledTranslator, live_server, wait_for, wait_warmed_up

pytestmark = pytest.mark.timeout(120)  # a hang fails instead of blocking the suite

SENTENCES = ["Ein Hund rennt über die Wiese.", "Zwei Männer spielen Schach."]


@pytest.fixture(scope="module")
def translator(sample_model_dir) -> Translator:
    return Translator(*load_model(resolve_checkpoint(sample_model_dir())))


@pytest.fixture(scope="module")
def client(translator):
    cfg = ServeConfig(max_sentences=4, max_body_bytes=2000)
    with TestClient(create_app(translator, cfg)) as c:
        wait_for(lambda: c.get("/ready").status_code == 200, "/ready answer 200", timeout=30)
        yield c


def post(client, body: bytes, **headers):
    return client.post(
        "/translate", content=body, headers={"content-type": "application/json", **headers}
    )


def test_translate_equals_the_translator(client, translator):
    r = client.post("/translate", json={"src": [*SENTENCES, "  "], "beam": 3, "alpha": 0.5})
    assert r.status_code == 200, r.text
    expected = [c[0] for c in translator.translate([*SENTENCES, "  "], beam=3, alpha=0.5)]
    assert r.json() == {"translations": expected}
    assert expected[0] and expected[2] == ""


def test_attention_is_encoded_off_the_event_loop(client, monkeypatch):
    # A request's attention maps may be megabytes of JSON (seconds to encode: 4.4 s for
    # 3.5M weights here), which on the event loop would stall every other request.
    from starlette.responses import JSONResponse

    render, where = JSONResponse.render, []

    def spy(self, content):
        if isinstance(content, dict) and "attention" in content:
            try:
                asyncio.get_running_loop()
                where.append("loop")
            except RuntimeError:
                where.append("thread")
        return render(self, content)

    monkeypatch.setattr(JSONResponse, "render", spy)
    r = client.post("/translate", json={"src": SENTENCES[:1], "attention": True})
    assert r.status_code == 200, r.text
    assert r.json()["attention"][0]["cross"] and where == ["thread"]
    # Rounded to 4 decimals in the text too (float32 noise printed whole tripled the body).
    numbers = re.findall(rb"[0-9.e+-]+", r.content.split(b'"attention"', 1)[1])
    assert numbers and all(len(x.split(b".")[-1]) <= 4 for x in numbers if b"." in x)
    r = client.post("/translate", json={"src": SENTENCES[:1]})  # a small answer: as it was
    assert r.status_code == 200 and "attention" not in r.json()


def test_n_best_and_attention(client, translator):
    r = client.post("/translate", json={"src": SENTENCES[:1], "n_best": 2, "attention": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["n_best"] == translator.translate(SENTENCES[:1], beam=4, n_best=2)
    att = body["attention"][0]
    cfg = translator.model.cfg
    assert att["source"] == [
        translator.tokenizer.id_to_piece(i) for i in translator.encode(SENTENCES[0])
    ]
    assert att["target"][-1] == "</s>" and att["target_in"][0] == "<s>"
    # The pieces of the best output are the translation, and every kind has every layer
    # and head with rows x cols matching the pieces; each row is a distribution.
    assert translator.tokenizer.sp.decode_pieces(att["target"][:-1]) == body["translations"][0]
    S, T = len(att["source"]), len(att["target"])
    for kind, rows, cols in (("encoder", S, S), ("decoder_self", T, T), ("cross", T, S)):
        assert len(att[kind]) == cfg.n_layers and len(att[kind][0]) == cfg.n_heads
        for head in att[kind][-1]:
            assert len(head) == rows and all(len(row) == cols for row in head)
            assert all(abs(sum(row) - 1) < 1e-3 for row in head)
    causal = att["decoder_self"][0][0]
    assert all(w == 0 for r, row in enumerate(causal) for w in row[r + 1 :])


def test_health_ready_info_docs_and_page(client):
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {"ready": True}
    info = client.get("/info").json()
    assert info["model"]["heads"] == 4 and info["limits"]["max_sentences"] == 4
    assert info["api_key_required"] is False
    paths = client.get("/openapi.json").json()["paths"]
    ok = paths["/translate"]["post"]["responses"]["200"]  # an object, as before: not "{}"
    assert ok["content"]["application/json"]["schema"] == {"type": "object"}
    assert client.get("/docs").status_code == 200
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    # Everything the page loads ships in the package: no http(s) URL, no CDN.
    for asset in ["/", "/static/app.js", "/static/style.css"]:
        text = client.get(asset).text
        assert client.get(asset).status_code == 200
        assert not re.search(r"https?:|(src|href)=\"//|@import|url\(", text), asset


def test_every_get_endpoint_answers_head_with_its_headers_and_no_body(client):
    for path in ["/health", "/ready", "/info", "/docs", "/", "/static/app.js", "/metrics"]:
        got, head = client.get(path), client.head(path)
        assert head.status_code == 200, (path, head.text)
        assert head.content == b"", path
        assert head.headers["content-type"] == got.headers["content-type"], path
        if path != "/metrics":  # its counters move between the two requests
            assert head.headers["content-length"] == str(len(got.content)), path
    r = client.head("/translate")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert client.head("/nowhere").status_code == 404


def test_metrics_in_prometheus_text(client):
    client.post("/translate", json={"src": ["Ein Hund."]})
    post(client, b"{")
    text = client.get("/metrics").text
    assert client.get("/metrics").headers["content-type"].startswith("text/plain")
    assert re.search(r'aiayn_requests_total\{path="/translate",status="200"\} [1-9]', text)
    assert re.search(r'aiayn_requests_total\{path="/translate",status="400"\} [1-9]', text)
    assert re.search(r"aiayn_request_duration_seconds_count [1-9]", text)
    assert re.search(r'aiayn_batch_sentences_bucket\{le="\+Inf"\} [1-9]', text)
    assert "aiayn_queue_sentences 0" in text
    for line in text.splitlines():  # every sample line is `name{labels} number`
        assert line.startswith("#") or re.fullmatch(r"[a-z_]+(\{[^}]*\})? [0-9.e+-]+", line), line


BAD = [
    (b'{"src": ["ein', 400, "not valid JSON"),
    (b'{"src": ["Ein Hund \xff"]}', 400, "not UTF-8"),
    (b'{"src": ["a"], "alpha": NaN}', 400, "not valid JSON"),
    (b'["Ein Hund"]', 422, "body"),
    (b'{"src": "Ein Hund"}', 422, "src"),
    (b'{"src": [1, 2]}', 422, "src.0"),
    (b'{"src": ["a"], "beam": "4"}', 422, "beam"),
    (b'{"src": ["a"], "beam": 2.5}', 422, "beam"),
    (b'{"src": ["a"], "attention": "yes"}', 422, "attention"),
    (b'{"src": ["a"], "colour": "red"}', 422, '"colour": no such field (known: src, beam,'),
    (b'{"src": ["a"], "\\ud800": 1}', 422, '"\\ud800": no such field'),  # named, escaped
    # The last one won: a proxy or a log reading the first saw another request.
    (b'{"src": ["a"], "beam": 16, "beam": 2}', 422, '"beam": the field is given twice'),
    ('{"src": ["Ein Hund"]}'.encode("utf-16-le"), 400, "not UTF-8 JSON (a NUL at byte 1)"),
    (b'{"beam": 4}', 422, "src"),
    (b'{"src": []}', 422, "empty"),
    (b'{"src": ["a", "b", "c", "d", "e"]}', 422, "5 sentences, at most 4"),
    (b'{"src": ["a"], "beam": 0}', 422, "beam: 0 is out of range"),
    (b'{"src": ["a"], "beam": 17}', 422, "beam: 17 is out of range"),
    (b'{"src": ["a"], "beam": 2, "n_best": 3}', 422, "n_best: 3"),
    (b'{"src": ["a"], "n_best": 0}', 422, "n_best: 0"),
    (b'{"src": ["a"], "alpha": -1}', 422, "alpha"),
    (b'{"src": ["' + b"x" * 3000 + b'"]}', 413, "limit of 2000"),
    (b'{"src": ["a", "\\ud800 b"]}', 422, "src.1: not valid Unicode (character 0)"),
    (b'{"src": ["a"], "prefix": "\\udfff"}', 422, "prefix: not valid Unicode"),
    (b'{"src": ["a", "b"], "prefix": ["A", null]}', 422, "prefix.1: Input should be a valid"),
    (b'{"src": ["a"], "prefix": 5}', 422, "prefix: Input should be a valid"),
    (b'{"src": ["a"], "seed": 5}', 422, "seed=5 only applies with sampling, which is off"),
    (b'{"src": ["a"], "sampling": false, "seed": 0}', 422, "seed=0 only applies with sampling"),
]


@pytest.mark.parametrize(("body", "status", "message"), BAD, ids=[str(b[:24]) for b, _, _ in BAD])
def test_bad_input_is_a_json_4xx_and_the_server_goes_on(client, body, status, message):
    r = post(client, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["status"] == status and message in error["message"], error
    assert client.post("/translate", json={"src": ["Ein Hund."]}).status_code == 200


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"src": ["a"], "beam": ' + b"9" * 4301 + b"}", "beam: a number of 4301 digits"),
        (b'{"src": ["a"], "seed": -' + b"9" * 5000 + b"}", "seed: a number of 5000 digits"),
        (b'{"src": ["a", ' + b"9" * 5000 + b"]}", "src.1: a number of 5000 digits"),
    ],
)
def test_a_number_too_long_for_int_is_named_by_its_field(body, message):
    """Valid JSON past int()'s 4,300 digits was a 400 "not valid JSON", with CPython's
    advice to the operator to call sys.set_int_max_str_digits()."""
    with pytest.raises(ApiError) as e:
        parse_request(body, 100)
    assert e.value.status == 422 and e.value.message == message + " is out of range"
    assert parse_request(b'{"src": ["a"], "seed": ' + b"9" * 4000 + b"}", 1).seed == 10**4000 - 1


def test_many_unknown_fields_are_refused_before_validation(monkeypatch):
    """pydantic built one error per unknown field: 80,000 of them (a 1 MiB body) held the
    event loop for about 0.6 s, every other client waiting. The first is named now, and
    validation never runs."""

    def validate(data):
        raise AssertionError("validated")

    monkeypatch.setattr(TranslateRequest, "model_validate", validate)
    body = b'{"src": ["a"], ' + b", ".join(b'"k%d": 1' % i for i in range(80_000)) + b"}"
    with pytest.raises(ApiError) as e:
        parse_request(body, 100)
    assert e.value.status == 422 and e.value.message.startswith('"k0": no such field')
    with pytest.raises(ApiError) as e:  # the second of one key, last: found in one pass
        parse_request(body[:-1] + b', "k79999": 2}', 100)
    assert e.value.message == '"k79999": the field is given twice'


def test_a_body_with_a_byte_order_mark_is_read_as_without(client):
    """RFC 8259 lets a parser ignore a leading BOM; Windows PowerShell 5 sends one."""
    plain = post(client, b'{"src": ["Ein Hund."]}')
    r = post(client, b'\xef\xbb\xbf{"src": ["Ein Hund."]}')
    assert r.status_code == 200, r.text
    assert r.json()["translations"] == plain.json()["translations"]
    bad = post(client, b'\xef\xbb\xbf{"src": ["\xff"]}')  # the offset counts the BOM
    assert bad.status_code == 400 and "not UTF-8 (byte 13)" in bad.json()["error"]["message"]


def test_a_sentence_over_the_length_limit(client, translator):
    limit = translator.max_source_tokens
    long = " ".join(["Hund"] * (limit + 5))
    r = client.post("/translate", json={"src": ["Ein Hund.", long]})
    assert r.status_code == 422
    assert re.search(
        rf"src\.1: \d+ tokens, the model takes at most {limit}", r.json()["error"]["message"]
    )


def test_a_streamed_body_over_the_limit(client):
    def chunks():  # no Content-Length: the limit must hold while reading
        yield b'{"src": ["'
        for _ in range(40):
            yield b"y" * 100
        yield b'"]}'

    r = client.post("/translate", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


def test_a_list_too_long_is_counted_before_its_items_are_checked(translator):
    """A million items of the wrong type were refused after seconds on the event loop
    (pydantic listed an error for each), stalling every other client; the length is
    checked first."""
    items = b"[" + b",".join([b"1"] * 300_000) + b"]"
    with TestClient(create_app(translator, ServeConfig(worker="thread"))) as c:
        for body, message in [
            (b'{"src": ' + items + b"}", "src: 300000 sentences, at most 64"),
            (b'{"src": ["a"], "prefix": ' + items + b"}", "prefix: 300000 prefixes, at most 64"),
        ]:
            r = post(c, body)
            assert r.status_code == 422 and r.json()["error"]["message"] == message, r.text


def test_api_key(translator, monkeypatch):
    with TestClient(create_app(translator, ServeConfig(api_key="s3cret"))) as c:
        body = b'{"src": ["Ein Hund."], "beam": 1}'
        missing = post(c, body)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert post(c, body, **{"x-api-key": "wrong"}).status_code == 403
        assert post(c, body, authorization="Bearer nope").status_code == 403
        assert post(c, body, **{"x-api-key": "s3cret"}).status_code == 200
        assert post(c, body, authorization="Bearer s3cret").status_code == 200
        # An empty X-API-Key (a proxy's) beside the key as a Bearer token: it was a 401.
        assert post(c, body, authorization="Bearer s3cret", **{"x-api-key": ""}).status_code == 200
        for path in ("/info", "/metrics"):  # what the server runs, and its traffic
            assert c.get(path).status_code == 401
            assert c.get(path, headers={"x-api-key": "wrong"}).status_code == 403
            assert c.get(path, headers={"x-api-key": "s3cret"}).status_code == 200
        info = c.get("/info", headers={"authorization": "Bearer s3cret"})
        assert info.json()["api_key_required"] is True and "s3cret" not in info.text
        assert c.get("/health").status_code == 200  # probes need no key
        assert c.get("/ready").status_code == 200


def test_a_non_ascii_api_key_matches_the_utf8_bytes_clients_send(translator):
    key = "s3cr3t-k\u00e9"
    with TestClient(create_app(translator, ServeConfig(worker="thread", api_key=key))) as c:
        body = b'{"src": ["Ein Hund."], "beam": 1}'
        assert post(c, body, **{"x-api-key": key.encode()}).status_code == 200
        assert post(c, body, authorization=b"Bearer " + key.encode()).status_code == 200
        assert post(c, body, **{"x-api-key": "s3cr3t-ke"}).status_code == 403


def test_public_metrics_leaves_metrics_and_info_open_not_translate(translator):
    cfg = ServeConfig(worker="thread", api_key="s3cret", public_metrics=True)
    with TestClient(create_app(translator, cfg)) as c:
        assert c.get("/metrics").status_code == 200
        assert c.get("/info").json()["api_key_required"] is True
        assert post(c, b'{"src": ["Ein Hund."], "beam": 1}').status_code == 401


def test_unknown_path_is_json_404(client):
    r = client.get("/nope")
    assert r.status_code == 404 and r.json()["error"]["status"] == 404


def _post_in_thread(url: str, body: dict, out: list) -> threading.Thread:
    def run():
        out.append(httpx.post(url, json=body, timeout=60))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_for_metric(base: str, line: str) -> None:
    deadline = time.monotonic() + 10
    while line not in httpx.get(f"{base}/metrics").text:
        assert time.monotonic() < deadline, f"never saw {line!r}"
        time.sleep(0.02)


@contextlib.contextmanager
def _held_server(sample_model_dir, **settings):
    """A live server (worker thread) on a ControlledTranslator whose model batches wait at
    its closed gate; yields (translator, base URL)."""
    translator = ControlledTranslator(*load_model(resolve_checkpoint(sample_model_dir())))
    with live_server(translator, ServeConfig(worker="thread", **settings)) as base:
        translator.gate.clear()
        translator.entered.clear()
        translator.forget()
        yield translator, base


def test_full_queue_answers_429_with_retry_after(sample_model_dir):
    with _held_server(sample_model_dir, max_queue=3, batch_wait_ms=0) as (translator, base):
        first, queued = [], []
        threads = [_post_in_thread(f"{base}/translate", {"src": ["Ein Hund."]}, first)]
        assert translator.entered.wait(10), "the worker never took the first request"
        threads.append(_post_in_thread(f"{base}/translate", {"src": ["a", "b", "c"]}, queued))
        _wait_for_metric(base, "aiayn_queue_sentences 3")  # the second request queued
        r = httpx.post(f"{base}/translate", json={"src": ["Noch einer."]}, timeout=10)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert "queue is full" in r.json()["error"]["message"]
        translator.gate.set()
        for t in threads:
            t.join(30)
        assert first[0].status_code == 200 and queued[0].status_code == 200
        assert len(queued[0].json()["translations"]) == 3
        assert httpx.post(f"{base}/translate", json={"src": ["Noch einer."]}).status_code == 200


def test_a_failing_model_answers_every_waiting_request(sample_model_dir):
    with _held_server(sample_model_dir, batch_wait_ms=0) as (translator, base):
        translator.fail = True
        answers: list = []
        threads = [_post_in_thread(f"{base}/translate", {"src": ["Ein Hund."]}, answers)]
        assert translator.entered.wait(10)
        threads += [
            _post_in_thread(f"{base}/translate", {"src": [f"Satz {i}."]}, answers) for i in range(5)
        ]
        _wait_for_metric(base, "aiayn_queue_sentences 5")  # the requests queued
        translator.gate.set()  # the held batch and the next one (the 5 queued) both raise
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a request was left hanging"
        assert [a.status_code for a in answers] == [500] * 6
        assert all("the model fell over" in a.json()["error"]["message"] for a in answers)
        translator.fail = False
        ok = httpx.post(f"{base}/translate", json={"src": ["Ein Hund."]}, timeout=30)
        assert ok.status_code == 200 and ok.json()["translations"][0]
        assert httpx.get(f"{base}/ready").status_code == 200
        assert "aiayn_batch_errors_total 2" in httpx.get(f"{base}/metrics").text


def test_ready_fails_with_the_reason_when_the_first_translation_fails(sample_model_dir):
    translator = ControlledTranslator(*load_model(resolve_checkpoint(sample_model_dir())))
    translator.fail = True
    with TestClient(create_app(translator, ServeConfig(worker="thread"))) as c:
        r = wait_warmed_up(c)
        assert r.status_code == 503 and r.json()["ready"] is False
        assert "warm-up translation failed: the model fell over" in r.json()["reason"]
        assert c.get("/health").status_code == 200  # the process still answers


def test_alpha_takes_an_integer_but_no_boolean(client):
    assert client.post("/translate", json={"src": ["Ein Hund."], "alpha": 1}).status_code == 200
    r = client.post("/translate", json={"src": ["Ein Hund."], "alpha": True})
    assert r.status_code == 422 and "alpha" in r.json()["error"]["message"]


def test_a_request_joining_a_running_batch_gets_the_offline_result(sample_model_dir):
    """A is held at its first decoding step; B (another length penalty and n_best) queues,
    joins A's running batch, and both get what the Translator gives them on their own;
    each job is answered at the step its last sentence is done, the other going on."""
    offline = Translator(*load_model(resolve_checkpoint(sample_model_dir())))
    a = {"src": [*SENTENCES, "Eine Frau liest ein Buch im Park."], "beam": 3}
    b = {"src": ["Ein Hund.", ""], "beam": 3, "alpha": 1.0, "n_best": 2}
    want_a = offline.translate(a["src"], beam=3)
    want_b = offline.translate(b["src"], beam=3, alpha=1.0, n_best=2)
    with _held_server(sample_model_dir, batch_wait_ms=0, join_ratio=0) as (translator, base):
        answers: dict = {}
        threads = [_post_in_thread(f"{base}/translate", a, answers.setdefault("a", []))]
        assert translator.entered.wait(10), "the worker never took A"
        threads.append(_post_in_thread(f"{base}/translate", b, answers.setdefault("b", [])))
        _wait_for_metric(base, "aiayn_queue_sentences 2")
        translator.gate.set()
        for t in threads:
            t.join(30)
        assert "aiayn_running_sentences 0" in httpx.get(f"{base}/metrics").text
    assert answers["a"][0].json() == {"translations": [c[0] for c in want_a]}
    assert answers["b"][0].json() == {"translations": [c[0] for c in want_b], "n_best": want_b}
    assert (3, 1) in translator.joins  # B's one real sentence joined A's three
    # Sentences left the batch as they were done, and the first job answered was
    # answered while the other one's sentences were still running.
    left = [(len(tags), running) for tags, running in translator.left if tags]
    assert sum(n for n, _ in left) == 4 and left[0][1] > 0, translator.left


def test_a_failing_step_answers_every_job_in_the_running_batch(sample_model_dir):
    with _held_server(sample_model_dir, batch_wait_ms=0, join_ratio=0) as (translator, base):
        translator.fail_at_running = 3  # A and B together raise; A alone does not
        answers: list = []
        threads = [_post_in_thread(f"{base}/translate", {"src": SENTENCES}, answers)]
        assert translator.entered.wait(10)
        threads.append(_post_in_thread(f"{base}/translate", {"src": ["Ein Hund."]}, answers))
        _wait_for_metric(base, "aiayn_queue_sentences 1")
        translator.gate.set()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a request was left hanging"
        assert [r.status_code for r in answers] == [500, 500]
        assert all("the model fell over" in r.json()["error"]["message"] for r in answers)
        text = httpx.get(f"{base}/metrics").text
        assert "aiayn_batch_errors_total 1" in text and "aiayn_running_sentences 0" in text
        translator.fail_at_running = None
        ok = httpx.post(f"{base}/translate", json={"src": SENTENCES}, timeout=30)
        assert ok.json()["translations"] == [c[0] for c in translator.translate(SENTENCES)]


def test_scores_are_the_translators(client, translator):
    """`"scores": true` adds each sentence's outputs as `aiayn translate --format jsonl`
    gives them: text, tokens, score and log-probability, for every candidate."""
    r = client.post("/translate", json={"src": SENTENCES, "beam": 3, "n_best": 2, "scores": True})
    assert r.status_code == 200, r.text
    outputs = r.json()["outputs"]
    want = translator.translations(SENTENCES, beam=3, n_best=2)
    assert len(outputs) == 2 and all(len(o) == 2 for o in outputs)
    for got, expected in zip(outputs, want):
        assert [o["text"] for o in got] == [t.text for t in expected]
        assert [o["tokens"] for o in got] == [t.pieces for t in expected]
        assert [o["score"] for o in got] == pytest.approx([t.score for t in expected], abs=1e-4)
        assert [o["logprob"] for o in got] == pytest.approx(
            [t.log_prob for t in expected], abs=1e-4
        )
    assert r.json()["n_best"] == [[o["text"] for o in got] for got in outputs]


@pytest.mark.parametrize("beam", [1, 3])
def test_a_prefix_for_all_or_one_per_sentence(client, translator, beam):
    one = client.post("/translate", json={"src": SENTENCES, "beam": beam, "prefix": "Two"})
    assert one.status_code == 200, one.text
    assert one.json()["translations"] == [
        c[0] for c in translator.translate(SENTENCES, beam=beam, prefix="Two")
    ]
    assert all(t.startswith("Two") for t in one.json()["translations"])
    each = client.post("/translate", json={"src": SENTENCES, "beam": beam, "prefix": ["A", ""]})
    want = translator.translate(SENTENCES, beam=beam, prefixes=["A", ""])
    assert each.json()["translations"] == [c[0] for c in want]
    free = translator.translate(SENTENCES[1:], beam=beam)[0][0]
    assert each.json()["translations"][1] == free  # an empty prefix forces nothing
    bad = client.post("/translate", json={"src": SENTENCES, "prefix": ["A"]})
    assert bad.status_code == 422 and "prefix: 1 prefixes for 2 sentences" in bad.text
    # Text the vocabulary cannot write is refused (as offline), not forced as <unk>.
    for prefix, where in ((["A", "Zwei 中"], "prefix.1"), ("中", "prefix")):
        bad = client.post("/translate", json={"src": SENTENCES, "beam": beam, "prefix": prefix})
        assert bad.status_code == 422, bad.text
        assert bad.json()["error"]["message"] == (
            f"{where}: the model's vocabulary has no piece for '中'; a forced prefix must be "
            "text the model can write"
        )


def test_sampling_with_a_seed_is_reproducible(client, translator):
    body = {"src": SENTENCES, "sampling": True, "n_best": 3, "seed": 5, "temperature": 2.0}
    a, b = (client.post("/translate", json=body).json() for _ in range(2))
    assert a == b and len(a["n_best"][0]) == 3
    want = translator.translate(SENTENCES, sampling=True, beam=1, n_best=3, seed=5, temperature=2.0)
    assert a["n_best"] == want
    other = client.post("/translate", json={**body, "seed": 6}).json()
    assert other != a
    for bad, message in (({"top_p": 0.0}, "top_p must be in"), ({"beam": 3}, "takes no beam")):
        r = client.post("/translate", json={**body, **bad})
        assert r.status_code == 422 and message in r.json()["error"]["message"], r.text


def test_a_seed_needs_sampling_on_in_the_request_or_the_models_defaults():
    sampler = DecodeOptions.from_generation({"do_sample": True, "top_k": 5})
    for defaults, body in [
        (DecodeOptions(), {"sampling": True}),
        (sampler, {}),  # a model that samples by default takes a seed alone
    ]:
        got = request_options(TranslateRequest(src=["x"], seed=3, **body), defaults, 16, 10.0)
        assert got.sampling and got.seed == 3
    for defaults, body in [(DecodeOptions(), {}), (sampler, {"sampling": False})]:
        with pytest.raises(ApiError, match="seed=3 only applies with sampling") as e:
            request_options(TranslateRequest(src=["x"], seed=3, **body), defaults, 16, 10.0)
        assert e.value.status == 422
    # A beam given to a model that samples by default searches (it was a 422 "takes no
    # beam"), as the command line and Translator.translate(beam=4) do.
    got = request_options(TranslateRequest(src=["x"], beam=4, n_best=2), sampler, 16, 10.0)
    assert not got.sampling and (got.beam, got.n_best, got.top_k) == (4, 2, 0)


def test_cors_lets_the_named_origins_call_from_a_browser(translator, client):
    """`cors_origins` (`--cors-origin`): a browser's preflight from a named origin is
    answered with the methods and headers the API takes (the API key's too), a request
    from it carries Access-Control-Allow-Origin, another origin gets none, and without
    the setting no CORS header at all; something that is no origin is refused."""
    page = "http://localhost:3000"
    cfg = ServeConfig(worker="thread", api_key="s3cret", cors_origins=(page,))
    preflight = {
        "origin": page,
        "access-control-request-method": "POST",
        "access-control-request-headers": "content-type, x-api-key",
    }
    with TestClient(create_app(translator, cfg)) as c:
        ok = c.options("/translate", headers=preflight)
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == page
        assert "POST" in ok.headers["access-control-allow-methods"]
        assert "x-api-key" in ok.headers["access-control-allow-headers"].lower()
        body = b'{"src": ["Ein Hund."], "beam": 1}'
        r = post(c, body, origin=page, **{"x-api-key": "s3cret"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == page
        other = post(c, body, origin="http://elsewhere.example", **{"x-api-key": "s3cret"})
        assert "access-control-allow-origin" not in other.headers
        bad = c.options("/translate", headers={**preflight, "origin": "http://elsewhere.example"})
        assert bad.status_code == 400 and "access-control-allow-origin" not in bad.headers
        counted = c.get("/metrics", headers={"x-api-key": "s3cret"}).text  # preflights count
        assert 'aiayn_requests_total{path="/translate",status="400"} 1' in counted
        # ... but the latency of POST /translate holds the two POSTs alone
        assert "aiayn_request_duration_seconds_count 2" in counted, counted
    plain = post(client, b'{"src": ["Ein Hund."], "beam": 1}', origin=page)
    assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers
    for origin in ("localhost:3000", "http://x.org/page", "ftp://x.org", "http://"):
        with pytest.raises(AiaynError, match=f"cors_origins: '{re.escape(origin)}' is not an"):
            create_app(translator, ServeConfig(worker="thread", cors_origins=(origin,)))
