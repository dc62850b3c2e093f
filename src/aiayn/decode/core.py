"""What greedy and beam search share (Section 6.1): one inference context, one length
rule, one banned-token set and one incremental decode step that drops finished rows.

Like fairseq's and OpenNMT-py's generators, both searches feed the decoder one token per
step through a key/value cache (:class:`~aiayn.model.transformer.DecoderState`), so step t
costs O(t) attention instead of recomputing the whole prefix.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from aiayn.config import TransformerConfig
from aiayn.errors import DecodeError
from aiayn.model.transformer import DecoderState, Transformer


@contextmanager
def inference(model: Transformer) -> Iterator[None]:
    """Eval mode (no dropout) and no autograd for the block; the model's training flag is
    restored afterwards, even if decoding raises."""
    was_training = model.training
    if was_training:  # train()/eval() walk every module: skip them when nothing changes
        model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        if was_training:
            model.train()


def length_limits(
    cfg: TransformerConfig,
    src: Tensor,
    max_new_tokens: int | None = None,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
) -> Tensor:
    """The most tokens (EOS included) each sentence of ``src [B, S]`` may produce: ``[B]``.

    ``max_len_a * src_len + max_len_b`` (fairseq's rule; src_len counts real tokens, not
    padding), capped by ``max_new_tokens`` when given and always by the model's ``max_len``
    positions.
    """
    if max_new_tokens is not None and max_new_tokens < 0:
        raise DecodeError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not (math.isfinite(max_len_a) and max_len_a >= 0 and max_len_b >= 0):
        raise DecodeError(f"need max_len_a >= 0 and max_len_b >= 0, got {max_len_a}, {max_len_b}")
    src_len = (src != cfg.pad_id).sum(dim=1)
    limit = (src_len * max_len_a + max_len_b).long()  # exact: float32 holds ints < 2^24
    cap = cfg.max_len if max_new_tokens is None else min(max_new_tokens, cfg.max_len)
    return limit.clamp(max=cap)


def banned_ids(cfg: TransformerConfig, device: torch.device) -> Tensor:
    """Ids never valid as output: PAD and BOS."""
    return torch.tensor([cfg.pad_id, cfg.bos_id], device=device)


def ban(scores: Tensor, banned: Tensor) -> Tensor:
    """Set the banned columns of ``scores [n, V]`` to -inf, in place; returns ``scores``."""
    return scores.index_fill_(1, banned, float("-inf"))


class DecodeStep:
    """The encoder output and decoder cache of the rows still being decoded.

    ``expand`` repeats every sentence that many times (the beams of beam search). Rows are
    dropped with :meth:`keep` when their sentences finish and reordered with
    :meth:`reorder` when beams are reselected, so no work is spent on finished rows.
    ``use_cache=False`` recomputes the whole prefix every step: the slow reference the
    cache is tested against.
    """

    def __init__(self, model: Transformer, src: Tensor, use_cache: bool = True, expand: int = 1):
        self.model = model
        self.memory = model.encode(src)  # [B, S, d_model]
        self.src = src
        if expand > 1:
            self.memory = self.memory.repeat_interleave(expand, dim=0)  # [B*expand, S, d]
            self.src = src.repeat_interleave(expand, dim=0)
        self.state = DecoderState() if use_cache else None

    def logits(self, prefix: Tensor) -> Tensor:
        """prefix ``[n, t]`` (BOS + tokens so far, one row per live row) -> next-token
        logits ``[n, V]``."""
        if self.state is not None:
            return self.model.decode(prefix[:, -1:], self.memory, self.src, self.state)[:, -1]
        return self.model.decode(prefix, self.memory, self.src)[:, -1]

    def reorder(self, rows: Tensor) -> None:
        """Reselect cached rows (beams whose sentences share memory); ``rows [n']``."""
        if self.state is not None:
            self.state.reorder(rows)

    def keep(self, rows: Tensor) -> None:
        """Keep only ``rows [n']`` (in that order): memory, source and cache."""
        self.memory, self.src = self.memory[rows], self.src[rows]
        self.reorder(rows)
