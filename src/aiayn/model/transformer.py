"""Encoder, Decoder and the full encoder-decoder Transformer (Section 3, Figure 1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import TransformerConfig
from aiayn.errors import ConfigError, ModelInputError
from aiayn.model import projection
from aiayn.model.cache import CrossAttentionCache, DecoderLayerCache, SelfAttentionCache
from aiayn.model.embedding import PositionalEncoding, TokenEmbedding, rebuild_tables
from aiayn.model.inputs import check_group, check_ids, check_memory
from aiayn.model.layers import DecoderLayer, EncoderLayer
from aiayn.model.masks import decoder_self_mask, padding_mask


@dataclass
class DecoderState:
    """Incremental-decoding state (fairseq-style): per decoder layer, a
    :class:`~aiayn.model.cache.DecoderLayerCache` of the self-attention keys/values of the
    steps so far and the encoder-decoder keys/values.

    ``offset`` is the number of target positions already fed (cached key columns).
    ``reorder`` selects rows (beam parents, dropping finished sentences), :meth:`join`
    appends another state's rows (continuous batching), :meth:`crop` drops unused columns.

    While every row started at the same step, all sit at position ``offset`` and see every
    cached key. Rows that join at another step make the state *padded*: row b's next
    position is ``positions[b]`` and its cached keys are the columns where ``keys [B,
    offset]`` is True (a late row is left-padded with masked columns, so every step still
    appends one column for all rows); a padded state takes one step at a time. The
    encoder-decoder keys/values (like the memory and source passed to ``decode``) hold one
    row per ``group`` target rows: the beams of one sentence share them.
    """

    layers: list[DecoderLayerCache] = field(default_factory=list)
    offset: int = 0
    positions: Tensor | None = None  # [B] padded only: each row's next target position
    keys: Tensor | None = None  # [B, offset] padded only: True at the row's real keys
    group: int = 1  # target rows per source row

    def advance(self, tgt_in: Tensor) -> tuple[int | Tensor, Tensor | None]:
        """Count the T new steps ``tgt_in [B, T]`` (only its shape and device are read) as
        fed, before the decoder appends their keys to every layer's cache (a failure there
        leaves the state unusable). Returns their positions (an int, the first step's,
        shared by all rows; ``[B]`` per row when padded) and their self-attention mask over
        the cached and new keys, True where a query may attend: None for one step of an
        unpadded state, causal ``[1, 1, T, offset + T]`` for several, ``[B, 1, 1, offset +
        1]`` (each row's own keys) when padded."""
        rows, steps = tgt_in.shape
        offset, positions, keys = self.offset, self.positions, self.keys
        if positions is not None and keys is not None:  # padded: each row at its own place
            if steps != 1:  # the mask below is one query's
                raise ModelInputError(f"a padded state takes one step at a time, got {steps}")
            self.keys = torch.cat([keys, keys.new_ones(rows, 1)], dim=1)  # the new key is real
            self.positions, self.offset = positions + 1, offset + 1
            return positions, self.keys[:, None, None, :]
        self.offset = offset + steps
        if steps == 1:  # one query, the latest position: it may see every key
            return offset, None
        # Several new steps: each sees the cached keys and the new ones up to its own.
        q_pos = torch.arange(offset, offset + steps, device=tgt_in.device)
        k_pos = torch.arange(offset + steps, device=tgt_in.device)
        return offset, (k_pos[None, :] <= q_pos[:, None])[None, None]

    def reorder(self, index: Tensor, sources: Tensor | None = None, cross: bool = True) -> None:
        """Keep batch rows ``index [B']`` (in that order) of every cached tensor. With
        ``group > 1`` the encoder-decoder keys/values keep the source rows ``sources``
        instead (None: all of them, right when ``index`` only moves beams within their
        sentences). ``cross=False`` leaves the encoder-decoder keys/values as they are:
        right when every row of them is its sentence's memory repeated and ``index`` only
        moves rows within their sentences (beam reselection), which saves copying them
        every step. The self-attention rows' order is left pending: the next step gathers
        them as it appends its keys (one copy of the cache per step, not two).
        """
        sources = index if self.group == 1 else sources  # a source row per target row
        for layer in self.layers:
            layer.reorder(index, sources if cross else None)
        if self.positions is not None and self.keys is not None:
            self.positions, self.keys = self.positions[index], self.keys[index]

    def _padding(self) -> tuple[Tensor, Tensor]:
        """``(positions, keys)``, made up for a state that is not padded."""
        if self.positions is not None and self.keys is not None:
            return self.positions, self.keys
        if not self.layers:
            raise ModelInputError("an empty DecoderState (see Transformer.start_state)")
        cache = self.layers[0].self_attn
        rows, device = cache.rows, cache.keys.device
        positions = torch.full((rows,), self.offset, dtype=torch.long, device=device)
        return positions, torch.ones(rows, self.offset, dtype=torch.bool, device=device)

    def join(self, other: DecoderState) -> None:
        """Append the rows of ``other`` (of the same group size). Self-attention caches are
        left-padded to the longer one with masked columns; encoder-decoder keys/values are
        right-padded along the source (pad the source ids alike: the mask hides them)."""
        if self.group != other.group:
            raise ModelInputError("only states of one group size can be joined")
        count, joining = len(self.layers), len(other.layers)  # a bare DecoderState(): 0
        if joining != count:
            raise ModelInputError(f"a state of {joining} layers cannot join one of {count}")
        width = max(self.offset, other.offset)
        aligned = self.keys is None and other.keys is None and self.offset == other.offset
        padding = None if aligned else (self._padding(), other._padding())
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            mine.join(theirs, width)
        if padding is not None:
            (my_positions, my_keys), (their_positions, their_keys) = padding
            self.keys = torch.cat(
                [F.pad(k, (width - k.size(1), 0), value=False) for k in (my_keys, their_keys)]
            )
            self.positions = torch.cat([my_positions, their_positions])
        self.offset = width

    def crop(self, src_len: int) -> None:
        """Drop the key columns no row uses any more (then maybe no longer padded) and the
        encoder-decoder keys/values past ``src_len`` (crop the source ids alike)."""
        first = 0
        if self.keys is not None:
            used = self.keys.any(dim=0)
            first = int(used.int().argmax()) if bool(used.any()) else self.offset
        for layer in self.layers:
            layer.crop(first, src_len)
        if self.keys is not None:
            self.keys, self.offset = self.keys[:, first:], self.offset - first
            if bool(self.keys.all()):
                self.positions = self.keys = None


class Encoder(nn.Module):
    """N identical layers over the embedded source (Section 3.1)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        # Pre-LN leaves the last residual sum un-normalised, so the stack ends with one.
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else None

    def forward(self, x: Tensor, src_mask: Tensor, weights: list[Tensor] | None = None) -> Tensor:
        """x ``[B, S, d_model]`` -> memory ``[B, S, d_model]``; appends per-layer attention
        weights ``[B, h, S, S]`` to ``weights`` when a list is given."""
        for layer in self.layers:
            x, w = layer(x, src_mask, need_weights=weights is not None)
            if weights is not None:
                weights.append(w)
        return self.norm(x) if self.norm is not None else x


class Decoder(nn.Module):
    """N identical layers of masked self-attention, cross-attention and FFN (Section 3.1)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else None

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None,
        cross_mask: Tensor,
        state: DecoderState | None = None,
        weights: dict[str, list[Tensor]] | None = None,
    ) -> Tensor:
        """x ``[B, T, d_model]``, memory ``[B, S, d_model]`` -> ``[B, T, d_model]``."""
        if state is not None and not state.layers:  # a bare DecoderState(): its first step
            state.layers = self.start(memory, state.group)
        for i, layer in enumerate(self.layers):
            cache = state.layers[i] if state is not None else None
            x, self_w, cross_w = layer(
                x, memory, self_mask, cross_mask, cache, need_weights=weights is not None
            )
            if weights is not None:
                weights["decoder_self"].append(self_w)
                weights["cross"].append(cross_w)
        return self.norm(x) if self.norm is not None else x

    def start(self, memory: Tensor, group: int = 1) -> list[DecoderLayerCache]:
        """Per layer, the caches of ``group`` target rows per row of ``memory [B, S,
        d_model]`` before their first step: encoder-decoder keys/values projected once per
        source row, no self-attention keys yet (``[B * group, h, 0, d_k]``)."""
        rows, caches = memory.size(0) * group, []
        for layer in cast("list[DecoderLayer]", self.layers):  # an nn.ModuleList
            k, v = layer.cross_attn.memory_kv(memory)
            empty = k.new_zeros(rows, k.size(1), 0, k.size(3))
            caches.append(
                DecoderLayerCache(SelfAttentionCache(empty, empty), CrossAttentionCache(k, v))
            )
        return caches


