"""Position-wise feed-forward network and the encoder/decoder layers (Sections 3.1, 3.3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import TransformerConfig
from aiayn.errors import ConfigError
from aiayn.model.attention import MultiHeadAttention
from aiayn.model.cache import CrossAttentionCache, DecoderLayerCache, SelfAttentionCache


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied to each position alike (Eq. 2).

    ``activation`` replaces max(0, .) with swish (SiLU) or gelu (as Marian models may), and
    ``activation_dropout`` drops hidden units after it (Marian's; the paper has none)."""

    def __init__(
        self, d_model: int, d_ff: int, activation: str = "relu", activation_dropout: float = 0.0
    ):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        nn.init.xavier_uniform_(self.w_1.weight)
        nn.init.xavier_uniform_(self.w_2.weight)
        nn.init.zeros_(self.w_1.bias)
        nn.init.zeros_(self.w_2.bias)
        if activation not in _ACTIVATIONS:
            raise ConfigError(f"activation must be one of {', '.join(_ACTIVATIONS)}")
        self.activation, self.activation_dropout = activation, activation_dropout

    def forward(self, x: Tensor) -> Tensor:  # [B, T, d_model] -> [B, T, d_model]
        hidden = _ACTIVATIONS[self.activation](self.w_1(x))  # [B, T, d_ff]
        if self.activation_dropout > 0.0:
            hidden = F.dropout(hidden, self.activation_dropout, self.training)
        return self.w_2(hidden)


# TransformerConfig.activation -> the function (swish is SiLU: x * sigmoid(x)).
_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "swish": F.silu,
    "gelu": F.gelu,
}


# Checkpoints written before the sub-layer blocks were spelled out kept each LayerNorm in a
# Residual wrapper; their keys load into today's names.
_LEGACY_NORM_KEYS = {
    "attn_block.norm.": "self_attn_norm.",  # encoder layer
    "self_block.norm.": "self_attn_norm.",  # decoder layer
    "cross_block.norm.": "cross_attn_norm.",
    "ffn_block.norm.": "ffn_norm.",
}


def current_names(weights: dict[str, Any]) -> dict[str, Any]:
    """A whole model's ``weights`` (a state dict) under today's names: the layers' norms
    that older aiayn saved as ``*_block.norm.*`` renamed, as loading renames them."""
    renamed, layers = dict(weights), set()
    for key in weights:
        head, found, rest = key.partition(".layers.")  # "decoder", ".layers.", "0.cross_..."
        if found:
            layers.add(f"{head}{found}{rest.split('.', 1)[0]}.")
    for prefix in layers:  # once per layer: each pass reads every name
        _rename_legacy_keys(renamed, prefix)
    return renamed


def _rename_legacy_keys(state_dict: dict[str, Any], prefix: str) -> None:
    for key in [k for k in state_dict if k.startswith(prefix)]:
        rest = key[len(prefix) :]
        for old, new in _LEGACY_NORM_KEYS.items():
            if rest.startswith(old):
                state_dict[prefix + new + rest[len(old) :]] = state_dict.pop(key)
                break


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each with a residual connection and LayerNorm
    (Section 3.1): post-LN ``LayerNorm(x + Dropout(Sublayer(x)))`` as in the paper, or
    pre-LN ``x + Dropout(Sublayer(LayerNorm(x)))`` with ``norm_first``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.activation_dropout)
        self.self_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)  # Section 5.4: on each sub-layer's output
        self.norm_first = cfg.norm_first

    def forward(
        self, x: Tensor, src_mask: Tensor | None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """x ``[B, S, d_model]``, src_mask ``[B, 1, 1, S]`` -> (x, self-attention weights)."""
        if self.norm_first:
            y, weights = self._sa_block(self.self_attn_norm(x), src_mask, need_weights)
            x = x + y
            x = x + self._ff_block(self.ffn_norm(x))
        else:
            y, weights = self._sa_block(x, src_mask, need_weights)
            x = self.self_attn_norm(x + y)
            x = self.ffn_norm(x + self._ff_block(x))
        return x, weights

    def _sa_block(
        self, x: Tensor, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        y, weights = self.self_attn(x, mask=mask, need_weights=need_weights)
        return self.dropout(y), weights

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout(self.ffn(x))

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        _rename_legacy_keys(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward, each with a residual
    connection and LayerNorm placed as in :class:`EncoderLayer` (Section 3.1)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.activation_dropout)
        self.self_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.cross_attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        cache: DecoderLayerCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x ``[B, T, d_model]``, memory ``[B, S, d_model]`` -> (x, self weights, cross weights).

        ``cache`` holds this layer's incremental state (incremental decoding: x holds only
        the new steps), one cache per attention sub-layer.
        """
        self_cache = cache.self_attn if cache is not None else None
        cross_cache = cache.cross_attn if cache is not None else None
        if self.norm_first:
            y, self_w = self._sa_block(self.self_attn_norm(x), self_mask, self_cache, need_weights)
            x = x + y
            y, cross_w = self._mha_block(
                self.cross_attn_norm(x), memory, cross_mask, cross_cache, need_weights
            )
            x = x + y
            x = x + self._ff_block(self.ffn_norm(x))
        else:
            y, self_w = self._sa_block(x, self_mask, self_cache, need_weights)
            x = self.self_attn_norm(x + y)
            y, cross_w = self._mha_block(x, memory, cross_mask, cross_cache, need_weights)
            x = self.cross_attn_norm(x + y)
            x = self.ffn_norm(x + self._ff_block(x))
        return x, self_w, cross_w

    def _sa_block(
        self,
        x: Tensor,
        mask: Tensor | None,
        cache: SelfAttentionCache | None,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        y, weights = self.self_attn(x, None, mask, cache, need_weights)
        return self.dropout(y), weights

    def _mha_block(
        self,
        x: Tensor,
        memory: Tensor,
        mask: Tensor | None,
        cache: CrossAttentionCache | None,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        y, weights = self.cross_attn(x, memory, mask, cache, need_weights)
        return self.dropout(y), weights

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout(self.ffn(x))

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        _rename_legacy_keys(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
