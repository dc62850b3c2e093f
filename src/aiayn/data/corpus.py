"""Reading and validating parallel text: one sentence per line, plain or gzip, UTF-8."""

from __future__ import annotations

import gzip
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from aiayn.errors import CorpusError

_SPACES = re.compile(r"\s+")  # \s covers tabs and the no-break spaces U+00A0, U+202F, U+2007


def normalize(text: str) -> str:
    """NFC, every run of whitespace (no-break spaces included) as one space, stripped."""
    return _SPACES.sub(" ", unicodedata.normalize("NFC", text)).strip()


def read_lines(path: str | Path) -> list[str]:
    """All lines of ``path`` without their newline; gzip is recognised by its magic bytes.

    Raises CorpusError for a missing file, bad gzip data, or invalid UTF-8 (with the line).
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    try:
        with path.open("rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as e:
        raise CorpusError(f"{path}: cannot read ({e})") from None
    return decode_lines(raw, str(path))


def decode_lines(raw: bytes, name: str) -> list[str]:
    """Split ``raw`` into lines (no newline, no trailing CR) and decode them as UTF-8.

    Raises CorpusError naming ``name`` (a path, or "<stdin>") and the line of the first
    invalid byte: input is never decoded with replacement characters behind the user's back.
    """
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline ends the last line, it does not start a new one
    out = []
    for number, line in enumerate(lines, start=1):
        try:
            out.append(line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as e:
            raise CorpusError(
                f"{name}, line {number}: invalid UTF-8 (byte {line[e.start]:#04x} at column "
                f"{e.start + 1})"
            ) from None
    return out


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
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise CorpusError(
            f"line counts differ: {src_path} has {len(src_lines)} lines, {tgt_path} has "
            f"{len(tgt_lines)}; line i of one must translate line i of the other"
        )
    if not src_lines:
        raise CorpusError(f"{src_path} and {tgt_path}: empty corpus")
    corpus = ParallelCorpus([], [], str(src_path), str(tgt_path))
    for s, t in zip(src_lines, tgt_lines):
        s, t = normalize(s), normalize(t)
        if not s or not t:
            corpus.dropped_empty += 1
        elif max_len_words and max(s.count(" "), t.count(" ")) + 1 > max_len_words:
            corpus.dropped_long += 1
        else:
            corpus.src.append(s)
            corpus.tgt.append(t)
    if not corpus.src:
        raise CorpusError(
            f"{src_path} and {tgt_path}: no usable pairs ({corpus.dropped_empty} empty, "
            f"{corpus.dropped_long} too long)"
        )
    return corpus
