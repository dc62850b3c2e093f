"""13a tokenization (aiayn.metrics.bleu) of every ASCII punctuation mark in every context,
against sacreBLEU's, and of what the corpus comparisons elsewhere never meet: '/', and a
comma or period between a non-digit and a digit."""

from __future__ import annotations

import string

import pytest
import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from aiayn.metrics.bleu import corpus_bleu, tokenize_13a


def _contexts(c: str) -> list[str]:
    return [f"a{c}b", f"1{c}2", f"a{c}1", f"1{c}a", f"{c}a", f"a{c}", f" {c} ", f"x {c}{c} 9"]


@pytest.mark.parametrize("char", list(string.punctuation))
def test_13a_splits_every_ascii_punctuation_mark_in_every_context_as_sacrebleu(char):
    theirs = Tokenizer13a()
    for line in _contexts(char):
        assert tokenize_13a(line) == theirs(line), repr(line)


def test_13a_slash_and_comma_before_a_digit():
    assert tokenize_13a("km/h") == "km / h"
    assert tokenize_13a("and/or 1/2") == "and / or 1 / 2"
    assert tokenize_13a("page,2") == "page , 2"  # comma after a non-digit, before a digit
    assert tokenize_13a("v.2") == "v . 2"
    assert tokenize_13a("1,000.5") == "1,000.5"  # between digits: kept


def test_corpus_bleu_on_slashes_and_commas_before_digits_equals_sacrebleu():
    hyps = ["the speed is 50 km/h on page,2 of v.3", "and/or a 1/2 cup, 3 eggs"]
    refs = ["the speed is 50 km / h on page , 2 of v . 3", "and / or a 1/2 cup,3 eggs"]
    ours, theirs = corpus_bleu(hyps, refs), sacrebleu.corpus_bleu(hyps, [refs])
    assert ours.score == theirs.score
    assert ours.counts == theirs.counts and ours.totals == theirs.totals
    assert (ours.sys_len, ours.ref_len) == (theirs.sys_len, theirs.ref_len)
