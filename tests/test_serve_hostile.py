"""The server against hostile or careless requests (issue 42): heavy requests are bounded
before they run, tokenizing happens off the event loop, one bad request fails only
itself with a 4xx (prefixes checked when parsed), an explicit false wins over an imported
model's defaults, a body that is not declared JSON is refused (415), and an imported model
whose generation settings give no length decodes under aiayn's length rule."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
from fastapi.testclient import TestClient

from aiayn import Transformer, TransformerConfig
from aiayn.checkpoint import BEST, load_checkpoint, load_model, resolve_checkpoint, save_checkpoint
from aiayn.cli import main
from aiayn.data.marian_tokenizer import MarianTokenizer
from aiayn.decode import DecodeOptions
from aiayn.serve import ServeConfig, create_app
from aiayn.serve.protocol import ApiError, TranslateRequest, parse_request, request_options
from aiayn.translator import Translator
from marian_util import write_tokenizer
from sample_data import PAIRS
from serve_util import ControlledTranslator, serving, wait_for, wait_warmed_up

pytestmark = [pytest.mark.multi30k, pytest.mark.timeout(120)]  # Marian fixtures read Multi30k

GERMAN = [de for de, _ in PAIRS]
SAMPLING = {"do_sample": True, "top_k": 5, "temperature": 0.7, "max_length": 40}


@pytest.fixture(scope="module")
def parts(sample_model_dir):
    return load_model(resolve_checkpoint(sample_model_dir()))


@pytest.fixture(scope="module")
def client(parts):
    with TestClient(create_app(Translator(*parts), ServeConfig(worker="thread"))) as c:
        assert wait_warmed_up(c).status_code == 200
        yield c


# -- heavy requests are bounded before they run -----------------------------------------
def test_attention_for_many_sentences_is_413_before_any_work(client):
    r = client.post("/translate", json={"src": GERMAN[:64], "attention": True})
    assert r.status_code == 413, r.text
    assert r.json()["error"]["message"].startswith(
        "attention: 64 sentences ask for attention maps, at most 4 may"
    )
    r = client.post("/translate", json={"src": GERMAN[:64], "beam": 1})  # without: fine
    assert r.status_code == 200 and len(r.json()["translations"]) == 64


def test_attention_over_the_weight_limit_is_413_naming_it(parts):
    cfg = ServeConfig(worker="thread", max_attention_weights=100_000)
    with TestClient(create_app(Translator(*parts), cfg)) as c:
        assert wait_warmed_up(c).status_code == 200
        r = c.post("/translate", json={"src": GERMAN[:4], "attention": True})
        assert r.status_code == 413, r.text
        assert "more than the limit of 100000" in r.json()["error"]["message"]
        r = c.post("/translate", json={"src": ["Ein Hund."], "attention": True})
        assert r.status_code == 200 and r.json()["attention"][0]["cross"]


def test_a_forced_prefix_counts_in_the_attention_weight_limit(parts):
    model, tokenizer = parts
    cfg = model.cfg
    S = len(tokenizer.encode("Ein Hund."))
    T = min(S + 50, cfg.max_len)  # the default length rule: source + 50
    bound = cfg.n_heads * (cfg.encoder_layers * S * S + cfg.decoder_layers * (T * T + T * S))
    words = next(  # a prefix the model takes that outgrows the length rule
        n for n in range(1, cfg.max_len) if len(tokenizer.encode_target("Hund " * n)) >= T
    )
    prefix = "Hund " * words
    assert T <= len(tokenizer.encode_target(prefix)) < cfg.max_len
    with TestClient(
        create_app(Translator(*parts), ServeConfig(worker="thread", max_attention_weights=bound))
    ) as c:
        assert wait_warmed_up(c).status_code == 200
        r = c.post("/translate", json={"src": ["Ein Hund."], "attention": True, "beam": 1})
        assert r.status_code == 200, r.text  # exactly at the limit without a prefix
        body = {"src": ["Ein Hund."], "attention": True, "beam": 1, "prefix": prefix}
        r = c.post("/translate", json=body)
        assert r.status_code == 413, r.text
        assert "more than the limit of" in r.json()["error"]["message"]


def test_tokenizing_runs_off_the_event_loop(client, monkeypatch):
    tokenizer_class = type(client.app.state.worker.translator.tokenizer)
    encode, seen = tokenizer_class.encode, []

    def recording(self, text, *args, **kwargs):
        if text.startswith("Markierung"):
            try:
                asyncio.get_running_loop()
                seen.append("on the event loop")
            except RuntimeError:
                seen.append("off the loop")
        return encode(self, text, *args, **kwargs)

    monkeypatch.setattr(tokenizer_class, "encode", recording)
    r = client.post("/translate", json={"src": ["Markierung " * 300], "beam": 1})
    assert r.status_code == 422 and r.json()["error"]["message"].startswith("src.0: ")
    assert seen == ["off the loop"]


# -- one bad request fails only itself --------------------------------------------------
def test_a_body_nested_too_deeply_is_400_not_a_crash():
    with pytest.raises(ApiError) as caught:
        parse_request(b"[" * 100_000 + b"]" * 100_000, 64)
    assert (caught.value.status, caught.value.message) == (
        400,
        "the body is not valid JSON (nested too deeply)",
    )


def test_a_bad_prefix_fails_only_its_request_in_a_shared_batch(parts):
    translator = ControlledTranslator(*parts)
    with serving(create_app(translator, ServeConfig(worker="thread"))) as base:
        translator.gate.clear()
        translator.entered.clear()
        answers: dict[str, httpx.Response] = {}

        def post(name: str, prefix: str) -> threading.Thread:
            body = {"src": [GERMAN[len(answers) + 1]], "beam": 1, "prefix": prefix}
            thread = threading.Thread(
                target=lambda: answers.__setitem__(
                    name, httpx.post(f"{base}/translate", json=body, timeout=60)
                )
            )
            thread.start()
            return thread

        threads = [post("first", "A")]  # holds the worker at the gate
        assert translator.entered.wait(30)
        queued = lambda n: f"aiayn_queue_sentences {n}\n" in httpx.get(f"{base}/metrics").text  # noqa: E731
        threads.append(post("good", "A dog"))
        wait_for(lambda: queued(1), "the good request queued")
        too_long = " ".join(["dog"] * 80)  # over the model's 64 positions
        threads.append(post("bad", too_long))
        wait_for(lambda: "bad" in answers or queued(2), "the bad request answered or queued")
        threads.append(post("also good", "Two"))
        wait_for(lambda: queued(2 if "bad" in answers else 3), "the last request queued")
        translator.gate.set()
        for t in threads:
            t.join(60)
    assert answers["bad"].status_code == 422, answers["bad"].text
    assert answers["bad"].json()["error"]["message"].startswith("prefix: ")
    assert "EOS must still fit" in answers["bad"].json()["error"]["message"]
    for name in ("first", "good", "also good"):
        assert answers[name].status_code == 200, answers[name].text
    assert translator.joins[-1][1] == 2  # the two good ones joined the batch together


@pytest.fixture(scope="module")
def marian_translator(tmp_path_factory):
    """A random model under a Marian vocabulary (``</s>`` 0, ``<pad>`` last)."""
    folder = tmp_path_factory.mktemp("marian_tok")
    write_tokenizer(folder)
    tokenizer = MarianTokenizer.load_dir(folder)
    pad = tokenizer.vocab_size - 1
    cfg = TransformerConfig(
        src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, d_model=16,
        n_heads=2, n_layers=1, d_ff=32, max_len=64, pad_id=pad, bos_id=pad, eos_id=0,
        share_embeddings=True,
    )  # fmt: skip
    return Translator(Transformer(cfg), tokenizer, {"num_beams": 2, "max_length": 10})


@pytest.mark.parametrize("special", ["</s>", "<pad>"])
def test_a_prefix_with_a_special_token_is_422_naming_it(marian_translator, special):
    app = create_app(marian_translator, ServeConfig(worker="thread"))
    with TestClient(app) as c:
        body = {"src": ["Ein Hund.", "Eine Katze."], "prefix": ["A", f"Two {special} cats"]}
        r = c.post("/translate", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["message"].startswith("prefix.1: holds a special token")
        r = c.post("/translate", json={**body, "prefix": ["A", "Two"]})
        assert r.status_code == 200, r.text


def test_sampling_false_overrides_a_model_that_samples(parts):
    defaults = DecodeOptions.from_generation(SAMPLING)
    assert defaults.sampling and defaults.top_k == 5
    off = request_options(TranslateRequest(src=["x"], sampling=False), defaults, 16, 10.0)
    assert not off.sampling and (off.temperature, off.top_k, off.top_p) == (1.0, 0, 1.0)
    assert off.max_len_b == defaults.max_len_b  # the rest of the model's settings stay
    unset = request_options(TranslateRequest(src=["x"]), defaults, 16, 10.0)
    assert unset == defaults
    translator = Translator(*parts, generation=SAMPLING)
    greedy = Translator(*parts).translate(GERMAN[:3], beam=1, max_len_a=0, max_len_b=39)
    with TestClient(create_app(translator, ServeConfig(worker="thread"))) as c:
        for _ in range(2):  # sampling would differ between two runs without a seed
            r = c.post("/translate", json={"src": GERMAN[:3], "sampling": False})
            assert r.status_code == 200, r.text
            assert r.json()["translations"] == [t[0] for t in greedy]
        body = {"src": GERMAN[:1], "sampling": False, "top_k": 3}
        r = c.post("/translate", json=body)  # a sampling setting with sampling off
        assert r.status_code == 422 and "with sampling, which is off" in r.text
        r = c.post("/translate", json={"src": GERMAN[:1], "scores": False, "attention": False})
        assert r.status_code == 200 and set(r.json()) == {"translations"}


# -- requests from other origins ---------------------------------------------------------
@pytest.mark.parametrize("kind", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_not_declared_json_is_415(client, kind):
    headers = {"content-type": kind} if kind else {}
    r = client.post("/translate", content=b'{"src": ["Ein Hund."]}', headers=headers)
    assert r.status_code == 415, r.text
    assert "must be application/json" in r.json()["error"]["message"]
    r = client.post(
        "/translate",
        content=b'{"src": ["Ein Hund."], "beam": 1}',
        headers={"content-type": "Application/JSON; charset=utf-8"},
    )
    assert r.status_code == 200


def test_a_compressed_body_is_415_not_a_utf8_error(client):
    import gzip

    body = gzip.compress(b'{"src": ["Ein Hund."], "beam": 1}')
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    r = client.post("/translate", content=body, headers=headers)
    assert r.status_code == 415, r.text  # was 400 "the body is not UTF-8 (byte 1)"
    assert "must be sent uncompressed, not as gzip" in r.json()["error"]["message"]
    for coding in ("identity", "identity, ", ""):
        plain = {**headers, "content-encoding": coding}
        r = client.post("/translate", content=b'{"src": ["Ein Hund."], "beam": 1}', headers=plain)
        assert r.status_code == 200, (coding, r.text)


# -- bad defaults ------------------------------------------------------------------------
def test_settings_without_a_length_take_aiayns_rule(parts, sample_model_dir, tmp_path, capsys):
    options = DecodeOptions.from_generation({"num_beams": 4})
    assert (options.max_len_a, options.max_len_b) == (1.0, 50)  # not 20 positions
    given = DecodeOptions.from_generation({"num_beams": 4, "max_length": 30})
    assert (given.max_len_a, given.max_len_b) == (0.0, 29)
    translator = Translator(*parts, generation={"num_beams": 4})
    assert translator.length_rule == (
        "1 x source + 50 tokens, within the model's 64 positions "
        "(aiayn's rule: generation_config.json sets no max_length)"
    )
    with TestClient(create_app(translator, ServeConfig(worker="thread"))) as c:
        assert c.get("/info").json()["model"]["length_rule"] == translator.length_rule
    state = load_checkpoint(sample_model_dir() / BEST)
    save_checkpoint({**state, "generation": {"num_beams": 4}}, tmp_path / "m" / BEST)
    assert main(["summary", "--model", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert f"output length by default: {translator.length_rule}" in out
    assert main(["summary", "--model", str(sample_model_dir())]) == 0
    assert "1 x source + 50 tokens, within the model's 64 positions (aiayn's rule)\n" in (
        capsys.readouterr().out
    )


def test_a_beam_over_the_target_vocabulary_is_a_422_not_a_model_failure(parts):
    """The engine refuses more beams than target tokens (DecodeError); the server let such
    a beam through to the batch, where it became a 500 counted as a failed job."""
    model, _ = parts
    vocab = model.cfg.tgt_vocab_size
    config = ServeConfig(worker="thread", max_beam=vocab + 1)
    with TestClient(create_app(Translator(*parts), config)) as c:
        assert wait_warmed_up(c).status_code == 200
        r = c.post("/translate", json={"src": GERMAN[:1], "beam": vocab + 1})
        assert r.status_code == 422, r.text
        message = r.json()["error"]["message"]
        assert message == f"beam: {vocab + 1} is larger than the target vocabulary ({vocab})"
        r = c.post("/translate", json={"src": GERMAN[:1], "beam": 2})
        assert r.status_code == 200, r.text


def test_a_sentence_no_model_could_take_is_refused_before_it_is_tokenized(client, monkeypatch):
    """A megabyte sentence was tokenized whole (a second of CPU, which the requests beside
    it waited for) before its token count was refused."""
    from aiayn.serve import admission

    limit = client.get("/info").json()["model"]["max_source_tokens"]
    huge = "Hund " * (admission.CHARACTERS_PER_TOKEN * limit // 4 + 1)
    r = client.post("/translate", json={"src": ["Ein Hund.", huge]})
    assert r.status_code == 422, r.text
    n = len(huge.replace(" ", ""))
    assert r.json()["error"]["message"].startswith(f"src.1: {n} characters besides whitespace")
    r = client.post("/translate", json={"src": GERMAN[:2], "prefix": ["A", huge]})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["message"].startswith(f"prefix.1: {n} characters")
    spaced = " " * len(huge) + "Ein Hund."  # whitespace the tokenizer collapses: no refusal
    r = client.post("/translate", json={"src": [spaced, " " * len(huge)]})
    assert r.status_code == 200 and r.json()["translations"][1] == "", r.text
    r = client.post("/translate", json={"src": ["Hund " * (limit + 1)]})  # long, not absurd
    assert r.status_code == 422 and "tokens, the model takes at most" in r.text, r.text
