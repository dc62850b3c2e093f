"""The stopping rule of beam search, unit by unit (decode/engine.py): when a sentence is
done (``is_done``) and what an active beam's best log-prob is divided by for each
``early_stopping`` mode (``stop_bound``). The Marian tests check the same rule end to end
against transformers' generate(), on a model they train first; these run in milliseconds,
so the mutation benchmark's fast subset covers the rule too."""

from __future__ import annotations

import pytest

from aiayn.decode import DecodeOptions, Hypothesis, length_penalty
from aiayn.decode.beam import hypothesis, is_done, stop_bound


def finished(*scores: float) -> list[Hypothesis]:
    return [Hypothesis([5], s, s) for s in scores]


def test_is_done_needs_k_finished_and_no_active_beam_that_could_beat_the_kth() -> None:
    assert is_done([], float("-inf"), 2.0, K=2)  # no beam left alive: done whatever else
    assert not is_done(finished(-1.0), -0.5, 0.0, K=2)  # fewer than K finished
    assert is_done(finished(-1.0, -9.0), -0.1, 0.0, K=2)  # bound 0: K finished is enough
    # the K-th best (-2.0) against the best active beam over the largest penalty
    assert is_done(finished(-1.0, -2.0, -8.0), -4.0, 2.0, K=2)  # -2 >= -2: cannot win
    assert not is_done(finished(-1.0, -2.0, -8.0), -3.9, 2.0, K=2)  # -1.95 could
    assert not is_done(finished(-8.0, -1.0, -2.0), -3.9, 2.0, K=2)  # order does not matter
    assert is_done(finished(-1.0, -2.0, -8.0), -3.9, 2.0, K=1)  # K=1: against -1.0


def test_stop_bound_for_each_early_stopping_mode() -> None:
    never = DecodeOptions(beam=4, alpha=0.6, early_stopping="never")
    assert stop_bound(never, limit=30, steps=7) == length_penalty(30, 0.6)  # at the limit
    hf = DecodeOptions(beam=4, alpha=1.5, length_penalty="hf", early_stopping=False)
    assert stop_bound(hf, limit=30, steps=7) == pytest.approx(7**1.5)  # at the length so far
    assert stop_bound(DecodeOptions(beam=4, early_stopping=True), limit=30, steps=7) == 0.0


def test_a_finished_hypothesis_is_scored_at_its_length_with_the_eos() -> None:
    h = hypothesis([7, 8, 9], -3.0, alpha=1.0, kind="hf")
    assert (h.tokens, h.log_prob, h.score) == ([7, 8, 9], -3.0, pytest.approx(-3.0 / 4))
    g = hypothesis([7], -2.0, alpha=0.6)  # gnmt: ((5 + 2) / 6) ** 0.6
    assert g.score == pytest.approx(-2.0 / (7 / 6) ** 0.6)


def test_an_empty_output_without_eos_keeps_its_log_prob_as_its_score() -> None:
    """An output of no token and no EOS (a sentence allowed no token at all) has length
    0, and the "hf" penalty 0 ** alpha is 0: its score is its log-prob, not a division by
    zero. The "gnmt" penalty of length 0, (5 / 6) ** alpha, is not 0 and divides as ever."""
    h = hypothesis([], -1.5, alpha=1.0, kind="hf", eos=False)
    assert (h.tokens, h.score, h.log_prob, h.eos) == ([], -1.5, -1.5, False)
    g = hypothesis([], -1.5, alpha=1.0, eos=False)
    assert g.score == pytest.approx(-1.5 / (5 / 6))
