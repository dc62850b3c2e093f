"""Word alignments: gaps the suite left (found by a mutation run)."""

from __future__ import annotations

import copy

import pytest

from aiayn.inspect.maps import add_alignments
from aiayn.translator import Translator
from sample_data import PAIRS


@pytest.fixture(scope="module")
def translator(sample_model_dir):
    return Translator.from_dir(sample_model_dir(False))


def test_the_default_layer_is_the_last_decoder_layer(translator):
    """add_alignments' default layer is -1, the last decoder layer (BENCHMARKS.md)."""
    lines = [src for src, _ in PAIRS[:12]]
    found = translator.translations(lines, beam=1)
    ids = [translator.encode(line) for line in lines]
    n = translator.model.cfg.decoder_layers
    by_layer = {}
    for layer in (None, n, 1):
        copied = copy.deepcopy(found)
        if layer is None:
            add_alignments(translator, ids, copied)
        else:
            add_alignments(translator, ids, copied, layer=layer)
        by_layer[layer] = [[t.alignment for t in out] for out in copied]
    assert by_layer[None] == by_layer[n]
    assert by_layer[1] != by_layer[n]  # the layers differ: the default is told apart


def test_hard_alignment_of_no_rows_is_empty():
    import torch

    from aiayn.decode.alignment import hard_alignment

    assert hard_alignment(torch.empty(0, 4)) == []
    assert hard_alignment(torch.empty(0, 4), skip_src=[3]) == []
    assert hard_alignment(torch.empty(0, 0)) == []  # no rows and no source: nothing
    assert hard_alignment(torch.ones(1, 1)) == [0]  # one piece, one source piece
    assert hard_alignment(torch.tensor([[0.1, 0.9, 0.0]]), skip_src=[1]) == [0]


def test_a_space_piece_between_words_joins_the_word_after_it():
    from aiayn.decode.alignment import word_starts

    assert word_starts(["▁A", "▁", "▁B", "▁C"]) == [0, 1, 1, 2]
    assert word_starts(["▁", "A", "▁B", "▁C"]) == [0, 0, 1, 2]
    assert word_starts(["▁A", "▁"]) == [0, 0]


def test_links_must_be_one_per_output_piece():
    from aiayn.decode.alignment import word_alignment
    from aiayn.errors import DecodeError

    assert word_alignment([1, 0], [0, 1], [0, 0]) == [(0, 0), (1, 0)]
    with pytest.raises(DecodeError, match="2 links for 1 output pieces"):
        word_alignment([0, 1], [0, 1], [0])
    with pytest.raises(DecodeError, match="1 links for 2 output pieces"):
        word_alignment([0], [0, 1], [0, 1])


def test_hard_alignment_leaves_the_weights_given_as_they_were():
    import torch

    from aiayn.decode.alignment import hard_alignment

    weights = torch.tensor([[0.1, 0.8, 0.1], [0.2, 0.3, 0.5]])
    before = weights.clone()
    assert hard_alignment(weights, skip_src=[1]) == [0, 2]
    assert torch.equal(weights, before)
