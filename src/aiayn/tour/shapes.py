"""The shapes of one sentence pair flowing through the model (tour page 0, and the
annotated Figure 1 that ``make figures`` draws from the same trace)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

import aiayn.model.attention as attention_module
from aiayn.errors import AiaynError
from aiayn.model.layers import DecoderLayer, EncoderLayer
from aiayn.model.transformer import Transformer
from aiayn.tour.report import evaluating


@dataclass
class Stage:
    key: str  # stable name, used by the figure to place the annotation
    what: str  # what the tensor is, in the paper's words
    shape: tuple[int, ...]


# key -> description, in the order the tensors are computed
STAGES = {
    "src": "source token ids",
    "src_embed": "source embeddings x sqrt(d_model)",
    "src_pos": "+ positional encoding",
    "enc_q": "encoder self-attention: Q (K, V alike) split into heads",
    "enc_weights": "encoder self-attention weights",
    "enc_attn": "heads concatenated, times W^O",
    "enc_ffn_inner": "feed-forward inner layer, ReLU(x W_1 + b_1)",
    "enc_layer": "encoder layer output (after Add & Norm)",
    "memory": "memory: the encoder output, after N layers",
    "tgt_in": "target token ids, shifted right (BOS first)",
    "tgt_embed": "target embeddings x sqrt(d_model)",
    "tgt_pos": "+ positional encoding",
    "dec_self_q": "masked self-attention: Q (K, V alike) split into heads",
    "dec_self_weights": "masked self-attention weights",
    "dec_cross_q": "encoder-decoder attention: Q from the decoder",
    "dec_cross_k": "encoder-decoder attention: K (V alike) from the memory",
    "dec_cross_weights": "encoder-decoder attention weights",
    "dec_ffn_inner": "feed-forward inner layer",
    "dec_layer": "decoder layer output (after Add & Norm)",
    "logits": "logits: decoder output times E^T (the tied embedding)",
}


@contextmanager
def _recorded_attention(calls: list[tuple[Tensor, Tensor, Tensor | None]]) -> Iterator[None]:
    """Record (q, k, weights) of every scaled_dot_product_attention call of the model."""
    original = attention_module.scaled_dot_product_attention

    def recording(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        dropout_p: float = 0.0,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        out, weights = original(q, k, v, mask, dropout_p, need_weights)
        calls.append((q, k, weights))
        return out, weights

    attention_module.scaled_dot_product_attention = recording
    try:
        yield
    finally:
        attention_module.scaled_dot_product_attention = original


def trace_shapes(model: Transformer, src: Tensor, tgt_in: Tensor) -> list[Stage]:
    """Run ``model.forward_with_attention(src [B, S], tgt_in [B, T])`` once and return the
    shape of every stage of Figure 1 (first layer of each stack: all N are alike), in the
    order computed. Shapes are observed with forward hooks, not derived from the config."""
    seen: dict[str, tuple[int, ...]] = {}
    outputs: list[tuple[str, Any]] = []  # a module's output: a tensor, or a tuple of them

    def watch(module: nn.Module, name: str) -> torch.utils.hooks.RemovableHandle:
        return module.register_forward_hook(lambda m, i, o: outputs.append((name, o)))

    enc = cast(EncoderLayer, model.encoder.layers[0])  # an nn.ModuleList's first
    dec = cast(DecoderLayer, model.decoder.layers[0])
    handles = [
        watch(model.src_embed, "embed"),  # may be tgt_embed too: the order tells them apart
        watch(model.src_pos, "src_pos"),
        watch(model.tgt_pos, "tgt_pos"),
        watch(enc.self_attn, "enc_attn"),
        watch(enc.ffn.w_1, "enc_ffn_inner"),
        watch(enc, "enc_layer"),
        watch(model.encoder, "memory"),
        watch(dec.ffn.w_1, "dec_ffn_inner"),
        watch(dec, "dec_layer"),
    ]
    if model.tgt_embed is not model.src_embed:
        handles.append(watch(model.tgt_embed, "embed"))
    calls: list[tuple[Tensor, Tensor, Tensor | None]] = []
    try:
        with evaluating(model), _recorded_attention(calls):
            logits, _ = model.forward_with_attention(src, tgt_in)
    finally:
        for h in handles:
            h.remove()
    embeds = [o for name, o in outputs if name == "embed"]
    seen["src"], seen["tgt_in"] = tuple(src.shape), tuple(tgt_in.shape)
    seen["src_embed"], seen["tgt_embed"] = tuple(embeds[0].shape), tuple(embeds[-1].shape)
    for name, o in outputs:
        if name != "embed":
            first = o[0] if isinstance(o, tuple) else o
            seen.setdefault(name, tuple(first.shape))
    # Attention calls: N encoder layers, then per decoder layer self then cross.
    n_enc = len(model.encoder.layers)
    (q, _, w), (dq, _, dw), (cq, ck, cw) = calls[0], calls[n_enc], calls[n_enc + 1]
    if w is None or dw is None or cw is None:  # forward_with_attention asks for them all
        raise AiaynError("an attention call returned no weights")
    seen.update(
        enc_q=tuple(q.shape),
        enc_weights=tuple(w.shape),
        dec_self_q=tuple(dq.shape),
        dec_self_weights=tuple(dw.shape),
        dec_cross_q=tuple(cq.shape),
        dec_cross_k=tuple(ck.shape),
        dec_cross_weights=tuple(cw.shape),
        logits=tuple(logits.shape),
    )
    return [Stage(key, what, seen[key]) for key, what in STAGES.items()]
