"""Gaps that a mutation run of aiayn.data.corpus found."""

from __future__ import annotations

import gzip
import os
import threading

import pytest

from aiayn.data.corpus import (
    PairCounts,
    clean_pair,
    cr_note,
    decode_bytes,
    decode_lines,
    keep_pair,
    normalize,
    read_lines,
)
from aiayn.errors import CorpusError


def test_normalize_is_nfc_not_nfkc():
    """Compatibility characters (a ligature, full-width letters, a superscript) are text
    the tokenizer sees as written: NFC composes, it does not fold them."""
    assert normalize("\ufb01ne \uff21 x\u00b2") == "\ufb01ne \uff21 x\u00b2"
    assert normalize("Mu\u0308ller") == "Müller"


def test_a_pipe_read_whole_keeps_its_byte_order_mark_when_asked(tmp_path):
    pipe = tmp_path / "ref.en"
    os.mkfifo(pipe)
    for keep, first in [(True, "\ufeffa"), (False, "a")]:
        writer = threading.Thread(target=pipe.write_bytes, args=(b"\xef\xbb\xbfa\nb\n",))
        writer.start()
        assert read_lines(pipe, keep_bom=keep) == [first, "b"]
        writer.join(timeout=30)
        assert not writer.is_alive()


def test_a_side_of_exactly_the_word_limit_is_kept_and_either_side_counts():
    assert keep_pair("a b c", "x y z", 3) == ""
    assert keep_pair("a b c d", "x", 3) == "long"
    assert keep_pair("a", "w x y z", 3) == "long"  # the target side counts too
    assert keep_pair("a", "", 3) == "empty"


def test_only_a_carriage_return_is_cut_from_a_lines_end(tmp_path):
    path = tmp_path / "a.de"
    path.write_bytes(b"a \t\r\nb\n")
    assert read_lines(path) == ["a \t", "b"]


def test_the_carriage_return_note_is_given_only_when_some_line_holds_one():
    assert cr_note(0) == ""
    assert cr_note(2) == "; 2 line(s) hold a carriage return (CR alone ends no line: use LF)"


def test_a_gzip_file_cut_short_names_the_line_it_could_not_read(tmp_path):
    lines = b"".join(b"Zeile %d.\n" % i for i in range(20000))
    path = tmp_path / "cut.de.gz"
    path.write_bytes(gzip.compress(lines, mtime=0)[:-8])  # no CRC and size: the end is missing
    with pytest.raises(CorpusError, match=r"cut\.de\.gz, line 20001: cannot read"):
        read_lines(path)


def test_bytes_read_whole_keep_a_last_line_without_newline_and_plain_text_with_0x1f():
    assert decode_lines(b"a\nb", "<stdin>") == ["a", "b"]
    assert decode_lines(b"a\n\n", "<stdin>") == ["a", ""]
    assert decode_bytes(b"\x1fa\n", "<stdin>") == ["\x1fa"]  # one magic byte is no gzip


def test_gzip_cut_short_on_stdin_is_a_corpus_error():
    with pytest.raises(CorpusError, match="<stdin>: bad gzip data"):
        decode_bytes(gzip.compress(b"Ein Hund.\n" * 100)[:-8], "<stdin>")


def test_a_carriage_return_on_either_side_is_counted():
    counts = PairCounts()
    clean_pair("a", "b\rc", None, counts)
    clean_pair("a\rb", "c", None, counts)
    assert counts.with_cr == 2


@pytest.mark.parametrize("keep_bom", [False, True])
def test_a_file_of_a_byte_order_mark_alone_reads_as_a_pipe_does(tmp_path, keep_bom):
    """Notepad saves an empty UTF-8 file as its BOM alone: read from the file it was one
    empty line, through a pipe none (translate wrote a line or not, prepare called two
    empty sides of different lengths)."""
    from aiayn.data.corpus import iter_lines

    for raw in (b"\xef\xbb\xbf", b"\xef\xbb\xbf\n", b"\xef\xbb\xbfa", b""):
        path = tmp_path / "text"
        path.write_bytes(raw)
        expected = decode_lines(raw, "text", keep_bom)
        assert list(iter_lines(path, keep_bom)) == expected, raw
        assert read_lines(path, keep_bom=keep_bom) == expected, raw
    assert decode_lines(b"\xef\xbb\xbf", "text") == []
