"""Reading and validating parallel text, SentencePiece, and token-budget batching."""

from __future__ import annotations

import gzip
import os
import threading

import numpy as np
import pytest
import torch

from aiayn.config import UNK_ID
from aiayn.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    CorpusError,
    ParallelDataset,
    Tokenizer,
    collate,
    decode_lines,
    normalize,
    read_lines,
    read_parallel,
    token_batches,
)
from aiayn.data.corpus import iter_lines
from aiayn.errors import TokenizerError
from cli_util import one_line_error
from conftest import small_corpus
from sample_data import PAIRS

pytestmark = pytest.mark.multi30k  # reads Multi30k where it is; CI runs it again without


def write(path, text: str | bytes, gz: bool = False):
    data = text.encode("utf-8") if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


# -- corpus ---------------------------------------------------------------------------------
def test_plain_and_gzip_read_the_same_lines(tmp_path):
    text = "Ein Hund.\nZwei Katzen.\r\n\nDrei.\n"
    plain = read_lines(write(tmp_path / "a.de", text))
    packed = read_lines(write(tmp_path / "a.de.gz", text, gz=True))
    assert plain == packed == ["Ein Hund.", "Zwei Katzen.", "", "Drei."]


def test_a_byte_order_mark_at_the_start_is_not_text(tmp_path):
    """A UTF-8 BOM (as Windows editors write one) stayed in the first sentence as U+FEFF:
    in a validation reference it cost BLEU. It is dropped there only."""
    text = "\ufeffEin Hund.\r\n\ufeffZwei.\n"
    lines = ["Ein Hund.", "\ufeffZwei."]
    assert read_lines(write(tmp_path / "a.de", text)) == lines
    assert read_lines(write(tmp_path / "a.de.gz", text, gz=True)) == lines
    assert decode_lines(text.encode(), "<stdin>") == lines


def test_normalize_folds_no_break_and_stray_spaces():
    assert normalize("  Ein\u00a0Mann \t fährt\u202fRad.  ") == "Ein Mann fährt Rad."
    assert normalize("Mu\u0308ller") == "Müller"  # NFC: u + combining diaeresis -> ü


def test_missing_file_is_named(tmp_path):
    with pytest.raises(CorpusError, match=r"nope\.de: no such file"):
        read_parallel(tmp_path / "nope.de", write(tmp_path / "b.en", "x\n"))


def test_unequal_line_counts_name_both_files_and_counts(tmp_path):
    src = write(tmp_path / "a.de", "eins\nzwei\ndrei\n")
    tgt = write(tmp_path / "a.en", "one\ntwo\n")
    with pytest.raises(CorpusError) as e:
        read_parallel(src, tgt)
    message = str(e.value)
    assert "a.de has 3 lines" in message and "a.en has 2" in message


def test_invalid_utf8_names_file_and_line(tmp_path):
    src = write(tmp_path / "a.de.gz", b"gut\nauch gut\nkaputt \xff\xfe hier\n", gz=True)
    tgt = write(tmp_path / "a.en", "good\nalso good\nbroken here\n")
    with pytest.raises(CorpusError, match=r"a\.de\.gz, line 3: invalid UTF-8 \(byte 0xff"):
        read_parallel(src, tgt)


def test_empty_corpus_and_corrupt_gzip_are_errors(tmp_path):
    with pytest.raises(CorpusError, match="empty corpus"):
        read_parallel(write(tmp_path / "e.de", ""), write(tmp_path / "e.en", ""))
    blank = write(tmp_path / "b.de", "\n \n"), write(tmp_path / "b.en", "x\ny\n")
    with pytest.raises(CorpusError, match="no usable pairs"):
        read_parallel(*blank)
    bad = write(tmp_path / "c.de.gz", b"\x1f\x8b" + b"not really gzip")
    with pytest.raises(CorpusError, match=r"c\.de\.gz: cannot read"):
        read_lines(bad)