class Transformer(nn.Module):
    """The encoder-decoder Transformer of "Attention Is All You Need".

    ``model(src [B, S], tgt_in [B, T]) -> logits [B, T, tgt_vocab_size]`` where both inputs
    are LongTensors right-padded with ``cfg.pad_id`` and ``tgt_in`` starts with BOS (teacher
    forcing). Logits at real positions do not depend on padding, and position t never sees
    target tokens after t.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        if not isinstance(cfg, TransformerConfig):  # a dict would fail at its first field
            raise _not_a_config(cfg)
        self.cfg = cfg
        scale = cfg.scale_embeddings
        self.src_embed = TokenEmbedding(cfg.src_vocab_size, cfg.d_model, cfg.pad_id, scale)
        self.tgt_embed = (
            self.src_embed
            if cfg.share_embeddings
            else TokenEmbedding(cfg.tgt_vocab_size, cfg.d_model, cfg.pad_id, scale)
        )
        positions = (cfg.d_model, cfg.max_len, cfg.dropout, cfg.learned_positions)
        self.src_pos, self.tgt_pos = PositionalEncoding(*positions), PositionalEncoding(*positions)
        self.register_load_state_dict_post_hook(rebuild_tables)  # a state dict has no tables
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        # Section 3.4: the pre-softmax projection shares the target embedding matrix.
        self.out_proj = (
            None if cfg.tie_output else nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        )
        # Marian's final_logits_bias: one more logit term per target token (not the paper's).
        self.out_bias = nn.Parameter(torch.zeros(cfg.tgt_vocab_size)) if cfg.output_bias else None

    # -- the three entry points ------------------------------------------------------------
    def encode(self, src: Tensor, weights: list[Tensor] | None = None) -> Tensor:
        """src ``[B, S]`` -> memory ``[B, S, d_model]``."""
        device = self.src_embed.weight.device
        check_ids("src", src, self.cfg.src_vocab_size, self.cfg.max_len, device=device)
        src_mask = padding_mask(src, self.cfg.pad_id)  # [B, 1, 1, S]
        return self.encoder(self.src_pos(self.src_embed(src)), src_mask, weights)

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src: Tensor,
        state: DecoderState | None = None,
        weights: dict[str, list[Tensor]] | None = None,
        project: bool = True,
    ) -> Tensor:
        """tgt_in ``[B, T]``, memory ``[B, S, d_model]``, src ``[B, S]`` -> logits
        ``[B, T, tgt_vocab_size]`` (or, with ``project=False``, the decoder output
        ``[B, T, d_model]``, so a trainer can project only the non-pad positions).

        With a :class:`DecoderState`, ``tgt_in`` holds only the new steps (usually one)
        and the state is extended; the logits equal those of a full recomputation. Token
        ids are range-checked on a state's first step only: later steps feed the decoder's
        own outputs, and checking them would synchronise a GPU at every step.
        """
        if state is not None and not isinstance(state, DecoderState):
            raise ModelInputError(f"state must be a DecoderState, got {type(state).__name__}")
        offset = state.offset if state is not None else 0
        padded = state is not None and state.positions is not None  # rows at their own steps
        weight, max_len = self.tgt_embed.weight, self.cfg.max_len  # device, dtype: no sync
        device = weight.device
        check_ids("tgt_in", tgt_in, self.cfg.tgt_vocab_size, max_len, offset == 0, device)
        if not padded and offset + tgt_in.size(1) > max_len:  # ints only: no synchronisation
            raise ModelInputError(
                f"the state holds {offset} positions and tgt_in adds {tgt_in.size(1)}: "
                f"past max_len={max_len}"
            )
        check_ids("src", src, self.cfg.src_vocab_size, self.cfg.max_len, False, device)
        check_memory(memory, self.cfg.d_model, device, weight.dtype)
        group = state.group if state is not None else 1  # target rows per source row
        rows = tgt_in.size(0)
        if memory.size(0) * group != rows or src.size(0) * group != rows:
            raise ModelInputError(
                f"batch sizes differ: tgt_in {tuple(tgt_in.shape)}, memory "
                f"{tuple(memory.shape)}, src {tuple(src.shape)}"
                + (f" ({group} target rows per source row)" if group > 1 else "")
            )
        if state is not None and state.layers:
            _check_state_rows(state, rows)
        if memory.size(1) != src.size(1):
            raise ModelInputError(
                f"memory covers {memory.size(1)} source positions but src has {src.size(1)}"
            )
        positions: int | Tensor
        self_mask: Tensor | None
        if state is None:  # all T steps at once: causal, and pad keys masked
            positions, self_mask = 0, decoder_self_mask(tgt_in, self.cfg.pad_id)
        else:  # the new steps after the cached ones
            positions, self_mask = state.advance(tgt_in)
        x = self.tgt_pos(self.tgt_embed(tgt_in), offset=positions)
        x = self.decoder(x, memory, self_mask, padding_mask(src, self.cfg.pad_id), state, weights)
        return self.project(x) if project else x

    def start_state(self, memory: Tensor, group: int = 1) -> DecoderState:
        """A :class:`DecoderState` for ``group`` target rows per source of ``memory
        [B, S, d_model]`` (B * group rows: the beams of each sentence, side by side), about
        to take their first step: encoder-decoder keys/values projected once per source,
        no self-attention keys yet. :meth:`DecoderState.join` adds it to a running batch."""
        weight = self.tgt_embed.weight
        check_memory(memory, self.cfg.d_model, weight.device, weight.dtype)
        check_group(group)
        return DecoderState(self.decoder.start(memory, group), 0, group=group)

    def projection_buffers(self, x: Tensor) -> int:
        """How many ``[n, tgt_vocab_size]`` buffers :meth:`project` writes into for a 2-D
        ``x [n, d_model]``: 0 (it allocates its own: an untied or quantized projection, or
        ``x`` not in the weight's dtype, as under autocast, or autograd recording it: an
        out= product has no gradient), 1 (``out``) or 2 (``out`` and ``work``: a CPU that
        forms it blockwise, from 16 rows on). Callers reusing memory allocate only these."""
        weight = self.tgt_embed.weight
        if self.out_proj is not None or x.dim() != 2 or x.dtype != weight.dtype:
            return 0
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return 0
        return 2 if x.size(0) >= 16 and x.device.type == "cpu" and projection.BLOCKED else 1

    def project(self, x: Tensor, out: Tensor | None = None, work: Tensor | None = None) -> Tensor:
        """Decoder output ``[..., d_model]`` -> logits ``[..., tgt_vocab_size]``.

        A decoder reusing memory across steps may pass, for a 2-D ``x [n, d_model]``,
        ``out [n, tgt_vocab_size]`` to receive the logits and ``work`` (a contiguous tensor
        of at least as many elements) as scratch; :meth:`projection_buffers` says which of
        them are used: ``work`` where the CPU forms the product blockwise as ``W x^T``
        (:mod:`aiayn.model.projection`), with bit-identical logits."""
        if self.out_proj is None:  # tied: the bias, if any, added inside the product
            weight, bias = self.tgt_embed.weight, self.out_bias
            uses = self.projection_buffers(x)
            if out is not None and uses and out.dtype == x.dtype:
                if uses == 2 and work is not None:
                    return projection.blocked_product(x, weight, bias, out, work)
                if bias is None:  # what F.linear calls, with an out= argument
                    return torch.mm(x, weight.t(), out=out)
                return torch.addmm(bias, x, weight.t(), out=out)
            return F.linear(x, weight, bias)
        logits = self.out_proj(x)  # a module: int8 quantization may replace it
        return logits if self.out_bias is None else logits + self.out_bias

    def forward(self, src: Tensor, tgt_in: Tensor, project: bool = True) -> Tensor:
        """Teacher-forced logits ``[B, T, tgt_vocab]`` for src ``[B, S]``, tgt_in ``[B, T]``
        (decoder output ``[B, T, d_model]`` with ``project=False``)."""
        _check_pair(src, tgt_in)
        return self.decode(tgt_in, self.encode(src), src, project=project)

    def forward_with_attention(
        self, src: Tensor, tgt_in: Tensor
    ) -> tuple[Tensor, dict[str, list[Tensor]]]:
        """Logits plus every layer's attention weights, for inspection.

        Returns ``{"encoder": [B, h, S, S] per layer, "decoder_self": [B, h, T, T] per layer,
        "cross": [B, h, T, S] per layer}``.
        """
        _check_pair(src, tgt_in)
        weights: dict[str, list[Tensor]] = {"encoder": [], "decoder_self": [], "cross": []}
        memory = self.encode(src, weights["encoder"])
        return self.decode(tgt_in, memory, src, weights=weights), weights

    def num_parameters(self) -> int:
        """Trainable parameters, counting shared (tied) tables once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def _not_a_config(cfg: object) -> ConfigError:
    hint = "; make one with TransformerConfig.from_dict" if isinstance(cfg, dict) else ""
    return ConfigError(f"cfg must be a TransformerConfig, got {type(cfg).__name__}{hint}")


