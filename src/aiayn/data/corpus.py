"""Reading and validating parallel text: one sentence per line, plain or gzip, UTF-8."""

from __future__ import annotations

import gzip
import re
import stat
import unicodedata
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from aiayn.errors import CorpusError

BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, as Windows editors start a file with
_SPACES = re.compile(r"\s+")  # \s covers tabs and the no-break spaces U+00A0, U+202F, U+2007


def normalize(text: str) -> str:
    """NFC, every run of whitespace (no-break spaces included) as one space, stripped."""
    return _SPACES.sub(" ", unicodedata.normalize("NFC", text)).strip()


def read_lines(path: str | Path, keep_bom: bool = False) -> list[str]:
    """All lines of ``path`` without their newline; gzip is recognised by its magic bytes;
    a byte order mark that starts the file is dropped unless ``keep_bom`` (as sacreBLEU
    reads a reference: see :func:`iter_lines`). A pipe (``<(command)`` in a shell, a
    FIFO) is read too: this reads a file once, whole.

    Raises CorpusError for a path that is not a readable regular file or pipe, bad gzip
    data, or invalid UTF-8 (with the line).
    """
    path = Path(path)
    if check_readable_file(path, pipe=True):
        try:
            with path.open("rb") as f:
                data = f.read()
        except OSError as e:
            raise CorpusError(f"{path}: cannot read ({e.strerror or e})") from None
        return decode_bytes(data, str(path), keep_bom)
    return list(iter_lines(path, keep_bom))


