"""Attention masks (Section 3.2.3).

One convention everywhere: a boolean mask is **True where a query may attend to a key**
(the convention of ``torch.nn.functional.scaled_dot_product_attention``). Masks broadcast
against attention scores of shape ``[B, h, T_q, T_k]``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Key padding mask: ``ids [B, S]`` -> ``[B, 1, 1, S]``, False at pad keys.

    Queries are never masked here: a pad *query* still produces a (finite) output that
    callers ignore, which keeps every row of the softmax well defined.
    """
    return (ids != pad_id)[:, None, None, :]


def causal_mask(size: int, device: torch.device | None = None) -> Tensor:
    """Subsequent-position mask ``[1, 1, T, T]``: query t may attend to keys 0..t only."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril_()[None, None]


def decoder_self_mask(tgt_in: Tensor, pad_id: int) -> Tensor:
    """Causal AND target key padding: ``tgt_in [B, T]`` -> ``[B, 1, T, T]``.

    Position 0 holds the decoder's start token and is never padding, even where that token
    is the pad id (Marian models start decoding from pad): every query may attend to it.
    """
    keys = tgt_in != pad_id  # [B, T]
    if keys.size(1):
        keys[:, 0] = True
    return causal_mask(tgt_in.size(1), tgt_in.device) & keys[:, None, None, :]