def _check_pair(src: object, tgt_in: object) -> None:
    """Before the encoder runs: ModelInputError when ``src`` and ``tgt_in`` (each checked
    fully later, src against the model's device) are batches of different sizes or on
    different devices. A tensor that is not 2-D is left to those checks, which name it."""
    if not (isinstance(src, Tensor) and isinstance(tgt_in, Tensor)):
        return
    if tgt_in.device != src.device:
        raise ModelInputError(
            f"tgt_in is on device {tgt_in.device} but src is on {src.device}; move one of them"
        )
    if src.dim() == tgt_in.dim() == 2 and src.size(0) != tgt_in.size(0):
        raise ModelInputError(
            f"batch sizes differ: src has {src.size(0)} rows, tgt_in {tgt_in.size(0)}"
        )


def _check_state_rows(state: DecoderState, rows: int) -> None:
    """ModelInputError unless ``state`` (its caches begun) holds ``rows`` target rows, and
    one encoder-decoder row per ``state.group`` of them: the rows it was started (or last
    reordered) for. Sizes only: nothing is synchronised."""
    cache = state.layers[0]
    held, sources = cache.self_attn.rows, cache.cross_attn.keys.size(0)
    if held != rows:
        raise ModelInputError(
            f"state holds {held} target rows but tgt_in has {rows}; start a state for these "
            "rows (Transformer.start_state) or reorder it to them"
        )
    if sources * state.group != rows:
        raise ModelInputError(
            f"state holds the encoder-decoder keys of {sources} source rows, {state.group} "
            f"target rows each, but tgt_in has {rows} rows"
        )
