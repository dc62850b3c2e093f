"""Gaps that a mutation run of aiayn.serve.admission found: the bounds of its up-front
refusals (attention sentences, characters before tokenizing, attention weights), the
special ids a forced prefix may not hold, and the HTTP status of each way a job ends."""

from __future__ import annotations

import pytest

from aiayn import Transformer
from aiayn.errors import AiaynError
from aiayn.serve.admission import (
    CHARACTERS_PER_TOKEN,
    ModelInfo,
    answer,
    attention_weights,
    check_attention_sentences,
    check_attention_weights,
    too_long,
)
from aiayn.serve.jobs import (
    CancelledJobError,
    DeadlineError,
    Outcome,
    QueueFullError,
    Status,
    StoppedError,
    TooLargeError,
)
from aiayn.serve.protocol import CLIENT_GONE, ApiError, TranslateRequest
from aiayn.translator import Translator
from conftest import tiny_config


def test_attention_maps_for_exactly_the_limit_of_sentences_are_let_through():
    check_attention_sentences(TranslateRequest(src=["a", "b"], attention=True), 2)
    with pytest.raises(ApiError) as e:
        check_attention_sentences(TranslateRequest(src=["a", "b", "c"], attention=True), 2)
    assert e.value.status == 413 and "3 sentences ask for attention maps, at most 2" in str(e.value)
    check_attention_sentences(TranslateRequest(src=["a", "b", "c"]), 0)  # no maps asked


def test_a_text_is_refused_untokenized_only_past_64_characters_a_token_besides_whitespace():
    assert CHARACTERS_PER_TOKEN == 64
    most = 64 * 2
    assert too_long("x" * most, 2) is None
    assert too_long("x" * most + "   ", 2) is None  # longer, but whitespace is not counted
    assert too_long("x" * (most - 2) + " x x", 2) is None  # exactly `most` besides spaces
    why = too_long("x" * (most + 1), 2)
    assert why is not None and why.startswith(f"{most + 1} characters besides whitespace")


def test_the_attention_weight_bound_counts_every_layer_head_and_kind():
    cfg = tiny_config(n_encoder_layers=1, n_decoder_layers=3)  # 4 heads
    src, limits = [[5] * 3, [], [5] * 2], [4, 9, 1]
    per_head = (1 * 3 * 3 + 3 * (4 * 4 + 4 * 3)) + (1 * 2 * 2 + 3 * (1 * 1 + 1 * 2))
    assert attention_weights(src, cfg, limits) == per_head * 4  # the blank line: none
    check_attention_weights(100, 100)
    with pytest.raises(ApiError) as e:
        check_attention_weights(101, 100)
    assert e.value.status == 413


def test_a_forced_prefix_may_hold_no_eos_pad_or_bos_id():
    info = ModelInfo.of(Translator(Transformer(tiny_config(pad_id=0, bos_id=1, eos_id=2)), None))
    assert info.special_ids == {0, 1, 2}


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (TooLargeError("big"), 413),
        (StoppedError("stopping"), 503),
        (AiaynError("oops"), 500),
        (RuntimeError("model fell over"), 500),
    ],
)
def test_each_failure_of_a_job_is_its_http_status(error, status):
    with pytest.raises(ApiError) as e:
        answer(Outcome.failed(error))
    assert e.value.status == status


def test_a_timed_out_or_cancelled_job_is_504_or_client_gone_and_a_full_queue_passes_through():
    for outcome, status in [
        (Outcome(Status.TIMED_OUT), 504),
        (Outcome(Status.CANCELLED), CLIENT_GONE),
    ]:
        with pytest.raises(ApiError) as e:
            answer(outcome)
        assert e.value.status == status
    for error, status in [(DeadlineError("late"), 504), (CancelledJobError("gone"), CLIENT_GONE)]:
        with pytest.raises(ApiError) as e:
            answer(Outcome.failed(error))
        assert e.value.status == status
    with pytest.raises(QueueFullError):
        answer(Outcome.failed(QueueFullError("full")))
    assert answer(Outcome.done("value")) == "value"


class Words:
    """A tokenizer of one id per word."""

    def encode(self, text: str) -> list[int]:
        return [5] * len(text.split())


def test_a_source_of_exactly_the_models_positions_is_taken():
    import dataclasses

    from aiayn.serve.admission import encode_request

    info = ModelInfo.of(Translator(Transformer(tiny_config()), None))
    info = dataclasses.replace(info, tokenizer=Words(), max_source_tokens=4)
    assert encode_request(TranslateRequest(src=["a b c d", " "]), info) == ([[5] * 4, []], None)
    with pytest.raises(ApiError) as e:
        encode_request(TranslateRequest(src=["a", "a b c d e"]), info)
    assert e.value.status == 422 and e.value.message == "src.1: 5 tokens, the model takes at most 4"


def test_a_prefix_may_take_every_position_but_the_one_eos_needs(monkeypatch):
    import dataclasses

    from aiayn.serve import admission

    monkeypatch.setattr(
        admission, "prefix_ids", lambda tokenizer, text, name: [5] * len(text.split())
    )
    info = ModelInfo.of(Translator(Transformer(tiny_config()), None))
    info = dataclasses.replace(info, tokenizer=Words(), max_source_tokens=4)
    req = TranslateRequest(src=["a"], prefix="p p p")  # 3 = 4 positions - EOS
    assert admission.encode_request(req, info) == ([[5]], [[5] * 3])
    with pytest.raises(ApiError) as e:
        admission.encode_request(TranslateRequest(src=["a"], prefix="p p p p"), info)
    assert e.value.status == 422 and "4 tokens, at most 3" in e.value.message


def test_model_info_names_the_device_the_worker_runs_on():
    translator = Translator(Transformer(tiny_config()), None)
    assert ModelInfo.of(translator).device == "cpu"
    assert ModelInfo.of(translator, "cuda:1").device == "cuda:1"  # a worker process's device
