"""Scaled dot-product and multi-head attention (Section 3.2)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.errors import ModelInputError

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


# Self-attention caches grow by this many columns at a time: most steps then write their
# keys into memory that is already there, instead of a fresh allocation per step, whose
# first touch costs a page fault per 4 KiB (it was 20% of a beam search; BENCHMARKS.md).
_GROW = 32


def _append(cache: dict[str, Tensor], name: str, new: Tensor, order: Tensor | None) -> Tensor:
    """``cache[name]`` (keys or values ``[B', h, L, d_k]``, or nothing yet) then this
    step's ``new [B, h, T, d_k]`` along the time axis; ``order [B]`` first picks the cached
    rows (a beam reorder left pending by the decoder state). Returns ``[B, h, L + T, d_k]``,
    also stored as ``cache[name]``.

    The result is a view of a buffer with room for more columns (``cache[name + "_buf"]``),
    so the next step without a reorder writes only its own column; a reorder gathers into a
    second buffer kept from the step before (``name + "_spare"``), and the two swap roles.
    Either buffer may hold more rows than the view: rows only leave a search."""
    B, h, T, d_k = new.shape
    cached = cache.get(name, new[:, :, :0])  # a first step: nothing cached yet
    L = cached.size(2)
    buf = cache.get(name + "_buf")
    if order is None and buf is not None and _fits(buf, B, L + T) and _is_prefix(cached, buf):
        dst = buf  # append in place: the cached columns are where they should be
    else:
        spare = cache.pop(name + "_spare", None)
        if spare is None or not _fits(spare, B, L + T):
            spare = new.new_empty(B, h, L + T + _GROW, d_k)
        dst = spare
        if order is None:
            dst[:B, :, :L] = cached
        else:
            torch.index_select(cached, 0, order, out=dst[:B, :, :L])
        if buf is not None:
            cache[name + "_spare"] = buf
        cache[name + "_buf"] = dst
    dst[:B, :, L : L + T] = new
    out = cache[name] = dst[:B, :, : L + T]
    return out


def forget_buffers(cache: dict[str, Tensor]) -> None:
    """Drop the buffers :func:`_append` keeps in a self-attention ``cache`` (for when its
    keys and values are replaced by tensors of other rows)."""
    for name in ("k", "v"):
        cache.pop(name + "_buf", None)
        cache.pop(name + "_spare", None)


def _fits(buf: Tensor, rows: int, columns: int) -> bool:
    return buf.size(0) >= rows and buf.size(2) >= columns


def _is_prefix(view: Tensor, buf: Tensor) -> bool:
    """Is ``view`` the first rows and columns of ``buf``?"""
    return view.data_ptr() == buf.data_ptr() and view.stride() == buf.stride()


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
        cache: dict[str, Tensor] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x ``[B, T, d_model]``, memory ``[B, S, d_model]`` or None -> ``[B, T, d_model]``.

        ``cache`` (incremental decoding) is a dict this layer owns: for self-attention the
        keys/values of earlier steps are kept and extended by this call's steps; for
        encoder-decoder attention K and V are projected from ``memory`` once and reused.
        A cached K/V with B/G rows serves G consecutive rows of x each (the beams of one
        sentence, in continuous batching), without G copies of it. A self-attention cache
        may hold a pending row order (``"order"``, see ``DecoderState.reorder``), applied
        while appending.
        """
        d = self.d_model
        if memory is None:
            q, k, v = map(self._split_heads, self.in_proj(x).chunk(3, dim=-1))
            if cache is not None:
                order = cache.pop("order", None)
                k, v = _append(cache, "k", k, order), _append(cache, "v", v, order)
        else:
            project_q, _ = self._cross_projections()
            q = self._split_heads(project_q(x))
            if cache is not None and "k" in cache:
                k, v = cache["k"], cache["v"]
            else:
                k, v = self.memory_kv(memory)
                if cache is not None:
                    cache["k"], cache["v"] = k, v
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
