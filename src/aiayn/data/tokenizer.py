"""Subword tokenization with SentencePiece (BPE by default; Sennrich et al. 2016 / Kudo
2018). Special ids are fixed so they match TransformerConfig's defaults.

:class:`Tokenizer` is aiayn's own: one joint SentencePiece model for both languages, whose
ids are the model's ids. Pretrained Marian (OPUS-MT) models bring another kind,
:class:`~aiayn.data.marian_tokenizer.MarianTokenizer` (a SentencePiece model per side and
a vocabulary that maps pieces to the model's ids), with the same methods:
:meth:`Tokenizer.from_bytes` and :meth:`Tokenizer.load` return whichever kind they read.
Every caller takes the special ids from the tokenizer or the model's config, never from
the constants below.
"""

from __future__ import annotations

import io
import operator
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from aiayn.errors import TokenizerError

# The first bytes of a zip archive: a serialized MarianTokenizer (a SentencePiece model is a
# protocol buffer and never starts with them).
ZIP_MAGIC = b"PK\x03\x04"
SPM_FILE = "spm.model"  # the file a joint tokenizer is saved as in a model directory
SPM_MAX_SENTENCE = 4192  # SentencePiece's default max_sentence_length, in bytes


class Tokenizer:
    """Text <-> ids. ``encode`` gives the source ids a model takes (no BOS/EOS here; see
    :attr:`add_source_eos`), ``encode_target`` the target ids (the decoder's BOS and EOS
    are added by batching); ``decode`` stops at the first EOS, skips specials and returns
    detokenized text. One joint vocabulary: source and target ids are the same."""

    add_source_eos = False  # whether ``encode`` ends every source with EOS

    def __init__(self, processor: spm.SentencePieceProcessor):
        self.sp = processor
        ids = (processor.pad_id(), processor.bos_id(), processor.eos_id(), processor.unk_id())
        if ids != (PAD_ID, BOS_ID, EOS_ID, UNK_ID):
            raise TokenizerError(
                f"tokenizer special ids (pad, bos, eos, unk) are {ids}, expected "
                f"{(PAD_ID, BOS_ID, EOS_ID, UNK_ID)}"
            )

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        model_prefix: str | Path,
        vocab_size: int = 8000,
        model_type: str = "bpe",
        character_coverage: float = 1.0,
        num_threads: int = 2,
    ) -> Tokenizer:
        """Train on ``texts`` (pass source and target together for a joint vocabulary) and
        save ``<model_prefix>.model``. ``vocab_size`` is a ceiling on a tiny corpus."""
        texts = [t for t in texts if t.strip()]
        if not texts:
            raise TokenizerError("tokenizer: no text to train on")
        # SentencePiece leaves out every line over max_sentence_length bytes without a
        # word (one language of a joint vocabulary, say, if its lines are long paragraphs).
        longest = max(len(t.encode()) for t in texts)
        lengths: dict[str, Any] = {"max_sentence_length": longest}
        if longest <= SPM_MAX_SENTENCE:  # the default, as before: the same model bytes
            lengths = {}
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(texts),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                pad_id=PAD_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                unk_id=UNK_ID,
                hard_vocab_limit=False,  # a small corpus gets a smaller vocabulary, not an error
                num_threads=num_threads,
                input_sentence_size=2_000_000,
                shuffle_input_sentence=True,
                minloglevel=2,
                **lengths,
            )
        except RuntimeError as e:
            raise TokenizerError(f"tokenizer: SentencePiece training failed: {e}") from None
        tokenizer = cls.from_bytes(model.getvalue())
        path = Path(f"{model_prefix}.model")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(model.getvalue())
        return tokenizer

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """A tokenizer file (a SentencePiece model or a serialized Marian tokenizer) or a
        model directory (its ``spm.model``, or the Marian files ``source.spm``,
        ``target.spm``, ``vocab.json``, ...)."""
        path = Path(path)
        if path.is_dir():
            from aiayn.data.marian_tokenizer import MarianTokenizer

            if MarianTokenizer.is_saved_in(path):
                return MarianTokenizer.load_dir(path)
            path = path / SPM_FILE
        if not path.is_file():
            raise TokenizerError(f"{path}: no such SentencePiece model")
        try:
            return cls.from_bytes(path.read_bytes())
        except TokenizerError as e:
            raise TokenizerError(f"{path}: {e}") from None
        except OSError as e:  # no permission: not the fault of a file being written
            raise TokenizerError(f"{path}: cannot read ({e.strerror or e})") from None

    @classmethod
    def from_bytes(cls, data: bytes) -> Tokenizer:
        """The tokenizer ``to_bytes`` gave (of either kind)."""
        if data[:4] == ZIP_MAGIC:
            from aiayn.data.marian_tokenizer import MarianTokenizer

            return MarianTokenizer.from_bytes(data)
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(data)
        except (RuntimeError, OSError, TypeError):
            raise TokenizerError("not a valid SentencePiece model (corrupt or truncated)") from None
        return cls(processor)

    def to_bytes(self) -> bytes:
        return self.sp.serialized_model_proto()

    def save(self, directory: str | Path) -> list[Path]:
        """Write the tokenizer's files into ``directory`` (here ``spm.model``)."""
        path = Path(directory) / SPM_FILE
        path.write_bytes(self.to_bytes())
        return [path]

    @property
    def file_name(self) -> str:
        """The one file :meth:`to_bytes` is kept in beside prepared data."""
        return SPM_FILE

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    @property
    def src_vocab_size(self) -> int:
        return self.vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        return self.vocab_size

    def describe(self) -> str:
        return f"{self.vocab_size} joint tokens"

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    # The methods below raise TokenizerError naming the bad argument or item (text that is
    # not a str, an id outside the vocabulary) instead of SentencePiece's errors; the items
    # are looked at only after SentencePiece refused them, so good input costs nothing more.
    def encode(self, text: str, max_tokens: int | None = None) -> list[int]:
        """Source ids of ``text``, at most ``max_tokens`` of them (None: all)."""
        return self._encode_one(text)[: check_max_tokens(max_tokens)]

    def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        """Source ids of each text. ``num_threads``: SentencePiece's threads for the batch
        (-1: its default)."""
        return self._encode_many(texts, num_threads)

    def encode_target(self, text: str) -> list[int]:
        """Target ids of ``text`` (no BOS or EOS)."""
        return self._encode_one(text)

    def encode_target_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        return self._encode_many(texts, num_threads)

    def _encode_one(self, text: str) -> list[int]:
        if not isinstance(text, str):  # SentencePiece takes bytes, and a list as a batch
            raise TokenizerError(f"text: a str, not {type(text).__name__}")
        try:
            return self.sp.encode(text)
        except RuntimeError:
            if (error := _text_error("text", text)) is None:
                raise
            raise error from None

    def _encode_many(self, texts: Sequence[str], num_threads: int) -> list[list[int]]:
        if isinstance(texts, str) or not isinstance(texts, Iterable):
            raise TokenizerError(f"texts: a list of str, not {type(texts).__name__}")
        texts = list(texts)
        try:
            return self.sp.encode(texts, num_threads=num_threads)
        except (TypeError, RuntimeError):
            for i, text in enumerate(texts):
                if (error := _text_error(f"texts[{i}]", text)) is not None:
                    raise error from None
            raise

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (a list, tuple, 1-D tensor or array of ints): up to the first
        EOS, PAD and BOS skipped."""
        ids = id_list(ids)
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        try:
            text = self.sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])
        except (TypeError, IndexError):
            check_ids(ids, self.vocab_size)
            raise
        if not isinstance(text, str):  # a list of lists, which SentencePiece takes as a batch
            check_ids(ids, self.vocab_size)  # names the first item that is no id
            raise TokenizerError("ids: one sequence of token ids, not a batch (decode_batch)")
        return text

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def id_to_piece(self, i: int, source: bool = False) -> str:
        """The piece of target id ``i`` (source id with ``source=True``)."""
        # Checked first: SentencePiece gives an IndexError, or a list of pieces for a list.
        return self.sp.id_to_piece(token_id("id", i, self.vocab_size))

    def piece_to_id(self, piece: str) -> int:
        """The target id of ``piece`` (the unknown id for a piece not in the vocabulary)."""
        if not isinstance(piece, str):  # a list would give a list
            raise TokenizerError(f"piece: a str, not {type(piece).__name__}")
        return self.sp.piece_to_id(piece)


def _text_error(name: str, text: object) -> TokenizerError | None:
    """Why ``text`` cannot be encoded (not a str, or not valid Unicode: a lone surrogate,
    which SentencePiece's C++ cannot take), naming ``name``; None when it can."""
    if not isinstance(text, str):
        return TokenizerError(f"{name}: a str, not {type(text).__name__}")
    if (at := unencodable(text)) is not None:
        return TokenizerError(f"{name}: not valid Unicode (character {at})")
    return None


def unencodable(text: str) -> int | None:
    """The index of the first character of ``text`` that UTF-8 cannot encode, None when
    there is none: a lone surrogate (bytes that were not UTF-8, kept by Python's
    surrogateescape, or a JSON escape), which no tokenizer can take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def id_list(ids: object) -> list:
    """``ids`` (a list, tuple, 1-D tensor or array of token ids) as a list; TokenizerError
    for text or anything else that is no sequence (``decode("abc")`` would read letters),
    and for a tensor or array of another rank than 1 (a 2-D one is a batch: decode_batch)."""
    ndim = getattr(ids, "ndim", 1)
    if ndim != 1 and hasattr(ids, "tolist"):
        raise TokenizerError(
            f"ids: one sequence of token ids (1-D), got a {ndim}-D {type(ids).__name__}"
            + ("; decode_batch takes a batch" if ndim == 2 else "")
        )
    ids = ids.tolist() if hasattr(ids, "tolist") else ids  # a tensor's items as ints
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TokenizerError(f"ids: a sequence of token ids, not {type(ids).__name__}")
    found = list(ids)
    if all(type(i) is int for i in found):
        return found
    return [_plain_int(i) for i in found]  # numpy ints, 0-d tensors: SentencePiece takes ints


def _plain_int(i: object) -> object:
    """``i`` as a Python int if it is an integer of another type; else ``i`` (checked by
    the caller, which names it)."""
    try:
        return operator.index(i)  # type: ignore[arg-type]
    except TypeError:
        return i


def check_ids(ids: list, vocab_size: int) -> None:
    """TokenizerError naming the first of ``ids`` that is no id in [0, vocab_size): called
    after a decoder refused them, so good input is not looked at twice."""
    for k, i in enumerate(ids):
        token_id(f"ids[{k}]", i, vocab_size)


def token_id(name: str, i: object, vocab_size: int) -> int:
    """``i`` as an int (a numpy or tensor int too); TokenizerError naming ``name`` unless
    it is an id in [0, vocab_size)."""
    try:
        value = operator.index(i)  # type: ignore[arg-type]
    except TypeError:
        raise TokenizerError(f"{name}: {i!r} is not a token id (an int)") from None
    if not 0 <= value < vocab_size:
        raise TokenizerError(f"{name}: {value} is outside the vocabulary [0, {vocab_size})")
    return value


def check_max_tokens(max_tokens: object) -> int | None:
    """``max_tokens`` (None, or an integer >= 0, numpy's too: a negative one would cut from
    the end) as an int; TokenizerError otherwise."""
    if max_tokens is None:
        return None
    limit = -1 if isinstance(max_tokens, bool) else _plain_int(max_tokens)
    if not isinstance(limit, int) or limit < 0:
        raise TokenizerError(f"max_tokens must be None or an integer >= 0, got {max_tokens!r}")
    return limit
