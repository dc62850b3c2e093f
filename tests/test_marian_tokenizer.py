"""aiayn's MarianTokenizer gives the ids and texts of transformers' MarianTokenizer (the
ground truth), without transformers: source and target SentencePiece models, a shuffled
vocab.json whose ids are not SentencePiece's, a ``>>fra<<`` language token kept whole,
EOS appended to sources; and it travels whole in a checkpoint's bytes."""

from __future__ import annotations

import json

import pytest
import transformers

from aiayn.data.marian_tokenizer import MarianTokenizer
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import TokenizerError
from marian_util import corpus_lines, write_tokenizer

pytestmark = pytest.mark.multi30k  # reads Multi30k where it is; CI runs it again without

ODD = [
    ">>fra<< Ein Mann fährt Fahrrad.",  # a language token: one id
    ">>fra<<Zwei Hunde",
    ">>xyz<< unbekannt",  # not in the vocabulary: <unk>
    "Ein >>fra<< mitten drin",  # only at the start is it a language token
    "Ein Mann </s> fährt <unk> x <pad>",  # special tokens written in the text stay whole
    "  viel   Platz  ",
    "Xylophon 😀 ǂ",  # pieces the vocabulary lacks
    "",
]


@pytest.fixture(scope="module", params=["shared", "separate"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"tok_{request.param}")
    write_tokenizer(path, spm_vocab=300, separate=request.param == "separate")
    return path


def test_ids_and_texts_equal_transformers_on_200_multi30k_lines(folder):
    hf = transformers.MarianTokenizer.from_pretrained(folder)
    ours = Tokenizer.load(folder)  # a model directory with Marian's files
    assert isinstance(ours, MarianTokenizer) and ours.add_source_eos
    assert (ours.pad_id, ours.eos_id, ours.unk_id, ours.bos_id) == (
        hf.pad_token_id, hf.eos_token_id, hf.unk_token_id, hf.pad_token_id
    )  # fmt: skip
    de, en = corpus_lines("val", 200)
    src = ours.encode_batch(de + ODD)
    assert src == [hf(s).input_ids for s in de + ODD]
    assert [ours.encode(s) for s in de[:20]] == src[:20]
    tgt = ours.encode_target_batch(en + ODD)
    assert [[*t, ours.eos_id] for t in tgt] == [hf(text_target=t).input_ids for t in en + ODD]
    assert [ours.encode_target(t) for t in en[:20]] == tgt[:20]
    for ids in tgt:  # detokenization: transformers' decode, special tokens skipped
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert len({len(s) for s in src}) > 1 and max(map(len, src)) > 10  # real sentences


def test_language_token_is_one_id_and_vocab_ids_are_not_sentencepiece_ids(folder):
    ours = Tokenizer.load(folder)
    fra = ours.vocab[">>fra<<"]
    assert ours.encode(">>fra<< Ein Hund")[0] == fra
    assert ours.encode(">>fra<< Ein Hund")[1:] == [*ours.encode("Ein Hund")[:-1], ours.eos_id]
    spm_ids = ours.spm_source.encode("Ein Mann fährt Fahrrad.")
    assert ours.encode("Ein Mann fährt Fahrrad.")[:-1] != spm_ids


def test_ids_outside_the_vocabulary_are_named_not_wrapped(folder):
    """A negative id indexed the piece list from its end (the last piece, without a word)
    and a too large one was a bare IndexError: both are a TokenizerError naming the item."""
    import torch

    ours = Tokenizer.load(folder)
    size = ours.tgt_vocab_size
    ids = ours.encode_target("Ein Hund")
    with pytest.raises(TokenizerError, match=r"^id: -1 is outside the vocabulary"):
        ours.id_to_piece(-1)
    with pytest.raises(
        TokenizerError, match=rf"^ids\[1\]: -1 is outside the vocabulary \[0, {size}\)"
    ):
        ours.decode([ids[0], -1])
    with pytest.raises(TokenizerError, match=rf"^ids\[0\]: {size} is outside the vocabulary"):
        ours.decode([size])
    with pytest.raises(TokenizerError, match=r"^ids: a sequence of token ids, not str"):
        ours.decode("abc")
    assert ours.decode(torch.tensor(ids)) == ours.decode(ids) == ours.decode(tuple(ids))
    assert ours.id_to_piece(torch.tensor(ids[0])) == ours.id_to_piece(ids[0])


def test_cut_to_a_length_the_eos_stays_last(folder):
    ours = Tokenizer.load(folder)
    ids = ours.encode("Ein Mann fährt mit dem Fahrrad über die Brücke.")
    assert ours.encode("Ein Mann fährt mit dem Fahrrad über die Brücke.", 5) == [*ids[:4], 0]
    # 0 returned every id (ids[:-1] and the EOS); a negative limit is refused
    assert ours.encode("Ein Mann.", 0) == [] and ours.encode("Ein Mann.", 1) == [0]
    with pytest.raises(TokenizerError, match="max_tokens must be None or an integer >= 0"):
        ours.encode("Ein Mann.", -1)


def test_round_trips_through_bytes_and_files(folder, tmp_path):
    ours = Tokenizer.load(folder)
    data = ours.to_bytes()
    again = Tokenizer.from_bytes(data)  # what a checkpoint holds
    assert isinstance(again, MarianTokenizer) and again.to_bytes() == data  # reproducible
    again.save(tmp_path)
    third = Tokenizer.load(tmp_path)
    line = ">>fra<< Drei Kinder laufen am Strand."
    assert third.encode(line) == again.encode(line) == ours.encode(line)
    assert third.to_bytes() == data
    hf = transformers.MarianTokenizer.from_pretrained(tmp_path)  # what it saved: loadable
    assert hf(line).input_ids == ours.encode(line)


def test_broken_files_name_what_is_wrong(folder, tmp_path):
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(TokenizerError, match=r"vocab\.json: missing"):
        MarianTokenizer.from_files({k: v for k, v in files.items() if k != "vocab.json"})
    with pytest.raises(TokenizerError, match=r"source\.spm: not a valid SentencePiece"):
        MarianTokenizer.from_files({**files, "source.spm": b"junk"})
    with pytest.raises(TokenizerError, match=r"vocab\.json: pieces .* share id 0"):
        MarianTokenizer.from_files({**files, "vocab.json": b'{"</s>": 0, "<unk>": 0}'})
    with pytest.raises(TokenizerError, match=r"vocab\.json: has no pad token"):
        MarianTokenizer.from_files({**files, "vocab.json": b'{"</s>": 0, "<unk>": 1}'})
    moved = {"</s>": 0, "<unk>": 1, "a": 2, "<pad>": 3}  # pad 3 on this side, 2 on the other
    with pytest.raises(TokenizerError, match=r"^target_vocab\.json: '<pad>' is id 3 here but"):
        MarianTokenizer.from_files(
            {**files, "tokenizer_config.json": b'{"separate_vocabs": true}',
             "vocab.json": b'{"</s>": 0, "<unk>": 1, "<pad>": 2}',
             "target_vocab.json": json.dumps(moved).encode()}
        )  # fmt: skip
    with pytest.raises(TokenizerError, match="not a valid Marian tokenizer"):
        Tokenizer.from_bytes(Tokenizer.load(folder).to_bytes()[:100])
