"""Gaps a mutation run found in data/tokenizer.py: what training makes, where a tokenizer
is loaded from, and the errors that name the bad argument or item."""

from __future__ import annotations

import array

import pytest
import sentencepiece as spm
import torch
from sentencepiece import sentencepiece_model_pb2

from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import TokenizerError
from sample_data import PAIRS

TEXTS = [s for p in PAIRS for s in p]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return Tokenizer.train(TEXTS, tmp_path_factory.mktemp("spm") / "t", 60, num_threads=1)


def test_training_makes_a_quiet_bpe_model_of_every_character(tmp_path, capfd):
    """BPE by default, every character of the corpus in the vocabulary (one seen once
    round-trips, not <unk>), ``vocab_size`` a ceiling a tiny corpus may stay under, and
    nothing written to the terminal."""
    tok = Tokenizer.train([*TEXTS, "Ein Hund auf der Øresundbrücke."], tmp_path / "t", 5000)
    assert capfd.readouterr() == ("", "")
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tok.to_bytes())
    assert proto.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.BPE
    assert 100 < tok.vocab_size < 5000
    assert tok.unk_id not in tok.encode("Øresund") and tok.decode(tok.encode("Ø")) == "Ø"


def test_training_writes_into_new_folders_and_refuses_no_text(tmp_path):
    """``<model_prefix>.model`` is written, folders made as needed; a corpus of blank lines
    is one clear error."""
    Tokenizer.train(TEXTS, tmp_path / "new" / "deeper" / "spm", 60, num_threads=1)
    assert (tmp_path / "new" / "deeper" / "spm.model").is_file()
    with pytest.raises(TokenizerError, match=r"^tokenizer: no text to train on$"):
        Tokenizer.train(["", "  \n"], tmp_path / "none", 60)


def test_a_model_of_other_special_ids_is_refused(tmp_path):
    """A SentencePiece model trained elsewhere (its own pad, BOS, EOS and unk ids) is not
    one whose ids the model's config takes: the error says which ids it has."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXTS), model_prefix=str(tmp_path / "other"), vocab_size=60,
        minloglevel=2,
    )  # fmt: skip
    with pytest.raises(TokenizerError, match=r"special ids .* are \(-1, 1, 2, 0\), expected"):
        Tokenizer.load(tmp_path / "other.model")


def test_a_directory_loads_its_spm_model_and_a_bad_file_is_named(tokenizer, tmp_path):
    """A model directory gives the tokenizer saved in it (spm.model); a file that is no
    SentencePiece model is refused naming it."""
    tokenizer.save(tmp_path)
    again = Tokenizer.load(tmp_path)
    assert again.to_bytes() == tokenizer.to_bytes()
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"\x08\x01not a model")
    with pytest.raises(TokenizerError) as e:
        Tokenizer.load(bad)
    assert str(e.value) == f"{bad}: not a valid SentencePiece model (corrupt or truncated)"


def test_encoding_names_the_text_it_cannot_take(tokenizer):
    """Text that is no str, or not valid Unicode (a lone surrogate), is a TokenizerError
    naming the argument (and the item of a batch) and the character."""
    cases = [
        (lambda: tokenizer.encode(b"bytes"), "text: a str, not bytes"),
        (lambda: tokenizer.encode("a\udc80b"), "text: not valid Unicode (character 1)"),
        (lambda: tokenizer.encode_batch("one text"), "texts: a list of str, not str"),
        (lambda: tokenizer.encode_batch(5), "texts: a list of str, not int"),
        (lambda: tokenizer.encode_batch(["ok", 3]), "texts[1]: a str, not int"),
        (
            lambda: tokenizer.encode_batch(["ok", "ab\udc80"]),
            "texts[1]: not valid Unicode (character 2)",
        ),
        (lambda: tokenizer.encode_target_batch(["ok", None]), "texts[1]: a str, not NoneType"),
    ]  # fmt: skip
    for call, message in cases:
        with pytest.raises(TokenizerError) as e:
            call()
        assert str(e.value) == message


def test_decoding_names_the_first_item_that_is_no_id(tokenizer):
    """decode (and id_to_piece) name the item that is no id of the vocabulary, an id out of
    range with the vocabulary's size, and a tensor or array of the wrong rank without
    pointing a 3-D one to decode_batch."""
    V = tokenizer.vocab_size
    cases = [
        (lambda: tokenizer.decode([5, V]), f"ids[1]: {V} is outside the vocabulary [0, {V})"),
        (lambda: tokenizer.decode([5, "x"]), "ids[1]: 'x' is not a token id (an int)"),
        (lambda: tokenizer.decode([5, [6, 7]]), "ids[1]: [6, 7] is not a token id (an int)"),
        (lambda: tokenizer.id_to_piece(V), f"id: {V} is outside the vocabulary [0, {V})"),
        (
            lambda: tokenizer.decode(torch.zeros(1, 1, 2, dtype=torch.long)),
            "ids: one sequence of token ids (1-D), got a 3-D Tensor",
        ),
        (
            lambda: tokenizer.decode(torch.tensor(5)),
            "ids: one sequence of token ids (1-D), got a 0-D Tensor",
        ),
    ]
    for call, message in cases:
        with pytest.raises(TokenizerError) as e:
            call()
        assert str(e.value) == message


def test_decode_takes_a_python_array_of_ids(tokenizer):
    """An ``array.array`` of ids (a sequence with tolist() but no ndim) is one sequence."""
    ids = tokenizer.encode("Ein Hund.")
    assert tokenizer.decode(array.array("l", ids)) == tokenizer.decode(ids) == "Ein Hund."
