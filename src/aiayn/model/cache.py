"""The key/value caches of incremental decoding: attention (Section 3.2.3) one step at a time.

Generating the token at position t feeds the decoder only the token at t - 1: its masked
self-attention then needs the keys and values of every earlier target position, and its
encoder-decoder attention the keys and values of the encoder output (the memory), which no
step changes. Per decoder layer a :class:`DecoderLayerCache` keeps both: a
:class:`SelfAttentionCache` that grows by one column per step and a
:class:`CrossAttentionCache` projected once. :class:`~aiayn.model.transformer.DecoderState`
holds one per layer, with the positions of the rows.

Shapes: B target rows, h heads, L cached target positions, S source positions, d_k
features per head; the encoder-decoder keys/values have one row per ``group`` (G) target
rows (the beams of one sentence share them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

# Self-attention caches grow by this many columns at a time: most steps then write their
# keys into memory that is already there, instead of a fresh allocation per step, whose
# first touch costs a page fault per 4 KiB (it was 20% of a beam search; BENCHMARKS.md).
_GROW = 32


class _Buffers:
    """The memory behind one cached tensor (keys or values): ``current``, the buffer the
    cached tensor is a view of, with room for more columns, and ``spare``, the one before,
    which the next reorder gathers into (so that, once grown, no step allocates). Either
    may hold more rows than the view: rows only leave a search."""

    __slots__ = ("current", "spare")

    def __init__(self) -> None:
        self.current: Tensor | None = None
        self.spare: Tensor | None = None

    def append(self, cached: Tensor, new: Tensor, order: Tensor | None) -> Tensor:
        """``cached [B', h, L, d_k]`` (rows ``order [B]`` of it, when given) then ``new [B,
        h, T, d_k]`` along the time axis: ``[B, h, L + T, d_k]``, a view of ``current``."""
        B, h, T, d_k = new.shape
        L = cached.size(2)
        buf = self.current
        if order is None and buf is not None and _fits(buf, B, L + T) and _is_prefix(cached, buf):
            dst = buf  # append in place: the cached columns are where they should be
        else:  # copy (or gather, in the new row order) into the spare buffer; they swap
            spare = self.spare
            if spare is None or not _fits(spare, B, L + T):
                spare = new.new_empty(B, h, L + T + _GROW, d_k)
            dst = spare
            if order is None:
                dst[:B, :, :L] = cached
            else:  # the pending reorder, applied in the copy the append needs anyway
                torch.index_select(cached, 0, order, out=dst[:B, :, :L])
            self.current, self.spare = dst, buf
        dst[:B, :, L : L + T] = new
        return dst[:B, :, : L + T]


def _fits(buf: Tensor, rows: int, columns: int) -> bool:
    return buf.size(0) >= rows and buf.size(2) >= columns


def _is_prefix(view: Tensor, buf: Tensor) -> bool:
    """Is ``view`` the first rows and columns of ``buf``?"""
    return view.data_ptr() == buf.data_ptr() and view.stride() == buf.stride()


class SelfAttentionCache:
    """One decoder layer's masked self-attention over the target positions fed so far:
    their ``keys`` and ``values [B', h, L, d_k]``, and ``order [B]`` (or None), a pending
    reselection of their rows (beam parents, rows leaving).

    :meth:`append` applies the pending order and returns the keys and values of the earlier
    positions then the new ones. For speed they are views of buffers with room for
    ``_GROW`` more columns: a step without a reorder writes only its own columns, in place;
    a reorder gathers the rows into a second buffer kept from before, and the two swap
    roles. A reorder is left pending rather than applied at once, so that the gather and the
    append's copy are one copy of the cache per step, not two.
    """

    __slots__ = ("_key_buffers", "_value_buffers", "keys", "order", "values")

    def __init__(self, keys: Tensor, values: Tensor) -> None:
        self.keys, self.values = keys, values
        self.order: Tensor | None = None
        self._key_buffers, self._value_buffers = _Buffers(), _Buffers()

    @property
    def rows(self) -> int:
        """B: the rows once the pending order is applied."""
        return len(self.order) if self.order is not None else self.keys.size(0)

    @property
    def key_buffer(self) -> Tensor | None:
        """The buffer ``keys`` is a view of (None before the first step or after a join)."""
        return self._key_buffers.current

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys and values ``[B, h, T, d_k]`` of T new positions; returns all keys
        and values ``[B, h, L + T, d_k]`` (also the new ``keys`` and ``values``)."""
        order, self.order = self.order, None
        self.keys = self._key_buffers.append(self.keys, k, order)
        self.values = self._value_buffers.append(self.values, v, order)
        return self.keys, self.values

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index [B'']`` (in that order), at the next :meth:`append`."""
        self.order = self.order[index] if self.order is not None else index

    def join(self, other: SelfAttentionCache, width: int) -> None:
        """Append the rows of ``other``, each cache (its pending order applied) left-padded
        to ``width`` columns with zeros (key columns the state's mask hides)."""
        orders = self.order, other.order
        self.order = None
        self._key_buffers, self._value_buffers = _Buffers(), _Buffers()  # the old rows
        self.keys = _stack([self.keys, other.keys], orders, width, left=True)
        self.values = _stack([self.values, other.values], orders, width, left=True)

    def crop(self, first: int) -> None:
        """Drop the columns before ``first`` (no row attends to them any more)."""
        self.keys, self.values = self.keys[:, :, first:], self.values[:, :, first:]


class CrossAttentionCache:
    """One decoder layer's encoder-decoder attention: the ``keys`` and ``values [B/G, h, S,
    d_k]`` projected from the memory (memory W^K, memory W^V) once, then read by every
    step. Row r serves target rows r*G..r*G+G-1, without G copies of it."""

    __slots__ = ("keys", "values")

    def __init__(self, keys: Tensor, values: Tensor) -> None:
        self.keys, self.values = keys, values

    def select(self, rows: Tensor) -> None:
        """Keep source rows ``rows`` (in that order)."""
        self.keys, self.values = self.keys.index_select(0, rows), self.values.index_select(0, rows)

    def join(self, other: CrossAttentionCache) -> None:
        """Append the rows of ``other``, both right-padded with zeros to the longer source
        (pad the source ids alike: the padding mask hides them)."""
        size = max(self.keys.size(2), other.keys.size(2))
        orders = None, None
        self.keys = _stack([self.keys, other.keys], orders, size, left=False)
        self.values = _stack([self.values, other.values], orders, size, left=False)

    def crop(self, src_len: int) -> None:
        """Drop the source positions from ``src_len`` on (crop the source ids alike)."""
        self.keys, self.values = self.keys[:, :, :src_len], self.values[:, :, :src_len]


class DecoderLayerCache:
    """The two caches of one :class:`~aiayn.model.layers.DecoderLayer`, named as its
    attention sub-layers: ``self_attn`` and ``cross_attn``."""

    __slots__ = ("cross_attn", "self_attn")

    def __init__(self, self_attn: SelfAttentionCache, cross_attn: CrossAttentionCache) -> None:
        self.self_attn, self.cross_attn = self_attn, cross_attn

    def reorder(self, index: Tensor, sources: Tensor | None) -> None:
        """Keep target rows ``index`` and, unless ``sources`` is None, source rows
        ``sources`` of the encoder-decoder keys/values."""
        self.self_attn.reorder(index)
        if sources is not None:
            self.cross_attn.select(sources)

    def join(self, other: DecoderLayerCache, width: int) -> None:
        """Append the rows of ``other``; target keys left-padded to ``width`` columns."""
        self.self_attn.join(other.self_attn, width)
        self.cross_attn.join(other.cross_attn)

    def crop(self, first: int, src_len: int) -> None:
        """Drop target columns before ``first`` and source positions from ``src_len`` on."""
        self.self_attn.crop(first)
        self.cross_attn.crop(src_len)


def _stack(parts: list[Tensor], orders: Sequence[Tensor | None], size: int, left: bool) -> Tensor:
    """Rows of ``parts`` (each ``[B_i, h, L_i, d_k]``, taken in ``orders[i]`` when given)
    one after the other in a ``[sum B_i, h, size, d_k]`` tensor, each zero-padded to
    ``size`` columns on the left or the right: written once, with no intermediate copy."""
    rows = [len(o) if o is not None else t.size(0) for t, o in zip(parts, orders)]
    _, h, _, d_k = parts[0].shape
    out = parts[0].new_empty(sum(rows), h, size, d_k)
    start = 0
    for t, order, n in zip(parts, orders, rows):
        L = t.size(2)
        block = out[start : start + n]
        dst = block[:, :, size - L :] if left else block[:, :, :L]
        (block[:, :, : size - L] if left else block[:, :, L:]).zero_()  # masked columns
        if order is None:
            dst.copy_(t)
        else:
            torch.index_select(t, 0, order, out=dst)
        start += n
    return out