def test_corrupt_gzip_body_is_named_like_a_truncated_one(tmp_path):
    """A valid gzip header before a body zlib cannot inflate ("invalid block type") is a
    CorpusError naming the file, as truncated data and a bad checksum are, not zlib.error."""
    header = gzip.compress(b"Ein Hund.\n")[:10]
    bad = write(tmp_path / "body.de.gz", header + b"\xff" * 40)
    with pytest.raises(CorpusError, match=r"body\.de\.gz: cannot read \(.*invalid block type"):
        read_lines(bad)
    lines = b"".join(b"Zeile %d.\n" % i for i in range(20000))
    packed = bytearray(gzip.compress(lines, mtime=0))
    packed[len(packed) // 2 :] = b"\xff" * (len(packed) - len(packed) // 2)
    with pytest.raises(CorpusError, match=r"mid\.de\.gz, line \d+: cannot read"):
        read_lines(write(tmp_path / "mid.de.gz", bytes(packed)))


def test_a_directory_or_a_pipe_is_not_called_missing(tmp_path):
    folder = tmp_path / "folder.de"
    folder.mkdir()
    with pytest.raises(CorpusError, match=r"folder\.de: is a directory"):
        read_lines(folder)
    with pytest.raises(CorpusError, match=r"/dev/null: not a regular file"):
        read_lines("/dev/null")  # a device: it would read as nothing
    pipe = tmp_path / "pipe.de"
    os.mkfifo(pipe)  # a streaming reader refuses it before opening it (no writer here)
    with pytest.raises(CorpusError, match=r"pipe\.de: a pipe, which can be read only once"):
        next(iter_lines(pipe))
    writer = threading.Thread(target=pipe.write_bytes, args=(gzip.compress(b"\xef\xbb\xbfa\nb\n"),))
    writer.start()  # read whole, once: gzip and the byte order mark as in a file
    assert read_lines(pipe) == ["a", "b"]
    writer.join(timeout=30)
    assert not writer.is_alive()
    with pytest.raises(CorpusError, match=r"nope\.de: no such file"):
        read_lines(tmp_path / "nope.de")


def test_empty_and_long_pairs_are_dropped_and_counted(tmp_path):
    src = write(tmp_path / "a.de", "eins\n\nzwei drei vier fünf\nsechs\n")
    tgt = write(tmp_path / "a.en", "one\nlost\ntwo three four five\n   \n")
    corpus = read_parallel(src, tgt, max_len_words=3)
    assert (corpus.src, corpus.tgt) == (["eins"], ["one"])
    assert (corpus.dropped_empty, corpus.dropped_long) == (2, 1)
    assert "2 empty, 1 longer" in corpus.summary()


# -- tokenizer ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    directory = tmp_path_factory.mktemp("spm")
    paths = small_corpus(directory)
    corpus = read_parallel(paths["train.de"], paths["train.en"])
    return Tokenizer.train(corpus.src + corpus.tgt, directory / "spm", vocab_size=600)


def test_tokenizer_special_ids_match_the_model_defaults(tokenizer):
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (PAD_ID, BOS_ID, EOS_ID)
    assert [tokenizer.id_to_piece(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert 100 < tokenizer.vocab_size <= 600


def test_tokenizer_round_trips_text_and_stops_at_eos(tokenizer):
    for de, en in PAIRS[:10]:
        for text in (de, en):
            ids = tokenizer.encode(text)
            assert all(i > EOS_ID for i in ids)  # no specials from plain text
            assert tokenizer.decode(ids) == text  # detokenized, not "▁A ▁man"
    ids = tokenizer.encode("Ein Hund.")
    assert tokenizer.decode([BOS_ID, *ids, EOS_ID, *tokenizer.encode("Müll"), PAD_ID]) == (
        "Ein Hund."
    )
    assert tokenizer.encode("Ein Hund.", 2) == ids[:2] and tokenizer.encode("Ein Hund.", 0) == []
    assert tokenizer.encode("Ein Hund.", np.int64(2)) == ids[:2]  # as slicing took it
    # A list of 0-d tensors (iterating a tensor) was SentencePiece's TypeError.
    assert tokenizer.decode(list(torch.tensor(ids))) == "Ein Hund."
    for bad in (-1, 1.5, True):  # -1 dropped the last token without a word
        with pytest.raises(TokenizerError, match="max_tokens must be None or an integer >= 0"):
            tokenizer.encode("Ein Hund.", bad)


def test_tokenizer_survives_bytes_and_rejects_garbage(tokenizer, tmp_path):
    again = Tokenizer.from_bytes(tokenizer.to_bytes())
    assert again.encode("Zwei Hunde spielen.") == tokenizer.encode("Zwei Hunde spielen.")
    with pytest.raises(ValueError, match="not a valid SentencePiece model"):
        Tokenizer.from_bytes(b"definitely not a model")
    with pytest.raises(TokenizerError, match=r"missing\.model: no such SentencePiece model"):
        Tokenizer.load(tmp_path / "missing.model")


def test_a_tokenizer_it_may_not_read_is_named(tokenizer, tmp_path, monkeypatch, capsys):
    """An spm.model without read permission was an OSError: `prepare --spm-model` blamed
    its output ("cannot write the prepared data (Permission denied)"). Root reads any file:
    the refusal is simulated."""
    from pathlib import Path

    path = tmp_path / "spm.model"
    path.write_bytes(tokenizer.to_bytes())
    read = Path.read_bytes

    def refuse(self):
        if self == path:
            raise PermissionError(13, "Permission denied")
        return read(self)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(TokenizerError, match=r"spm\.model: cannot read \(Permission denied\)$"):
        Tokenizer.load(path)
    src, tgt = tmp_path / "a.de", tmp_path / "a.en"
    src.write_text("ein Hund\n")
    tgt.write_text("a dog\n")
    files = ["--train-src", str(src), "--train-tgt", str(tgt), "--valid-src", str(src)]
    argv = ["prepare", *files, "--valid-tgt", str(tgt), "--out", str(tmp_path / "out")]
    err = one_line_error([*argv, "--spm-model", str(path), "--no-progress"], capsys)
    assert f"{path}: cannot read (Permission denied)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.de", "a.en", "spm.model"]


def test_tokenizer_training_keeps_lines_longer_than_sentencepieces_default(tmp_path):
    """SentencePiece leaves out lines over 4192 bytes without a word: a joint vocabulary
    of paragraph-long German lines beside short English ones learned no German (and only
    long lines failed inside SentencePiece)."""
    german = " ".join(f"Größe{i} Übermäßig{i}" for i in range(300))  # > 4192 bytes
    assert len(german.encode()) > 4192
    english = [f"a short line {i}" for i in range(20)]
    tokenizer = Tokenizer.train([german, *english], tmp_path / "joint", vocab_size=200)
    assert UNK_ID not in tokenizer.encode("Größe Übermäßig")
    alone = Tokenizer.train([german], tmp_path / "alone", vocab_size=120)
    assert UNK_ID not in alone.encode("Größe Übermäßig")


# -- batching -------------------------------------------------------------------------------
def test_collate_is_teacher_forcing():
    batch = collate([[5, 6, 7], [8]], [[10, 11], [12, 13, 14]])
    assert batch.src.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.tgt_in.tolist() == [[1, 10, 11, 0], [1, 12, 13, 14]]  # BOS + target
    assert batch.tgt_out.tolist() == [[10, 11, 2, 0], [12, 13, 14, 2]]  # target + EOS
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (4, 7)


def test_token_batches_respect_the_budget_and_cover_every_pair_once():
    g = torch.Generator().manual_seed(0)
    src_lens = torch.randint(1, 40, (2000,), generator=g).tolist()
    tgt_lens = torch.randint(1, 40, (2000,), generator=g).tolist()
    batches = token_batches(src_lens, tgt_lens, max_tokens=500, seed=3, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(2000))
    padded = real = 0
    for b in batches:
        longest = max(max(src_lens[i] for i in b), max(tgt_lens[i] + 1 for i in b))
        assert len(b) * longest <= 500
        padded += len(b) * max(tgt_lens[i] + 1 for i in b)
        real += sum(tgt_lens[i] + 1 for i in b)
    assert real / padded > 0.9  # bucketing by length: little of a batch is padding


def test_token_batches_are_seeded_and_reshuffled_every_epoch():
    lens = [5 + (i * 7) % 30 for i in range(500)]
    a = token_batches(lens, lens, 300, seed=1, epoch=0)
    assert a == token_batches(lens, lens, 300, seed=1, epoch=0)
    assert a != token_batches(lens, lens, 300, seed=1, epoch=1)
    assert a != token_batches(lens, lens, 300, seed=2, epoch=0)


def test_a_pair_over_the_budget_gets_a_batch_of_its_own():
    batches = token_batches([3, 100, 4], [3, 2, 4], max_tokens=50, seed=0, epoch=0)
    assert [1] in batches and sorted(i for b in batches for i in b) == [0, 1, 2]


def test_dataset_drops_pairs_past_max_positions(tokenizer):
    src = ["Ein Hund.", " ".join(["Hund"] * 60)]
    tgt = ["A dog.", "A dog."]
    data = ParallelDataset.from_texts(tokenizer, src, tgt, max_positions=20)
    assert (len(data), data.dropped_long) == (1, 1)
    (batch,) = list(data.batches(1000))
    assert batch.tgt_in[0, 0].item() == BOS_ID and EOS_ID in batch.tgt_out[0].tolist()


def test_tokenizer_flags_beside_a_given_tokenizer_are_said_to_be_unused(
    tokenizer, tmp_path, capsys
):
    """`prepare --spm-model X --vocab-size 500` used X's vocabulary as it is and dropped
    the size (and the sample, type and seed) without a word."""
    from aiayn.cli import main

    path = tmp_path / "spm.model"
    path.write_bytes(tokenizer.to_bytes())
    src, tgt = tmp_path / "a.de", tmp_path / "a.en"
    src.write_text("ein Hund\n")
    tgt.write_text("a dog\n")
    files = ["--train-src", str(src), "--train-tgt", str(tgt), "--valid-src", str(src)]
    argv = ["prepare", *files, "--valid-tgt", str(tgt), "--spm-model", str(path)]
    assert main([*argv, "--out", str(tmp_path / "a"), "--vocab-size", "500", "--seed", "3"]) == 0
    err = capsys.readouterr().err
    assert "note: --vocab-size, --seed: for training a tokenizer; --spm-model's is used" in err
    assert main([*argv, "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    assert "note:" not in capsys.readouterr().err  # the defaults: nothing was asked
