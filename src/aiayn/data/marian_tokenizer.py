"""The tokenizer of pretrained Marian (OPUS-MT) models, as Hugging Face's MarianTokenizer
(transformers 5) encodes and decodes, without transformers.

A Marian model folder holds a SentencePiece model per side (``source.spm``,
``target.spm``) and ``vocab.json``, a map from pieces to the model's ids (not the
SentencePiece ids), plus ``target_vocab.json`` when the two sides have their own
vocabularies (``separate_vocabs``). Encoding a text:

1. split it around the special tokens written in it (``</s>``, ``<unk>``, ``<pad>`` and
   the tokenizer's added special tokens), which stay single ids;
2. a piece of text that starts with a language token ``>>xx<<`` keeps it as one token
   (multilingual models choose their output language with it);
3. the rest goes through the side's SentencePiece model into pieces, mapped to ids by the
   vocabulary (a piece it lacks is ``<unk>``);
4. a source gets EOS appended (:attr:`MarianTokenizer.add_source_eos`).

Decoding skips the special ids, joins the pieces with SentencePiece (the source model's
when the vocabulary is shared, as transformers does) and turns "▁" into spaces.

Serialized (:meth:`MarianTokenizer.to_bytes`, the ``tokenizer`` entry of a checkpoint) it
is a zip archive of the same files that :meth:`MarianTokenizer.save` writes into a model
directory, written byte for byte reproducibly.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from aiayn.data.tokenizer import Tokenizer, check_ids, check_max_tokens, id_list, token_id
from aiayn.errors import TokenizerError

SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
VOCAB, TARGET_VOCAB = "vocab.json", "target_vocab.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPIECE_UNDERLINE = "▁"
# What aiayn keeps in tokenizer_config.json beside transformers' own keys (which ignores
# it): whether sources end with EOS and the decoder's start id.
AIAYN_KEY = "aiayn"
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed: the same tokenizer always gives the same bytes


def _clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (used when the tokenizer config asks)."""
    for before, after in (
        (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
        (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
    ):  # fmt: skip
        text = text.replace(before, after)
    return text


def check_vocab(vocab: Any, what: str) -> dict[str, int]:
    """``vocab`` as a piece -> id dict whose ids are exactly 0..N-1; TokenizerError (naming
    ``what``) otherwise."""
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"{what}: not a JSON object mapping pieces to ids")
    seen: dict[int, str] = {}
    for piece, i in vocab.items():
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(vocab):
            raise TokenizerError(
                f"{what}: piece {piece!r} has id {i!r}, outside 0..{len(vocab) - 1} "
                f"({len(vocab)} pieces)"
            )
        if i in seen:
            raise TokenizerError(f"{what}: pieces {seen[i]!r} and {piece!r} share id {i}")
        seen[i] = piece
    return vocab


def _load_spm(data: bytes, what: str) -> spm.SentencePieceProcessor:
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(data)
    except (RuntimeError, OSError, TypeError):
        raise TokenizerError(f"{what}: not a valid SentencePiece model") from None
    return processor


class MarianTokenizer(Tokenizer):
    """Text <-> ids for a Marian model; the methods of :class:`Tokenizer`.

    ``config`` is the folder's ``tokenizer_config.json`` (transformers' keys:
    ``separate_vocabs``, ``eos_token``, ``unk_token``, ``pad_token``,
    ``added_tokens_decoder``, ``clean_up_tokenization_spaces``, ...) plus aiayn's own
    ``"aiayn": {"add_source_eos": bool, "decoder_start_id": int}`` (defaults: True, and
    the pad id, as transformers' Marian models).
    """

    def __init__(
        self,
        source_spm: bytes,
        target_spm: bytes,
        vocab: dict[str, int],
        target_vocab: dict[str, int] | None = None,
        config: dict[str, Any] | None = None,
    ):
        config = dict(config or {})
        self.config = config
        self.source_spm_bytes, self.target_spm_bytes = source_spm, target_spm
        self.spm_source = _load_spm(source_spm, SOURCE_SPM)
        self.spm_target = _load_spm(target_spm, TARGET_SPM)
        self.separate_vocabs = bool(config.get("separate_vocabs", False))
        self.vocab = check_vocab(vocab, VOCAB)
        if self.separate_vocabs:
            if target_vocab is None:
                raise TokenizerError(
                    f"{TOKENIZER_CONFIG}: separate_vocabs is set, but there is no {TARGET_VOCAB}"
                )
            self.target_vocab = check_vocab(target_vocab, TARGET_VOCAB)
        else:
            self.target_vocab = self.vocab
        self.source_pieces = sorted(self.vocab, key=self.vocab.__getitem__)  # id -> piece
        self.target_pieces = sorted(self.target_vocab, key=self.target_vocab.__getitem__)
        tokens = {}
        for role in ("eos", "unk", "pad"):
            token = _token_text(
                config.get(f"{role}_token", f"<{role}>" if role != "eos" else "</s>")
            )
            for what, table in ((VOCAB, self.vocab), (TARGET_VOCAB, self.target_vocab)):
                if token not in table:
                    raise TokenizerError(f"{what}: has no {role} token {token!r}")
            if self.vocab[token] != self.target_vocab[token]:
                raise TokenizerError(
                    f"{TARGET_VOCAB}: {token!r} is id {self.target_vocab[token]} here but "
                    f"{self.vocab[token]} in {VOCAB}; one id per special token"
                )
            tokens[role] = token
        self.eos_token, self.unk_token, self.pad_token = tokens["eos"], tokens["unk"], tokens["pad"]
        self.eos_id, self.unk_id = self.vocab[self.eos_token], self.vocab[self.unk_token]
        self.pad_id = self.vocab[self.pad_token]
        specials, whole = _special_tokens(config, set(tokens.values()))
        self.whole_tokens = [t for t in sorted(whole, key=len, reverse=True) if t in self.vocab]
        self._split = re.compile("(" + "|".join(map(re.escape, self.whole_tokens)) + ")")
        self.skip_source = {self.vocab[t] for t in specials if t in self.vocab}
        self.skip_target = {self.target_vocab[t] for t in specials if t in self.target_vocab}
        ours = config.get(AIAYN_KEY) or {}
        self.add_source_eos = bool(ours.get("add_source_eos", True))
        self.bos_id = int(ours.get("decoder_start_id", self.pad_id))
        if not 0 <= self.bos_id < len(self.target_vocab):
            raise TokenizerError(f"decoder start id {self.bos_id} is outside the target vocabulary")
        self.clean_up = bool(config.get("clean_up_tokenization_spaces", False))
        # transformers decodes with the source SentencePiece model unless the vocabularies
        # are separate (MarianTokenizer._decode's use_source_tokenizer default).
        self.spm_detok = self.spm_target if self.separate_vocabs else self.spm_source

    # -- reading and writing -------------------------------------------------------------
    FILES = (SOURCE_SPM, TARGET_SPM, VOCAB, TARGET_VOCAB, TOKENIZER_CONFIG)

    @staticmethod
    def is_saved_in(directory: str | Path) -> bool:
        """Whether ``directory`` holds the files of a Marian tokenizer."""
        return all((Path(directory) / name).is_file() for name in (SOURCE_SPM, VOCAB))

    @classmethod
    def from_files(cls, files: dict[str, bytes]) -> MarianTokenizer:
        """From the contents of its files (names as in :attr:`FILES`; the target vocabulary
        and tokenizer config are optional, ``target.spm`` defaults to ``source.spm``)."""
        for name in (SOURCE_SPM, VOCAB):
            if name not in files:
                raise TokenizerError(f"{name}: missing")

        def read_json(name: str) -> Any:
            try:
                return json.loads(files[name].decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                raise TokenizerError(f"{name}: not valid JSON ({e})") from None

        config = read_json(TOKENIZER_CONFIG) if TOKENIZER_CONFIG in files else {}
        if not isinstance(config, dict):
            raise TokenizerError(f"{TOKENIZER_CONFIG}: not a JSON object")
        target_vocab = read_json(TARGET_VOCAB) if TARGET_VOCAB in files else None
        return cls(
            files[SOURCE_SPM],
            files.get(TARGET_SPM, files[SOURCE_SPM]),
            read_json(VOCAB),
            target_vocab if config.get("separate_vocabs") else None,
            config,
        )

    @classmethod
    def load_dir(cls, directory: str | Path) -> MarianTokenizer:
        """From a folder holding ``source.spm``, ``target.spm``, ``vocab.json`` and, when
        present, ``target_vocab.json`` and ``tokenizer_config.json``; errors name the file."""
        directory = Path(directory)
        files = {n: (directory / n).read_bytes() for n in cls.FILES if (directory / n).is_file()}
        try:
            return cls.from_files(files)
        except TokenizerError as e:
            raise TokenizerError(f"{directory}/{e}") from None

    @classmethod
    def from_bytes(cls, data: bytes) -> MarianTokenizer:
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                files = {name: archive.read(name) for name in archive.namelist()}
        except (zipfile.BadZipFile, OSError, EOFError):
            raise TokenizerError("not a valid Marian tokenizer (corrupt or truncated)") from None
        return cls.from_files(files)

    def files(self) -> dict[str, bytes]:
        """Its files: what :meth:`save` writes and :meth:`to_bytes` archives."""
        config = {**self.config, "separate_vocabs": self.separate_vocabs}
        config[AIAYN_KEY] = {"add_source_eos": self.add_source_eos, "decoder_start_id": self.bos_id}
        config.setdefault("tokenizer_class", "MarianTokenizer")

        def to_json(data: Any) -> bytes:
            return (json.dumps(data, ensure_ascii=False, indent=2) + "\n").encode("utf-8")

        files = {
            SOURCE_SPM: self.source_spm_bytes,
            TARGET_SPM: self.target_spm_bytes,
            VOCAB: to_json(self.vocab),
            TOKENIZER_CONFIG: to_json(config),
        }
        if self.separate_vocabs:
            files[TARGET_VOCAB] = to_json(self.target_vocab)
        return files

    def to_bytes(self) -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in self.files().items():
                archive.writestr(zipfile.ZipInfo(name, ZIP_DATE), data, zipfile.ZIP_DEFLATED)
        return out.getvalue()

    def save(self, directory: str | Path) -> list[Path]:
        paths = []
        for name, data in self.files().items():
            paths.append(Path(directory) / name)
            paths[-1].write_bytes(data)
        return paths

    @property
    def file_name(self) -> str:
        return "tokenizer.zip"

    # -- sizes and ids -------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def src_vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def tgt_vocab_size(self) -> int:
        return len(self.target_vocab)

    def describe(self) -> str:
        if self.separate_vocabs:
            return f"Marian, {self.src_vocab_size} source and {self.tgt_vocab_size} target tokens"
        return f"Marian, {self.vocab_size} shared tokens"

    def id_to_piece(self, i: int, source: bool = False) -> str:
        pieces = self.source_pieces if source else self.target_pieces
        return pieces[token_id("id", i, len(pieces))]  # -1 would be the last piece

    def piece_to_id(self, piece: str) -> int:
        return self.target_vocab.get(piece, self.unk_id)

    # -- encoding ------------------------------------------------------------------------
    def _chunks(self, text: str) -> list[tuple[str, bool]]:
        """``text`` split into (text, whole) parts: whole parts are single tokens (special
        and added tokens, a leading language token), the others go to SentencePiece."""
        parts = self._split.split(text) if self.whole_tokens else [text]
        out = []
        for part in parts:
            if not part:
                continue
            if part in self.whole_tokens:
                out.append((part, True))
                continue
            if part.startswith(">>") and (end := part.find("<<")) != -1:  # >>fra<<
                out.append((part[: end + 2], True))
                part = part[end + 2 :]
            out.append((part, False))
        return out

    def _encode(self, texts: Sequence[str], source: bool, num_threads: int = -1) -> list[list[int]]:
        processor = self.spm_source if source else self.spm_target
        table = self.vocab if source else self.target_vocab
        chunked = [self._chunks(t) for t in texts]
        plain = [part for chunks in chunked for part, whole in chunks if not whole]
        pieces = iter(processor.encode(plain, out_type=str, num_threads=num_threads))
        unk = table[self.unk_token]
        out = []
        for chunks in chunked:
            ids = []
            for part, whole in chunks:
                for piece in [part] if whole else next(pieces):
                    ids.append(table.get(piece, unk))
            if source and self.add_source_eos:
                ids.append(self.eos_id)
            out.append(ids)
        return out

    def encode(self, text: str, max_tokens: int | None = None) -> list[int]:
        """Source ids of ``text``, EOS last when :attr:`add_source_eos`; cut to
        ``max_tokens`` (at least 1) the EOS stays last."""
        ids = self._encode([text], source=True)[0]
        if (limit := check_max_tokens(max_tokens)) is not None and len(ids) > limit:
            ids = [*ids[: limit - 1], self.eos_id] if self.add_source_eos and limit else ids[:limit]
        return ids

    def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        return self._encode(list(texts), True, num_threads)

    def encode_target(self, text: str) -> list[int]:
        return self._encode([text], source=False)[0]

    def encode_target_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        return self._encode(list(texts), False, num_threads)

    # -- decoding ------------------------------------------------------------------------
    def decode(self, ids: Sequence[int]) -> str:
        """Text of target ``ids``: special ids skipped (all of them, as transformers'
        ``decode(ids, skip_special_tokens=True)``), pieces joined."""
        ids = id_list(ids)
        try:  # a negative id would index from the end: the last pieces, without a word
            if min(ids, default=0) < 0:
                raise IndexError
            pieces = [self.target_pieces[i] for i in ids if i not in self.skip_target]
        except (TypeError, IndexError):
            check_ids(ids, len(self.target_pieces))
            raise
        text = self.spm_detok.decode_pieces(pieces).replace(SPIECE_UNDERLINE, " ").strip()
        return _clean_up_tokenization(text) if self.clean_up else text

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]


def _special_tokens(config: dict[str, Any], required: set[str]) -> tuple[set[str], set[str]]:
    """(special tokens, tokens kept whole in a text) of a tokenizer config, as transformers
    has them: the special ones (EOS, UNK, PAD, a bos_token, additional special tokens,
    added tokens marked special) are dropped when decoding; every added token
    (``added_tokens_decoder``) is kept whole when written in a text."""
    added = [t for t in (config.get("added_tokens_decoder") or {}).values() if t]
    specials = set(required) | {_token_text(config.get("bos_token"))}
    specials |= {_token_text(t) for t in config.get("additional_special_tokens") or []}
    specials |= {_token_text(t) for t in added if isinstance(t, dict) and t.get("special")}
    specials.discard("")
    return specials, specials | {_token_text(t) for t in added} - {""}


def _token_text(token: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string, or an object with its
    "content"."""
    if isinstance(token, dict):
        token = token.get("content", "")
    return str(token) if token is not None else ""
