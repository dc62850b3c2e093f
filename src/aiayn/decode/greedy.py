"""Greedy autoregressive decoding with a key/value cache (Section 6.1 uses beam search;
greedy is its beam size 1)."""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.decode.core import DecodeStep, ban, banned_ids, inference, length_limits
from aiayn.model.transformer import Transformer


def greedy(
    model: Transformer,
    src: Tensor,
    max_new_tokens: int | None = None,
    use_cache: bool = True,
    *,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
) -> Tensor:
    """Decode every sentence of ``src [B, S]`` at once, taking the argmax token each step.

    PAD and BOS are never produced. Returns a LongTensor ``[B, L]`` of generated ids: no
    BOS, the EOS kept where reached, ``pad_id`` after it. Sentence i produces at most
    ``max_len_a * src_len_i + max_len_b`` tokens (default: its real length + 50), at most
    ``max_new_tokens`` when given, and never past the model's ``max_len`` positions; ``L``
    is the longest output. Sentences that reach EOS or their limit leave the batch, so no
    work is spent on them. ``use_cache=False`` recomputes the whole prefix every step (the
    slow reference the cache is tested against).
    """
    limits = length_limits(model.cfg, src, max_new_tokens, max_len_a, max_len_b)
    with inference(model):
        return _greedy(model, src, limits, use_cache)


def _greedy(model: Transformer, src: Tensor, limits: Tensor, use_cache: bool) -> Tensor:
    cfg = model.cfg
    B, device = src.size(0), src.device
    steps = int(limits.max()) if B else 0
    out = torch.full((B, steps), cfg.pad_id, dtype=torch.long, device=device)
    step = DecodeStep(model, src, use_cache)  # encodes (and checks) src even for 0 steps
    alive = torch.arange(B, device=device)  # original row of each decoding row
    prefix = torch.full((B, 1), cfg.bos_id, dtype=torch.long, device=device)
    banned = banned_ids(cfg, device)
    length = 0
    for t in range(steps):
        token = ban(step.logits(prefix), banned).argmax(dim=-1)  # [B']
        out[alive, t] = token
        length = t + 1
        running = (token != cfg.eos_id) & (limits[alive] > t + 1)
        if not bool(running.all()):
            keep = running.nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            alive, token, prefix = alive[keep], token[keep], prefix[keep]
            step.keep(keep)
        prefix = torch.cat([prefix, token[:, None]], dim=1)
    return out[:, :length]
