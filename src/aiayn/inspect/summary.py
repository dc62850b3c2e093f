"""A torchinfo-style layer table: every module with its output shape and parameter count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.decode.core import inference
from aiayn.errors import AiaynError
from aiayn.model.transformer import Transformer

DEFAULT_LEN = 16  # the lengths of the pass, cut to the model's max_len


def _shape(output: object) -> str:
    if isinstance(output, Tensor):
        return str(list(output.shape))
    if isinstance(output, tuple) and output and isinstance(output[0], Tensor):
        return str(list(output[0].shape))
    return "--"


def summary(
    model: Transformer, src_len: int | None = None, tgt_len: int | None = None, depth: int = 3
) -> str:
    """Table of modules down to ``depth`` for one forward pass (eval mode, no autograd) on
    a [1, src_len] source and a [1, tgt_len] target, built on the model's device; each
    length is 16 unless given, or the model's max_len when that is shorter. Shared (tied)
    parameters are counted once, where first met; a module row counts its own parameters
    and those of everything below it."""
    max_len = model.cfg.max_len
    src_len = min(DEFAULT_LEN, max_len) if src_len is None else src_len
    tgt_len = min(DEFAULT_LEN, max_len) if tgt_len is None else tgt_len
    for name, value in (("src_len", src_len), ("tgt_len", tgt_len), ("depth", depth)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise AiaynError(f"summary: {name} must be an integer >= 1, got {value!r}")
    for name, value in (("src_len", src_len), ("tgt_len", tgt_len)):
        if value > max_len:
            raise AiaynError(
                f"summary: {name} {value} is longer than the model's max_len={max_len}"
            )
    shapes: dict[str, str] = {}

    def record(name: str) -> Callable[[nn.Module, Any, Any], None]:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:  # None: output as is
            shapes.setdefault(name, _shape(output))

        return hook

    hooks = []
    for name, module in model.named_modules():
        if name and name.count(".") < depth:
            hooks.append(module.register_forward_hook(record(name)))
    cfg, device = model.cfg, model.src_embed.weight.device
    src = torch.full((1, src_len), 4 % cfg.src_vocab_size, dtype=torch.long, device=device)
    tgt = torch.full((1, tgt_len), 4 % cfg.tgt_vocab_size, dtype=torch.long, device=device)
    try:
        with inference(model):  # each module's training flag comes back as it was
            logits = model(src, tgt)
    finally:
        for hook in hooks:
            hook.remove()

    owner: dict[str, int] = {}  # module name -> parameters first counted under it
    for name, param in model.named_parameters():  # named_parameters skips shared duplicates
        parts = name.split(".")[:-1]
        for k in range(len(parts) + 1):
            prefix = ".".join(parts[:k])
            owner[prefix] = owner.get(prefix, 0) + param.numel()

    rows = [("Layer (type)", "Output Shape", "Param #")]
    for name, module in model.named_modules():
        if not name or name.count(".") >= depth:
            continue
        indent = "  " * name.count(".")
        label = f"{indent}{name.rsplit('.', 1)[-1]} ({type(module).__name__})"
        rows.append((label, shapes.get(name, "--"), f"{owner.get(name, 0):,}"))
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    line = "=" * (sum(width) + 4)
    table = [f"{a:<{width[0]}}  {b:<{width[1]}}  {c:>{width[2]}}" for a, b, c in rows]
    out = [line, table[0], line, *table[1:]]
    total = owner.get("", 0)
    size_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    out += [
        line,
        f"Total params: {total:,} ({total / 1e6:.1f}M)",
        f"Trainable params: {model.num_parameters():,}",
        f"Params size (MB): {size_mb:.1f}",
        f"Output: logits {list(logits.shape)}",
        line,
    ]
    return "\n".join(out)
