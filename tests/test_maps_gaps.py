"""inspect.maps: gaps the suite left (found by a mutation run)."""

from __future__ import annotations

import pytest
import torch

from aiayn.decode.alignment import word_starts
from aiayn.inspect import maps
from aiayn.inspect.maps import add_alignments
from aiayn.translator import Translation, Translator
from test_marian_import import folders, tokenizers  # noqa: F401 - the fixtures

# The Marian fixtures train their tokenizers on Multi30k when it is there.
pytestmark = pytest.mark.multi30k


def test_alignments_count_source_words_in_the_source_vocabulary(folders, monkeypatch):  # noqa: F811
    """With separate vocabularies, the source ids are read as source pieces to find the
    source words: output piece t attends to source piece t here, so its pair is (the
    source word of piece t, the output word of piece t)."""
    translator = Translator.from_dir(folders["separate"][1])
    tok = translator.tokenizer

    def cross_attention(model, src, tgt_in, layer):  # row t: source position t
        weights = torch.zeros(*tgt_in.shape, src.size(1))
        for t in range(tgt_in.size(1)):
            weights[:, t, min(t, src.size(1) - 2)] = 1.0
        return weights

    monkeypatch.setattr(maps, "cross_attention", cross_attention)
    src = translator.encode("Zwei Männer fahren mit dem Fahrrad durch die Stadt.")
    out = tok.encode_target("Two men ride their bikes through the city today.")
    found = [[Translation("", [], out, 0.0, 0.0)]]
    add_alignments(translator, [src], found)
    src_words = word_starts([tok.id_to_piece(i, source=True) for i in src])
    tgt_words = word_starts([tok.id_to_piece(i) for i in out])
    rows = range(len(out))
    expected = sorted({(src_words[min(t, len(src) - 2)], tgt_words[t]) for t in rows})
    assert found[0][0].alignment == expected


def test_attention_maps_label_the_source_with_source_pieces(folders):  # noqa: F811
    translator = Translator.from_dir(folders["separate"][1])
    tok = translator.tokenizer
    src = translator.encode("Zwei Männer fahren mit dem Fahrrad.")
    out = tok.encode_target("Two men ride.")
    (found,) = maps.attention_maps(translator, [src], [out])
    assert found.source == [tok.id_to_piece(i, source=True) for i in src]
    assert found.target_in[1:] == [tok.id_to_piece(i) for i in out]


def test_attention_maps_need_one_output_per_source(folders):  # noqa: F811
    from aiayn.errors import AiaynError

    translator = Translator.from_dir(folders["separate"][1])
    src = translator.encode("Zwei Männer.")
    with pytest.raises(AiaynError, match="attention: 2 sources for 1 outputs"):
        maps.attention_maps(translator, [src, src], [[5]])
    with pytest.raises(AiaynError, match="attention: 1 sources for 2 outputs"):
        maps.attention_maps(translator, [src], [[5], [6]])


def test_a_wrong_layer_fails_before_any_work(folders):  # noqa: F811
    """add_alignments checks the layer first: refused even with nothing to align, and
    the translations given keep their alignment as it was."""
    from aiayn.errors import DecodeError

    translator = Translator.from_dir(folders["separate"][1])
    with pytest.raises(DecodeError, match="layer 9"):
        add_alignments(translator, [], [], layer=9)
    src = translator.encode("Zwei Männer.")
    found = [[Translation("", [], [5, 6], 0.0, 0.0)]]
    with pytest.raises(DecodeError, match="layer 0"):
        add_alignments(translator, [src], found, layer=0)
    assert found[0][0].alignment is None
