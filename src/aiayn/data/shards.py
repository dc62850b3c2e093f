"""The prepared-data format: binary token files, a numpy index and a JSON manifest
(fairseq's indexed datasets, simpler).

A prepared directory holds, for each split (``train``, ``valid``):

- ``{split}.src.bin``, ``{split}.tgt.bin``: every sentence's token ids, back to back, no
  BOS/EOS, as ``uint16`` while the vocabulary fits (ids < 65536), else ``uint32``;
- ``{split}.src.idx.npy``, ``{split}.tgt.idx.npy``: int64 ``[N, 2]``, the (offset, length)
  of sentence i in its ``.bin`` file, in tokens;

and ``valid.src.txt`` / ``valid.tgt.txt`` (the normalised validation text, for BLEU),
the tokenizer (``spm.model``, or ``tokenizer.zip`` for a pretrained Marian model's; the
manifest's ``spm_model`` names it) and ``manifest.json`` (:data:`FORMAT`, the dtype,
vocabulary size, the tokenizer's sha256, counts and dropped pairs per split, and each
input's sha256 and size). Sources are encoded as the model takes them (with EOS where the
tokenizer appends one); batches are padded and shifted with the tokenizer's special ids.
Training reads it without loading the corpus: the index in memory, ids read per batch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from aiayn.config import BOS_ID, EOS_ID, PAD_ID
from aiayn.data.batching import Batch, plan_batches, special_ids
from aiayn.data.corpus import decode_lines
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import CorpusError

FORMAT = "aiayn-prepared-1"
MANIFEST = "manifest.json"
SPM_MODEL = "spm.model"
SIDES = ("src", "tgt")
TOKEN_DTYPES = ("uint16", "uint32")
INPUTS = ("train_src", "train_tgt", "valid_src", "valid_tgt")  # the text files, in the manifest
COUNTS = ("pairs", "src_tokens", "tgt_tokens", "lines", "dropped_empty", "dropped_long")
WHAT = {"train": "training", "valid": "validation"}
DAMAGED = "the prepared data is damaged, prepare it again"


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (vocab_size <= 65536), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def sha256_file(path: str | Path, block: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


class SplitWriter:
    """Appends encoded chunks of one split to its ``.bin`` files; :meth:`close` writes the
    index. Ids that do not fit the dtype are a bug, not data, and raise OverflowError."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype):
        self.directory, self.split, self.dtype = directory, split, np.dtype(dtype)
        self.files: dict[str, BinaryIO] = {
            side: (directory / f"{split}.{side}.bin").open("wb") for side in SIDES
        }
        self.lengths: dict[str, list[np.ndarray]] = {side: [] for side in SIDES}

    def write(self, side: str, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """``tokens``: the chunk's ids back to back; ``lengths``: one per sentence."""
        if tokens.size and int(tokens.max()) > np.iinfo(self.dtype).max:
            raise OverflowError(f"token id {int(tokens.max())} does not fit {self.dtype}")
        self.files[side].write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self.lengths[side].append(np.asarray(lengths, dtype=np.int64))

    def discard(self) -> None:
        """Close the token files after a failure (the directory is going to be removed)."""
        for f in self.files.values():
            f.close()

    def close(self) -> dict[str, int]:
        """Flush the token files and write the indexes; returns pairs and tokens per side."""
        counts: dict[str, int] = {}
        for side in SIDES:
            f = self.files[side]
            f.flush()
            os.fsync(f.fileno())  # on disk before the directory is renamed into place
            f.close()
            lengths = np.concatenate(self.lengths[side] or [np.zeros(0, np.int64)])
            offsets = np.cumsum(lengths) - lengths
            np.save(
                self.directory / f"{self.split}.{side}.idx.npy", np.stack([offsets, lengths], 1)
            )
            counts["pairs"], counts[f"{side}_tokens"] = len(lengths), int(lengths.sum())
        return counts


def _load_index(path: Path) -> np.ndarray:
    """The [N, 2] integer (offset, length) index in ``path``; CorpusError naming the file
    when it holds anything else (numpy's own text would blame pickled data)."""
    try:
        index = np.load(path, allow_pickle=False)
    except (ValueError, EOFError):
        index = None
    if index is None or index.ndim != 2 or index.shape[1] != 2 or index.dtype.kind not in "iu":
        raise CorpusError(
            f"{path}: not a valid index file (integer [N, 2]); the prepared data is damaged, "
            "prepare it again"
        )
    return index


def _checked_index(path: Path, tokens: Path, itemsize: int) -> tuple[np.ndarray, np.ndarray]:
    """The (offsets, lengths) of the index ``path``, as int64 and int32, once every row is
    known to address its own slice of ``tokens``: lengths >= 0 that fit int32 and sum to
    the file's size, offsets the running sum of the lengths before them (as
    :class:`SplitWriter` writes them). CorpusError naming the file and row otherwise: an
    offset out of place failed only at the first batch (os.pread's EINVAL) or silently
    read as padding, and a huge length wrapped to a negative size."""
    index = _load_index(path).astype(np.int64, copy=False)  # a uint64 past int64 turns < 0
    offsets, lengths = np.ascontiguousarray(index[:, 0]), index[:, 1]
    bad = (lengths < 0) | (lengths > np.iinfo(np.int32).max)
    if bad.any():
        row = int(bad.argmax())
        raise CorpusError(f"{path}: row {row} has length {int(lengths[row])}; {DAMAGED}")
    # Bounded lengths: neither the sum nor the running sums can overflow int64.
    size, expected = tokens.stat().st_size, int(lengths.sum()) * itemsize
    if size != expected:
        raise CorpusError(f"{tokens}: {size} bytes, the index says {expected}; {DAMAGED}")
    starts = np.cumsum(lengths) - lengths
    bad = offsets != starts
    if bad.any():
        row = int(bad.argmax())
        raise CorpusError(
            f"{path}: row {row} has offset {int(offsets[row])}, the lengths before it put it "
            f"at {int(starts[row])}; {DAMAGED}"
        )
    return offsets, lengths.astype(np.int32)


class PreparedSplit:
    """One split, read from disk when a batch needs it: memory holds the index (12 bytes per
    sentence and side), not the corpus.

    Ids are read with positioned reads (``os.pread``) rather than through a memory map: the
    pages of a mapping count in the process's resident memory once touched, and with the
    kernel's read-ahead a few hundred random batches would map most of the corpus.
    """

    def __init__(
        self,
        directory: Path,
        split: str,
        dtype: np.dtype,
        special: tuple[int, int, int] = (PAD_ID, BOS_ID, EOS_ID),
        vocab: tuple[int, int] | None = None,
    ):
        self.name, self.dtype = f"{directory}/{split}", dtype
        self.pad_id, self.bos_id, self.eos_id = special  # the tokenizer's
        self.vocab = vocab  # the (source, target) vocabulary sizes its ids must be below
        self.fds: dict[str, int] = {}
        self.offsets: dict[str, np.ndarray] = {}
        lengths: dict[str, np.ndarray] = {}
        for side in SIDES:
            path = directory / f"{split}.{side}.bin"
            self.offsets[side], lengths[side] = _checked_index(
                directory / f"{split}.{side}.idx.npy", path, dtype.itemsize
            )
            self.fds[side] = os.open(path, os.O_RDONLY)
        self.src_lens, self.tgt_lens = lengths["src"], lengths["tgt"]
        if len(self.src_lens) != len(self.tgt_lens):
            raise CorpusError(f"{self.name}: source and target indexes differ in length")

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

    def __del__(self) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.src_lens)

    def usable(self, max_positions: int | None) -> np.ndarray:
        """Indices of the pairs a model of ``max_positions`` can take (source length, and
        target + BOS/EOS, at most that), as ParallelDataset.from_texts keeps them."""
        if not max_positions:
            return np.arange(len(self))
        fits = (self.src_lens <= max_positions) & (self.tgt_lens + 1 <= max_positions)
        return np.flatnonzero(fits)

    def plan(
        self, max_tokens: int, seed: int, epoch: int, max_positions: int | None = None
    ) -> list[np.ndarray]:
        """One epoch's batches (indices into the split): the batches and order that
        ParallelDataset gives for the same pairs, seed and epoch."""
        keep = self.usable(max_positions)
        batches = plan_batches(self.src_lens[keep], self.tgt_lens[keep], max_tokens, seed, epoch)
        return [keep[b] for b in batches]

    def ids(self, side: str, i: int) -> np.ndarray:
        """Sentence ``i``'s ids on ``side`` ("src" or "tgt")."""
        size = self.dtype.itemsize
        n, start = int(self.lengths(side)[i]), int(self.offsets[side][i])
        return np.frombuffer(os.pread(self.fds[side], n * size, start * size), self.dtype)

    def lengths(self, side: str) -> np.ndarray:
        return self.src_lens if side == "src" else self.tgt_lens

    def batch(self, index: np.ndarray) -> Batch:
        """The :class:`Batch` of pairs ``index``: equal to ``collate`` of their id lists."""
        index = np.asarray(index)
        src_lens = self.src_lens[index].astype(np.int64)
        tgt_lens = self.tgt_lens[index].astype(np.int64)
        B = len(index)
        src = np.full((B, int(src_lens.max(initial=0))), self.pad_id, dtype=np.int64)
        tgt_in = np.full((B, int(tgt_lens.max(initial=0)) + 1), self.pad_id, dtype=np.int64)
        tgt_out = tgt_in.copy()
        tgt_in[:, 0] = self.bos_id  # teacher forcing (Section 3.1): BOS + y in, y + EOS out
        for row, i in enumerate(index.tolist()):
            s, t = self.ids("src", i), self.ids("tgt", i)
            src[row, : len(s)] = s
            tgt_in[row, 1 : len(t) + 1] = t
            tgt_out[row, : len(t)] = t
            tgt_out[row, len(t)] = self.eos_id
        # An id past the vocabulary (damage) named no file; a max a batch, not a scan.
        for side, ids, limit in zip(SIDES, (src, tgt_out), self.vocab or ()):
            if ids.max(initial=0) >= limit:
                row = next(i for i in index.tolist() if self.ids(side, i).max(initial=0) >= limit)
                raise CorpusError(
                    f"{self.name}.{side}.bin: sentence {row} (row {row} of its index) holds id "
                    f"{self.ids(side, row).max()}, outside the vocabulary [0, {limit}); {DAMAGED}"
                )
        return Batch(
            torch.from_numpy(src),
            torch.from_numpy(tgt_in),
            torch.from_numpy(tgt_out),
            int(src_lens.sum()),
            int(tgt_lens.sum()) + B,
            self.pad_id,
        )


