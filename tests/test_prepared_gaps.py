"""aiayn.data.prepared's pieces that the end-to-end prepare tests leave loose: the
reservoir sample the tokenizer is trained on is uniform and seeded, and only a validation
split keeps its text in memory while it is encoded."""

from __future__ import annotations

from collections import Counter

import numpy as np

from aiayn.data.prepared import encode_split, sample_pairs
from aiayn.data.shards import SplitWriter
from aiayn.data.tokenizer import Tokenizer

PAIRS = [(f"s{i}", f"t{i}") for i in range(6)]


def test_the_tokenizer_sample_is_seeded_and_in_stream_order():
    """The same seed draws the same pairs (a prepare is reproducible), in stream order."""
    assert sample_pairs(iter(PAIRS), 3, 1) == [PAIRS[2], PAIRS[3], PAIRS[5]]
    assert sample_pairs(iter(PAIRS), 3, 2) == [PAIRS[1], PAIRS[2], PAIRS[5]]
    assert sample_pairs(iter(PAIRS), 3, 3) == [PAIRS[0], PAIRS[2], PAIRS[3]]
    assert sample_pairs(iter(PAIRS[:2]), 5, 0) == PAIRS[:2]  # fewer than k: all of them
    assert sample_pairs(iter([]), 2, 0) == []


def test_the_tokenizer_sample_is_uniform():
    """Algorithm R keeps each of n pairs with probability k / n: over 400 seeds each of 5
    pairs is drawn about 400 * 2 / 5 = 160 times (measured 152-172). An off-by-one in
    the draw (randrange(n) for randrange(n + 1), or a slot never replaced) keeps one pair
    in every sample."""
    drawn = Counter(s for seed in range(400) for s, _ in sample_pairs(iter(PAIRS[:5]), 2, seed))
    assert sorted(drawn) == ["s0", "s1", "s2", "s3", "s4"]
    assert all(130 <= n <= 190 for n in drawn.values()), drawn


def test_only_a_validation_split_keeps_its_text(tmp_path, sample_prepared):
    """The kept text is the references of validation BLEU; a training split of millions of
    pairs returns none, so memory stays flat. Counts are returned either way."""
    spm = Tokenizer.load(sample_prepared).to_bytes()
    pairs = [("ein Hund", "a dog"), ("", "empty"), ("eine Katze", "a cat")]
    for split, want in (
        ("train", ([], [])),
        ("valid", (["ein Hund", "eine Katze"], ["a dog", "a cat"])),
    ):
        writer = SplitWriter(tmp_path, split, np.dtype(np.uint16))
        counts, texts = encode_split(iter(pairs), writer, spm, 1, show_progress=False)
        writer.discard()
        assert texts == want, split
        assert (counts.lines, counts.dropped_empty) == (3, 1)
