"""Subword tokenization with SentencePiece (BPE by default; Sennrich et al. 2016 / Kudo
2018). Special ids are fixed so they match TransformerConfig's defaults."""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from aiayn.errors import TokenizerError


class Tokenizer:
    """Text <-> ids. ``encode`` adds no BOS/EOS; ``decode`` stops at the first EOS, skips
    specials and returns detokenized text."""

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
        path = Path(path)
        if not path.is_file():
            raise TokenizerError(f"{path}: no such SentencePiece model")
        try:
            return cls.from_bytes(path.read_bytes())
        except TokenizerError as e:
            raise TokenizerError(f"{path}: {e}") from None

    @classmethod
    def from_bytes(cls, data: bytes) -> Tokenizer:
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(data)
        except (RuntimeError, OSError, TypeError):
            raise TokenizerError("not a valid SentencePiece model (corrupt or truncated)") from None
        return cls(processor)

    def to_bytes(self) -> bytes:
        return self.sp.serialized_model_proto()

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        """``num_threads``: SentencePiece's threads for the batch (-1: its default)."""
        return self.sp.encode(list(texts), num_threads=num_threads)

    def decode(self, ids: Sequence[int]) -> str:
        ids = list(ids)
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        return self.sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def id_to_piece(self, i: int) -> str:
        return self.sp.id_to_piece(i)

    def piece_to_id(self, piece: str) -> int:
        return self.sp.piece_to_id(piece)
