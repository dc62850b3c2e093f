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

import torch
from torch import nn

from aiayn.model.transformer import Transformer


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
        raise ValueError(
            "int8 quantization needs torch.ao.quantization, which this torch lacks"
        ) from None
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError("int8 dynamic quantization runs on the CPU only; load with device=cpu")
    model = copy.deepcopy(model).eval()
    for layer in model.decoder.layers:
        # Encoder-decoder attention projects queries and memory through different row blocks
        # of in_proj; give each block its own Linear so both can be quantized.
        layer.cross_attn.split_in_proj()
    if model.out_proj is None:  # tied: logits = x E^T, through an int8 copy of E
        out_proj = nn.Linear(model.cfg.d_model, model.cfg.tgt_vocab_size, bias=False)
        with torch.no_grad():
            out_proj.weight.copy_(model.tgt_embed.weight)
        model.out_proj = out_proj
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantiz.*deprecated", category=UserWarning)
        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)


def is_quantized(model: nn.Module) -> bool:
    """True if no float ``nn.Linear`` is left in ``model`` (all were quantized)."""
    return not any(type(m) is nn.Linear for m in model.modules())