class PreparedData:
    """A prepared directory: its manifest, tokenizer, splits and validation text."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)  # its fields checked
        self.dtype = np.dtype(self.manifest["dtype"])
        model = self.directory / self.manifest.get("spm_model", SPM_MODEL)
        self.tokenizer = Tokenizer.load(model)
        self.spm_bytes = model.read_bytes()  # the tokenizer's bytes, of either kind
        check_tokenizer(self.manifest, self.directory, self.spm_bytes, f"its {model.name}")
        special = special_ids(self.tokenizer)
        vocab = (self.tokenizer.src_vocab_size, self.tokenizer.tgt_vocab_size)
        try:
            self.train = PreparedSplit(self.directory, "train", self.dtype, special, vocab)
            self.valid = PreparedSplit(self.directory, "valid", self.dtype, special, vocab)
            self.valid_src, self.valid_tgt = (
                _read_text(self.directory / f"valid.{side}.txt") for side in SIDES
            )
        except CorpusError:  # names the damaged file itself
            raise
        except (OSError, ValueError) as e:
            raise CorpusError(f"{self.directory}: prepared data is incomplete ({e})") from None
        self._check_counts()

    def _check_counts(self) -> None:
        """CorpusError naming the file whose pairs or lines are not the manifest's count:
        a validation text a line short would pair every hypothesis after the gap with the
        wrong reference (it was found only at the first validation, naming no file)."""
        splits = self.manifest["splits"]
        found = [
            ("train", "train.src.idx.npy", len(self.train), "pairs"),
            ("valid", "valid.src.idx.npy", len(self.valid), "pairs"),
            ("valid", "valid.src.txt", len(self.valid_src), "lines"),
            ("valid", "valid.tgt.txt", len(self.valid_tgt), "lines"),
        ]
        for split, name, n, what in found:
            if n != splits[split]["pairs"]:
                raise CorpusError(
                    f"{self.directory / name}: {n} {what}, the manifest says "
                    f"{splits[split]['pairs']} {WHAT[split]} pairs; {DAMAGED}"
                )

    def summary(self, split: str) -> str:
        s, words = self.manifest["splits"][split], self.manifest["max_len_words"]
        # Only training pairs are dropped for their length (validation pairs are all kept).
        long = (
            f", {s['dropped_long']} longer than {words} words" if words and split == "train" else ""
        )
        return (
            f"{s['pairs']} pairs, {s['src_tokens']} + {s['tgt_tokens']} tokens, from "
            f"{self.directory} ({s['dropped_empty']} empty{long}, dropped when prepared)"
        )


def _read_text(path: Path) -> list[str]:
    """The lines of a validation text as written (a byte order mark kept); CorpusError
    naming the file and line of a byte that is not UTF-8."""
    try:
        return decode_lines(path.read_bytes(), str(path), keep_bom=True)
    except CorpusError as e:
        raise CorpusError(f"{e}; {DAMAGED}") from None


def read_manifest(directory: Path) -> dict[str, Any]:
    """``directory``'s manifest, of :data:`FORMAT`, with the fields readers use present and
    of their types; CorpusError naming the file (and field) otherwise."""
    path = directory / MANIFEST
    if not path.is_file():
        what = "not a prepared data directory" if directory.exists() else "no such folder"
        raise CorpusError(f"{directory}: {what} (no {MANIFEST}; prepare the data first)")
    try:
        manifest = json.loads(path.read_text("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CorpusError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise CorpusError(f"{path}: format {found!r}, this version of aiayn reads {FORMAT!r}")
    _check_fields(manifest, path)
    return manifest


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# What a manifest field that readers use must hold: the test, and its words for a message.
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "dtype": (lambda v: v in TOKEN_DTYPES, " or ".join(map(repr, TOKEN_DTYPES))),
    "count": (_count, "a whole number >= 0"),
    "positive": (lambda v: _count(v) and v > 0, "a whole number > 0"),
    "limit": (lambda v: v is None or _count(v), "a whole number >= 0 or null"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "name": (  # a file beside the manifest, not a path out of the directory
        lambda v: isinstance(v, str) and v not in ("", ".", "..") and Path(v).name == v,
        "a file name",
    ),
}
_FIELDS = [
    ("dtype", "dtype"),
    ("vocab_size", "positive"),
    ("spm_sha256", "text"),
    ("max_len_words", "limit"),
    *((f"splits.{split}.{key}", "count") for split in ("train", "valid") for key in COUNTS),
    *((f"inputs.{name}.{key}", kind) for name in INPUTS
      for key, kind in (("path", "text"), ("sha256", "text"), ("bytes", "count"))),
]  # fmt: skip


def _check_fields(manifest: dict[str, Any], path: Path) -> None:
    """CorpusError naming ``path`` and the field when a field that readers of the data use
    is missing or holds another type: a damaged or hand-edited manifest is refused when
    it is read, not met later as a KeyError or numpy's TypeError."""
    optional = [("spm_model", "name")] if "spm_model" in manifest else []  # spm.model if not
    for name, kind in _FIELDS + optional:
        value: Any = manifest
        keys = name.split(".")
        for n, key in enumerate(keys):
            if not isinstance(value, dict):
                got = _shown(value)
                where = ".".join(keys[:n])
                raise CorpusError(
                    f"{path}: field {where!r} must be an object, got {got}; {DAMAGED}"
                )
            if key not in value:
                missing = ".".join(keys[: n + 1])
                raise CorpusError(f"{path}: field {missing!r} is missing; {DAMAGED}")
            value = value[key]
        ok, want = _KINDS[kind]
        if not ok(value):
            raise CorpusError(
                f"{path}: field {name!r} must be {want}, got {_shown(value)}; {DAMAGED}"
            )


def _shown(value: Any, most: int = 60) -> str:
    """``value``'s repr, cut to ``most`` characters (a message stays one short line)."""
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."


def check_tokenizer(manifest: dict, directory: Path, spm_bytes: bytes, what: str) -> None:
    """CorpusError unless ``spm_bytes`` is the tokenizer the data was encoded with."""
    tokenizer = Tokenizer.from_bytes(spm_bytes)
    digest = hashlib.sha256(spm_bytes).hexdigest()
    if digest != manifest["spm_sha256"] or tokenizer.vocab_size != manifest["vocab_size"]:
        raise CorpusError(
            f"{directory / MANIFEST}: the data was encoded with another tokenizer (vocabulary "
            f"{manifest['vocab_size']}, sha256 {manifest['spm_sha256'][:12]}) than {what} "
            f"(vocabulary {tokenizer.vocab_size}, sha256 {digest[:12]}); its ids would mean "
            "other words"
        )
