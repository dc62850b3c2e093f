"""One entry point over both searches: token ids in, n-best token ids out."""

from __future__ import annotations

from torch import Tensor

from aiayn.decode.beam import beam_search, check_beam_settings
from aiayn.decode.greedy import greedy
from aiayn.model.transformer import Transformer


def generate(
    model: Transformer,
    src: Tensor,
    beam_size: int = 4,
    alpha: float = 0.6,
    n_best: int = 1,
    *,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
) -> list[list[list[int]]]:
    """For each sentence of ``src [B, S]``, its ``n_best`` outputs best first, each a list of
    token ids without BOS and EOS (fewer than ``n_best`` if the search finished fewer).
    ``beam_size=1, n_best=1`` is greedy decoding; lengths as in :func:`greedy`."""
    check_beam_settings(beam_size, alpha, n_best)
    if beam_size == 1 and n_best == 1:
        eos, pad = model.cfg.eos_id, model.cfg.pad_id
        out = greedy(model, src, max_len_a=max_len_a, max_len_b=max_len_b).tolist()
        return [[_until(row, eos, pad)] for row in out]
    hyps = beam_search(model, src, beam_size, alpha, max_len_b, n_best, max_len_a=max_len_a)
    return [[h.tokens for h in sentence] for sentence in hyps]


def _until(row: list[int], eos: int, pad: int) -> list[int]:
    """The ids before the first EOS or PAD (greedy pads rows that ended early)."""
    for i, token in enumerate(row):
        if token in (eos, pad):
            return row[:i]
    return row
