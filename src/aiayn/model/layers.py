"""Position-wise feed-forward network and the encoder/decoder layers (Sections 3.1, 3.3)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import TransformerConfig
from aiayn.model.attention import MultiHeadAttention


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied to each position alike (Eq. 2)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        nn.init.xavier_uniform_(self.w_1.weight)
        nn.init.xavier_uniform_(self.w_2.weight)
        nn.init.zeros_(self.w_1.bias)
        nn.init.zeros_(self.w_2.bias)

    def forward(self, x: Tensor) -> Tensor:  # [B, T, d_model] -> [B, T, d_model]
        return self.w_2(F.relu(self.w_1(x)))


class Residual(nn.Module):
    """Residual connection with LayerNorm around one sub-layer (Section 3.1, 5.4).

    Post-LN (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-LN (option):     x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer) -> tuple[Tensor, Tensor | None]:
        """``sublayer(x) -> (y, extra)``; returns the new x and ``extra`` untouched."""
        if self.norm_first:
            y, extra = sublayer(self.norm(x))
            return x + self.dropout(y), extra
        y, extra = sublayer(x)
        return self.norm(x + self.dropout(y)), extra


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in :class:`Residual`."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff)
        args = (cfg.d_model, cfg.dropout, cfg.norm_first, cfg.layer_norm_eps)
        self.attn_block, self.ffn_block = Residual(*args), Residual(*args)

    def forward(
        self, x: Tensor, src_mask: Tensor | None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """x ``[B, S, d_model]``, src_mask ``[B, 1, 1, S]`` -> (x, self-attention weights)."""
        x, weights = self.attn_block(
            x, lambda h: self.self_attn(h, mask=src_mask, need_weights=need_weights)
        )
        x, _ = self.ffn_block(x, lambda h: (self.ffn(h), None))
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward (Section 3.1)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff)
        args = (cfg.d_model, cfg.dropout, cfg.norm_first, cfg.layer_norm_eps)
        self.self_block, self.cross_block = Residual(*args), Residual(*args)
        self.ffn_block = Residual(*args)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        cache: dict[str, dict[str, Tensor]] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x ``[B, T, d_model]``, memory ``[B, S, d_model]`` -> (x, self weights, cross weights).

        ``cache`` holds this layer's incremental state: ``{"self": {...}, "cross": {...}}``.
        """
        self_cache = cross_cache = None
        if cache is not None:
            self_cache, cross_cache = cache.setdefault("self", {}), cache.setdefault("cross", {})
        x, self_w = self.self_block(
            x, lambda h: self.self_attn(h, None, self_mask, self_cache, need_weights)
        )
        x, cross_w = self.cross_block(
            x, lambda h: self.cross_attn(h, memory, cross_mask, cross_cache, need_weights)
        )
        x, _ = self.ffn_block(x, lambda h: (self.ffn(h), None))
        return x, self_w, cross_w
