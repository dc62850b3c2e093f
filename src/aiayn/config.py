"""TransformerConfig: every hyper-parameter of the model in one dataclass.

Names follow the paper (Vaswani et al. 2017): d_model, n_heads (h), d_ff, d_k = d_model / h,
n_layers (N). ``base()`` and ``big()`` are the two rows of Table 3.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from aiayn.errors import ConfigError

# The special token ids, fixed for every vocabulary aiayn builds (SentencePiece models and
# the demo's word list alike); TransformerConfig's defaults.
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
# The FFN activations (Eq. 2 uses relu); swish is SiLU, x * sigmoid(x); gelu the exact one.
ACTIVATIONS = ("relu", "swish", "gelu")
# The longest max_len: the model builds a [max_len, d_model] position table up front (a
# billion positions asked torch for terabytes), and attention over a sequence grows with
# its square; translation models use 512 or 1024.
MAX_POSITIONS = 65536


_KIND_NAMES = {"int": "an int", "float": "a finite number", "bool": "true or false", "str": "text"}


def _is_a(value: Any, kind: str) -> bool:
    """Whether ``value`` is of the field type ``kind`` (an int is a float too; a bool is
    neither)."""
    if kind == "bool" or isinstance(value, bool):
        return kind == "bool" and isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, int if kind == "int" else str)


@dataclass
class TransformerConfig:
    """Hyper-parameters of an encoder-decoder Transformer.

    Special ids (``pad_id``, ``bos_id``, ``eos_id``) must agree with the tokenizer; every
    part of aiayn (padding, batching, masks, loss, decoding) takes them from here.
    ``bos_id`` is the token the decoder starts from; it may equal ``pad_id`` (Marian's
    decoder starts from pad), and decoder self-attention always sees position 0.
    ``share_embeddings`` shares the source and target embedding tables (needs one joint
    vocabulary); ``tie_output`` ties the pre-softmax projection to the target embedding
    (Section 3.4). Both on gives the paper's three-way tying.

    The fields after ``tie_output`` extend the paper and default to it; ``activation``,
    ``output_bias``, ``scale_embeddings`` and ``activation_dropout`` describe pretrained
    Marian (OPUS-MT) models (:mod:`aiayn.marian`).
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    n_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    max_len: int = 1024
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    share_embeddings: bool = False
    tie_output: bool = True
    # Extensions beyond the paper, off by default.
    n_encoder_layers: int | None = None  # None: n_layers
    n_decoder_layers: int | None = None  # None: n_layers
    norm_first: bool = False  # pre-LN instead of the paper's post-LN
    learned_positions: bool = False  # Section 3.5 compares both; sinusoidal is the paper's
    attention_dropout: float = 0.0  # dropout on attention weights (tensor2tensor; not the paper)
    layer_norm_eps: float = 1e-5
    activation: str = "relu"  # of the FFN's hidden layer: relu (Eq. 2), swish (SiLU) or gelu
    activation_dropout: float = 0.0  # dropout after the FFN's activation (Marian's)
    output_bias: bool = False  # a bias on the pre-softmax projection (Marian's final_logits_bias)
    scale_embeddings: bool = True  # embeddings times sqrt(d_model) (Section 3.4)

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> ConfigError:
            return ConfigError(f"TransformerConfig.{field}: {why}")

        for field in fields(self):  # the annotated type first: a recipe or a file may hold any
            value, kind = getattr(self, field.name), str(field.type).removesuffix(" | None")
            if value is None and str(field.type).endswith(" | None"):
                continue
            if not _is_a(value, kind):
                raise bad(field.name, f"must be {_KIND_NAMES[kind]}, got {value!r}")
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "n_layers", "d_ff"):
            if getattr(self, name) <= 0:
                raise bad(name, f"must be a positive int, got {getattr(self, name)!r}")
        if not 0 < self.max_len <= MAX_POSITIONS:
            raise bad("max_len", f"must be in [1, {MAX_POSITIONS}], got {self.max_len}")
        if self.layer_norm_eps <= 0:
            raise bad("layer_norm_eps", f"must be > 0, got {self.layer_norm_eps}")
        if self.d_model % self.n_heads:
            raise bad(
                "n_heads", f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise bad(name, f"must be in [0, 1), got {getattr(self, name)}")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            limit = min(self.src_vocab_size, self.tgt_vocab_size)
            if not 0 <= value < limit:
                raise bad(name, f"{value} is outside the vocabulary [0, {limit})")
        if self.eos_id in (self.pad_id, self.bos_id):
            raise bad("eos_id", f"{self.eos_id} is also pad_id or bos_id; EOS needs its own id")
        if self.activation not in ACTIVATIONS:
            choices = ", ".join(ACTIVATIONS)
            raise bad("activation", f"must be one of {choices}, got {self.activation!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise bad(
                "share_embeddings",
                f"needs one joint vocabulary, got src_vocab_size={self.src_vocab_size} "
                f"and tgt_vocab_size={self.tgt_vocab_size}",
            )
        if self.n_encoder_layers is not None and self.n_encoder_layers < 0:
            raise bad("n_encoder_layers", f"must be >= 0, got {self.n_encoder_layers}")
        if self.n_decoder_layers is not None and self.n_decoder_layers < 1:
            raise bad(  # cross-attention, the output's only path to the source, is in them
                "n_decoder_layers",
                f"must be >= 1 (without a decoder layer no output depends on the source), "
                f"got {self.n_decoder_layers}",
            )

    @property
    def d_k(self) -> int:
        """Per-head width of queries, keys and values (d_k = d_v = d_model / h)."""
        return self.d_model // self.n_heads

    @property
    def encoder_layers(self) -> int:
        return self.n_layers if self.n_encoder_layers is None else self.n_encoder_layers

    @property
    def decoder_layers(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers

    @classmethod
    def base(cls, vocab_size: int, **overrides: Any) -> TransformerConfig:
        """Transformer (base), Table 3: N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1 (63.1M at a
        37k vocabulary; the paper reports 65M)."""
        return cls._table3(vocab_size, 512, 8, 2048, 0.1, overrides)

    @classmethod
    def big(cls, vocab_size: int, **overrides: Any) -> TransformerConfig:
        """Transformer (big), Table 3: N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (214.2M at a
        37k vocabulary; the paper reports 213M)."""
        return cls._table3(vocab_size, 1024, 16, 4096, 0.3, overrides)

    @classmethod
    def _table3(
        cls, vocab: int, d_model: int, n_heads: int, d_ff: int, dropout: float, overrides: dict
    ) -> TransformerConfig:
        # Both rows share N=6 and one joint (BPE) vocabulary with three-way tying (3.4).
        kwargs = dict(
            src_vocab_size=vocab,
            tgt_vocab_size=vocab,
            d_model=d_model,
            n_heads=n_heads,
            n_layers=6,
            d_ff=d_ff,
            dropout=dropout,
            share_embeddings=True,
            tie_output=True,
        )
        return cls.from_dict({**kwargs, **overrides})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformerConfig:
        """Build from a dict, naming any unknown or missing key instead of failing inside
        __init__."""
        if not isinstance(data, Mapping):  # None or a list: no fields to read
            raise ConfigError(
                f"TransformerConfig.from_dict needs a dict of fields, got {type(data).__name__}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(map(str, set(data) - known))
        if unknown:
            raise ConfigError(f"TransformerConfig: unknown field(s) {', '.join(unknown)}")
        required = [f.name for f in fields(cls) if f.default is MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise ConfigError(f"TransformerConfig: missing field(s) {', '.join(missing)}")
        return cls(**data)
