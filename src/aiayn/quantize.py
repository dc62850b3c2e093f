"""int8 dynamic quantization of a trained model, for faster CPU inference.

Dynamic quantization stores every ``nn.Linear`` weight as int8 (one scale per matrix) and
quantizes activations on the fly, per batch; LayerNorm, embeddings, softmax and the
residual path stay float32. It needs no calibration data. Translations are usually, not
always, identical to the float model's (tests/test_quantize.py checks how close).

Uses ``torch.ao.quantization.quantize_dynamic``: deprecated in recent torch in favour of
torchao, but present and fast on CPU (fbgemm / x86 kernels) in the pinned torch.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from aiayn.errors import AiaynError
from aiayn.model.attention import MultiHeadAttention
from aiayn.model.layers import DecoderLayer
from aiayn.model.transformer import Transformer


class SplitCrossAttention(MultiHeadAttention):
    """Encoder-decoder attention whose W^Q and [W^K; W^V] are two ``nn.Linear`` layers.

    The fused ``in_proj`` projects queries and memory through different row blocks, and a
    quantized Linear cannot be sliced; two whole layers can each be quantized. Same results
    as the fused module it was built from; its state_dict keys differ, so it is for
    inference only.
    """

    def __init__(self, fused: MultiHeadAttention):
        super().__init__(fused.d_model, fused.n_heads, fused.attention_dropout)
        d = self.d_model
        w, b = fused.in_proj.weight.detach(), fused.in_proj.bias.detach()
        del self.in_proj
        self.q_proj, self.kv_proj = nn.Linear(d, d), nn.Linear(d, 2 * d)
        with torch.no_grad():
            self.q_proj.weight.copy_(w[:d])
            self.q_proj.bias.copy_(b[:d])
            self.kv_proj.weight.copy_(w[d:])
            self.kv_proj.bias.copy_(b[d:])
        self.out_proj = fused.out_proj
        self.to(w.device)

    def _cross_projections(self) -> tuple[Callable, Callable]:
        return self.q_proj, self.kv_proj


def quantize_dynamic_int8(model: Transformer) -> Transformer:
    """An int8-quantized copy of ``model`` (in eval mode, on the CPU); ``model`` is unchanged.

    Quantized: every attention projection, both feed-forward layers and the pre-softmax
    projection (when tied to the target embedding it gets its own int8 copy; the embedding
    itself stays float). The copy is for inference only: its state_dict differs from a
    checkpoint's.
    """
    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError:  # pragma: no cover - a future torch without it
        raise AiaynError(
            "int8 quantization needs torch.ao.quantization, which this torch lacks"
        ) from None
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise AiaynError("int8 dynamic quantization runs on the CPU only; load on the cpu")
    if other := {str(p.dtype) for p in model.parameters() if p.dtype != torch.float32}:
        # torch quantizes them, then fails at the first forward ("expected scalar type Float")
        raise AiaynError(f"int8 quantization takes a float32 model, not {', '.join(other)}")
    model = copy.deepcopy(model).eval()
    for layer in cast("list[DecoderLayer]", model.decoder.layers):  # an nn.ModuleList
        layer.cross_attn = SplitCrossAttention(layer.cross_attn)
    if model.out_proj is None:  # tied: logits = x E^T, through an int8 copy of E
        out_proj = nn.Linear(model.cfg.d_model, model.cfg.tgt_vocab_size, bias=False)
        with torch.no_grad():
            out_proj.weight.copy_(model.tgt_embed.weight)
        model.out_proj = out_proj
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantiz.*deprecated", category=UserWarning)
        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)


def parameter_count(model: Transformer) -> int:
    """``model``'s parameters as :meth:`Transformer.num_parameters` counts them, also for an
    int8 copy (:func:`quantize_dynamic_int8`), whose quantized layers hold their weights
    packed, not as parameters, and whose tied output table is a copy of the embedding."""
    from torch.ao.nn.quantized.dynamic import Linear as QuantizedLinear

    count = model.num_parameters()
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            bias = module.bias()
            count += module.weight().numel() + (bias.numel() if bias is not None else 0)
    out_proj: nn.Module | None = model.out_proj  # an nn.Linear, or its int8 copy
    if model.cfg.tie_output and isinstance(out_proj, QuantizedLinear):
        count -= out_proj.weight().numel()  # the embedding's copy, counted already
    return count


def is_quantized(model: nn.Module) -> bool:
    """True if no float ``nn.Linear`` is left in ``model`` (all were quantized)."""
    return not any(type(m) is nn.Linear for m in model.modules())
