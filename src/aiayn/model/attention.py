"""Scaled dot-product and multi-head attention (Section 3.2)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.errors import ModelInputError
from aiayn.model.cache import CrossAttentionCache, SelfAttentionCache

try:  # torch >= 2.3
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # cuDNN's fused attention builds an execution plan for every new shape (~0.3 s each on
    # an H100, torch 2.11), and ours change with every batch and every decoding step (the
    # key/value cache grows); the other fused kernels have no such per-shape cost.
    _CUDA_BACKENDS: list[SDPBackend] | None = [
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
    ]
except ImportError:  # pragma: no cover - older torch has no cuDNN attention either
    _CUDA_BACKENDS = None  # and no sdpa_kernel: never called then


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q K^T / sqrt(d_k)) V  (Section 3.2.1, Eq. 1).

    q ``[B, h, T_q, d_k]``, k and v ``[B, h, T_k, d_k]``; ``mask`` is boolean, broadcastable
    to ``[B, h, T_q, T_k]``, True where attending is allowed, applied before the softmax.
    Returns the output ``[B, h, T_q, d_k]`` and, only if ``need_weights``, the weights
    ``[B, h, T_q, T_k]``. A query row whose keys are all masked gets zero weights and a
    zero output, never NaN.
    """
    if not need_weights:
        # The fused kernel gives the same result (tested) without materialising weights.
        if q.is_cuda and _CUDA_BACKENDS is not None:
            with sdpa_kernel(_CUDA_BACKENDS):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        return out, None
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # [B, h, T_q, T_k]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all-masked rows: 0/0 -> 0
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights


def _ungroup(x: Tensor, group: int, T: int) -> Tensor:
    """``[B/G, h, G*T, n]`` (queries of G rows side by side) -> ``[B, h, T, n]``."""
    _, h, _, n = x.shape
    return x.reshape(-1, h, group, T, n).transpose(1, 2).reshape(-1, h, T, n)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K,
    V W_i^V)  (Section 3.2.2).

    One class for the paper's three uses (Section 3.2.3): encoder self-attention and masked
    decoder self-attention (``memory=None``: Q, K, V all from ``x``) and encoder-decoder
    attention (Q from ``x``, K and V from ``memory``). The h per-head projections are fused
    into one ``[3 * d_model, d_model]`` weight laid out as torch.nn.MultiheadAttention's
    ``in_proj_weight`` (rows: W^Q, W^K, W^V; head i owns columns i*d_k..(i+1)*d_k).
    """

    def __init__(self, d_model: int, n_heads: int, attention_dropout: float = 0.0):
        super().__init__()
        if d_model % n_heads:
            raise ModelInputError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.attention_dropout = attention_dropout
        self.in_proj = nn.Linear(d_model, 3 * d_model)  # W^Q, W^K, W^V for all heads
        self.out_proj = nn.Linear(d_model, d_model)  # W^O
        nn.init.xavier_uniform_(self.in_proj.weight)
        nn.init.zeros_(self.in_proj.bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def _cross_projections(self) -> tuple[Callable, Callable]:
        """x -> x W^Q + b^Q and memory -> [memory W^K + b^K, memory W^V + b^V].

        Overridden by :class:`aiayn.quantize.SplitCrossAttention`, whose two blocks are
        separate (quantizable) layers."""
        # One split of the fused weight: its backward concatenates the two gradients, where
        # two slices would each zero-fill a [3 d_model, d_model] gradient and add them up.
        d = self.d_model
        w_q, w_kv = self.in_proj.weight.split([d, 2 * d])
        b_q, b_kv = self.in_proj.bias.split([d, 2 * d])
        return partial(F.linear, weight=w_q, bias=b_q), partial(F.linear, weight=w_kv, bias=b_kv)

    def _split_heads(self, x: Tensor) -> Tensor:
        # [B, T, d_model] -> [B, T, h, d_k] -> [B, h, T, d_k]; the transpose is what keeps
        # each head's d_k features together (a bare reshape to [B, h, T, d_k] mixes them).
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_k).transpose(1, 2)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder-decoder keys and values of ``memory [B, S, d_model]``: two ``[B, h, S,
        d_k]`` tensors (what the cross-attention cache holds)."""
        _, project_kv = self._cross_projections()
        k, v = map(self._split_heads, project_kv(memory).chunk(2, dim=-1))
        return k, v

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        cache: SelfAttentionCache | CrossAttentionCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x ``[B, T, d_model]``, memory ``[B, S, d_model]`` or None -> ``[B, T, d_model]``.

        ``cache`` (incremental decoding): for self-attention a :class:`SelfAttentionCache`,
        whose keys/values of earlier steps this call's steps extend (its pending row order
        applied first); for encoder-decoder attention a :class:`CrossAttentionCache`, whose
        keys/values, projected from ``memory`` once, are used instead of projecting it
        again. A cached K/V with B/G rows serves G consecutive rows of x each (the beams of
        one sentence, in continuous batching), without G copies of it; ``mask`` then has
        B/G rows too (``[B/G, 1, 1, S]``, one per source), not B.
        """
        d = self.d_model
        if memory is None:
            q, k, v = map(self._split_heads, self.in_proj(x).chunk(3, dim=-1))
            if cache is not None:
                assert isinstance(cache, SelfAttentionCache)
                k, v = cache.append(k, v)
        else:
            project_q, _ = self._cross_projections()
            q = self._split_heads(project_q(x))
            k, v = (cache.keys, cache.values) if cache is not None else self.memory_kv(memory)
        dropout_p = self.attention_dropout if self.training else 0.0
        B, h, T, d_k = q.shape
        group = B // k.size(0) if k.size(0) else 1  # an empty batch: nothing shares
        if group > 1:  # G beams share one source's K/V: its G*T queries attend together
            q = q.reshape(-1, group, h, T, d_k).transpose(1, 2).reshape(-1, h, group * T, d_k)
        out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p, need_weights)
        if group > 1:  # [B/G, h, G*T, .] -> [B, h, T, .]
            out = _ungroup(out, group, T)
            weights = None if weights is None else _ungroup(weights, group, T)
        out = out.transpose(1, 2).reshape(B, T, d)  # concat heads: [B, T, h * d_k]
        return self.out_proj(out), weights
