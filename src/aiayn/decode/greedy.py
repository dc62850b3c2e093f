"""Greedy autoregressive decoding with a key/value cache (Section 6.1 uses beam search;
greedy is its beam size 1)."""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.model.transformer import DecoderState, Transformer


def greedy(
    model: Transformer,
    src: Tensor,
    max_new_tokens: int | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Decode every sentence of ``src [B, S]`` at once, taking the argmax token each step.

    PAD and BOS are never produced. Returns a LongTensor ``[B, L]`` of generated ids: no
    BOS, the EOS kept where reached, ``pad_id`` after it; ``L`` is the longest output (at
    most ``max_new_tokens``, default S + 50, and never past the model's ``max_len``
    positions). Sentences that reach EOS leave the batch, so no work is spent on them.
    ``use_cache=False`` recomputes the whole prefix every step (the slow reference the
    cache is tested against).
    """
    cfg = model.cfg
    if max_new_tokens is None:
        max_new_tokens = src.size(1) + 50
    max_new_tokens = max(0, min(max_new_tokens, cfg.max_len))
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            return _greedy(model, src, max_new_tokens, use_cache)
    finally:
        model.train(was_training)


def _greedy(model: Transformer, src: Tensor, steps: int, use_cache: bool) -> Tensor:
    cfg = model.cfg
    B = src.size(0)
    memory = model.encode(src)  # [B, S, d_model]
    out = torch.full((B, steps), cfg.pad_id, dtype=torch.long, device=src.device)
    alive = torch.arange(B, device=src.device)  # original row of each decoding row
    prefix = torch.full((B, 1), cfg.bos_id, dtype=torch.long, device=src.device)
    state = DecoderState() if use_cache else None
    banned = torch.tensor([cfg.pad_id, cfg.bos_id], device=src.device)  # never valid outputs
    length = 0
    for t in range(steps):
        if state is not None:
            logits = model.decode(prefix[:, -1:], memory, src, state)[:, -1]  # [B', V]
        else:
            logits = model.decode(prefix, memory, src)[:, -1]
        logits.index_fill_(1, banned, float("-inf"))
        token = logits.argmax(dim=-1)  # [B']
        out[alive, t] = token
        length = t + 1
        running = token != cfg.eos_id
        if not bool(running.all()):
            keep = running.nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            alive, memory, src, token = alive[keep], memory[keep], src[keep], token[keep]
            prefix = prefix[keep]
            if state is not None:
                state.reorder(keep)
        prefix = torch.cat([prefix, token[:, None]], dim=1)
    return out[:, :length]