def check_readable_file(path: Path, pipe: bool = False) -> bool:
    """CorpusError unless ``path`` is a regular file (or a link to one), or with ``pipe``
    a pipe, saying what it is instead: missing, a directory, or another kind (a device such
    as /dev/null, or a pipe where the file is read more than once: it would read as
    nothing, or never end). Returns whether it is a pipe."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise CorpusError(f"{path}: no such file") from None
    except OSError as e:
        raise CorpusError(f"{path}: cannot read ({e.strerror or e})") from None
    if stat.S_ISDIR(mode):
        raise CorpusError(f"{path}: is a directory, not a text file")
    if stat.S_ISFIFO(mode) and not pipe:
        raise CorpusError(f"{path}: a pipe, which can be read only once: give a file")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise CorpusError(f"{path}: not a regular file")
    return stat.S_ISFIFO(mode)


def cr_note(lines: int, before: str = "; ") -> str:
    """ "" or, for ``lines`` > 0 that hold a carriage return inside them, ``before`` and a
    note saying why that matters (a file of the CR line ends of old Macs is one line)."""
    if not lines:
        return ""
    return f"{before}{lines} line(s) hold a carriage return (CR alone ends no line: use LF)"


def decode_line(line: bytes, name: str, number: int) -> str:
    """One line's bytes (no newline) as text, without a trailing CR.

    Raises CorpusError naming ``name`` (a path, or "<stdin>") and line ``number`` (from 1)
    at an invalid byte: input is never decoded with replacement characters behind the
    user's back. A NUL byte in the first line is refused too: valid UTF-8, but a UTF-16
    file (or a binary one) has one there, while a NUL later is the stray control character
    of a crawled corpus (the unknown token, as in other tools, not a refusal of the corpus).
    """
    if number == 1 and 0 in line:  # one memchr (b"\0" in line took 7 times as long)
        raise CorpusError(
            f"{name}, line {number}: a NUL byte at column {line.index(0) + 1}: not UTF-8 "
            f"text{_hint(line, _UTF16)}"
        )
    try:
        return line.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError as e:
        bom = line.startswith((b"\xff\xfe", b"\xfe\xff"))  # UTF-16's byte order marks
        raise CorpusError(
            f"{name}, line {number}: invalid UTF-8 (byte {line[e.start]:#04x} at column "
            f"{e.start + 1}){_hint(line, _UTF16 if bom else '') if number == 1 else ''}"
        ) from None


# What a NUL byte, or a UTF-16 byte order mark, in a text file most often means.
_UTF16 = " (a UTF-16 file, as some Windows editors save text? save it as UTF-8)"
# The magic bytes of compressed files other than gzip (which is read).
_PACKED = {
    b"BZh": "a bzip2",
    b"\x28\xb5\x2f\xfd": "a zstd",
    b"\xfd7zXZ\0": "an xz",
    b"PK\3\4": "a zip",
}


def _hint(first: bytes, otherwise: str) -> str:
    """What a first line that is not UTF-8 text most likely is: a compressed file, else
    ``otherwise``."""
    packed = next((kind for magic, kind in _PACKED.items() if first.startswith(magic)), None)
    return (
        f" ({packed} file? decompress it: text is read plain or gzipped)" if packed else otherwise
    )


def decode_lines(raw: bytes, name: str, keep_bom: bool = False) -> list[str]:
    """Split ``raw`` into lines (no newline, no trailing CR, no byte order mark unless
    ``keep_bom``) and decode them as UTF-8 (:func:`decode_line`'s errors)."""
    lines = (raw if keep_bom else raw.removeprefix(BOM)).split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline ends the last line, it does not start a new one
    return [decode_line(line, name, number) for number, line in enumerate(lines, start=1)]


def decode_bytes(raw: bytes, name: str, keep_bom: bool = False) -> list[str]:
    """The lines of a whole file's bytes ``raw`` (gzip recognised by its magic bytes), as
    :func:`decode_lines` makes them; CorpusError naming ``name`` for bad gzip data."""
    if raw.startswith(b"\x1f\x8b"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise CorpusError(f"{name}: bad gzip data ({e})") from None
    return decode_lines(raw, name, keep_bom)


def iter_lines(path: str | Path, keep_bom: bool = False) -> Iterator[str]:
    """The lines of ``path`` one at a time, as :func:`read_lines` gives them, in constant
    memory: plain or gzip (recognised by its magic bytes), UTF-8 checked line by line; a
    byte order mark that starts the file is dropped (it is no text: it would stay in the
    first sentence as U+FEFF), unless ``keep_bom``: sacreBLEU keeps it in a reference, and
    a score equal to sacreBLEU's on the same file must too.

    Raises CorpusError for a path that is not a regular file (:func:`check_readable_file`),
    or naming the line where gzip data is bad (truncated, a bad checksum, a corrupt
    compressed body) or a byte is not UTF-8.
    """
    path = Path(path)
    check_readable_file(path)
    number = 0
    try:
        with path.open("rb") as raw:
            packed = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            f = gzip.GzipFile(fileobj=raw) if packed else raw
            for number, line in enumerate(f, start=1):
                if number == 1 and not keep_bom:
                    line = line.removeprefix(BOM)
                    if not line:  # a BOM alone is an empty file (Notepad's), not a line
                        return
                yield decode_line(line[:-1] if line.endswith(b"\n") else line, str(path), number)
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        where = f", line {number + 1}" if number else ""
        raise CorpusError(f"{path}{where}: cannot read ({e})") from None


def keep_pair(src: str, tgt: str, max_len_words: int | None) -> str:
    """Why a normalised pair is dropped ("empty", "long") or "" to keep it: an empty side,
    or (if ``max_len_words``) a side of more whitespace-separated words."""
    if not src or not tgt:
        return "empty"
    if max_len_words and max(src.count(" "), tgt.count(" ")) + 1 > max_len_words:
        return "long"
    return ""


@dataclass
class ParallelCorpus:
    """Aligned, normalised sentence pairs and what was dropped on the way."""

    src: list[str]
    tgt: list[str]
    src_path: str
    tgt_path: str
    dropped_empty: int = 0
    dropped_long: int = 0

    def __len__(self) -> int:
        return len(self.src)

    def summary(self) -> str:
        return (
            f"{len(self)} pairs from {self.src_path} / {self.tgt_path} ({self.dropped_empty} "
            f"empty, {self.dropped_long} longer than the limit, dropped)"
        )


def read_parallel(
    src_path: str | Path, tgt_path: str | Path, max_len_words: int | None = None
) -> ParallelCorpus:
    """Read two aligned files; drop pairs with an empty side or (if ``max_len_words``) a side
    of more whitespace-separated words. Raises CorpusError when the line counts differ or
    nothing is left."""
    counts = PairCounts()
    pairs = list(iter_parallel(src_path, tgt_path, max_len_words, counts))
    return ParallelCorpus(
        [s for s, _ in pairs],
        [t for _, t in pairs],
        str(src_path),
        str(tgt_path),
        counts.dropped_empty,
        counts.dropped_long,
    )


@dataclass
class PairCounts:
    """Line pairs read, kept and dropped (and why), as :func:`clean_pair` counts them."""

    lines: int = 0
    kept: int = 0
    dropped_empty: int = 0
    dropped_long: int = 0
    with_cr: int = 0  # pairs with a carriage return inside a line: a file of CR line ends?

    def __iadd__(self, other: PairCounts) -> PairCounts:
        self.lines += other.lines
        self.kept += other.kept
        self.dropped_empty += other.dropped_empty
        self.dropped_long += other.dropped_long
        self.with_cr += other.with_cr
        return self

    def check(self, src_path: str | Path, tgt_path: str | Path) -> None:
        """CorpusError when there were no lines, or no usable pairs among them."""
        if not self.lines:
            raise CorpusError(f"{src_path} and {tgt_path}: empty corpus")
        if not self.kept:
            raise CorpusError(
                f"{src_path} and {tgt_path}: no usable pairs ({self.dropped_empty} empty, "
                f"{self.dropped_long} too long){cr_note(self.with_cr)}"
            )


def clean_pair(
    src: str, tgt: str, max_len_words: int | None, counts: PairCounts
) -> tuple[str, str] | None:
    """The pair normalised, or None when :func:`keep_pair` drops it; counted in ``counts``."""
    counts.lines += 1
    counts.with_cr += "\r" in src or "\r" in tgt
    src, tgt = normalize(src), normalize(tgt)
    why = keep_pair(src, tgt, max_len_words)
    if why == "empty":
        counts.dropped_empty += 1
    elif why == "long":
        counts.dropped_long += 1
    else:
        counts.kept += 1
        return src, tgt
    return None


def iter_line_pairs(src_path: str | Path, tgt_path: str | Path) -> Iterator[tuple[str, str]]:
    """Line i of each file, as read (:func:`iter_lines`), one pair at a time.

    Raises CorpusError naming both files, their line counts, and the line where one file
    ends before the other.
    """
    src_lines, tgt_lines = iter_lines(src_path), iter_lines(tgt_path)
    for n, (s, t) in enumerate(zip_longest(src_lines, tgt_lines)):  # n lines before these
        if s is None or t is None:
            rest = 1 + sum(1 for _ in (tgt_lines if s is None else src_lines))
            n_src, n_tgt = (n, n + rest) if s is None else (n + rest, n)
            raise CorpusError(
                f"line counts differ: {src_path} has {n_src} lines, {tgt_path} has {n_tgt}; "
                f"{src_path if s is None else tgt_path} "
                + (f"ends after line {n}" if n else "is empty")
                + ": line i of one must translate line i of the other"
            )
        yield s, t


def iter_parallel(
    src_path: str | Path,
    tgt_path: str | Path,
    max_len_words: int | None = None,
    counts: PairCounts | None = None,
) -> Iterator[tuple[str, str]]:
    """The pairs :func:`read_parallel` keeps, normalised, one at a time in constant memory;
    ``counts`` (updated as it goes) gets the dropped ones. Raises CorpusError as
    :func:`iter_line_pairs` and :meth:`PairCounts.check` do."""
    counts = counts if counts is not None else PairCounts()
    for s, t in iter_line_pairs(src_path, tgt_path):
        pair = clean_pair(s, t, max_len_words, counts)
        if pair is not None:
            yield pair
    counts.check(src_path, tgt_path)
