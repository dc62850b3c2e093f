"""How far a lower-precision model (int8, bf16, CTranslate2) may translate differently from
the float model, from the numbers rather than a quota: greedy decoding follows the float
model's path for as long as, at each step, the lower-precision model moves the gap between
the float model's two best tokens by less than that gap. A sentence whose every step is
won by a wider gap than the measured perturbation must come out the same."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from aiayn import Transformer
from aiayn.data.batching import pad
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import greedy

LogProbs = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def greedy_paths(model: Transformer, tokenizer: Tokenizer, sources: Sequence[str], max_new=40):
    """(src, tgt_in, real): the float model's greedy outputs as teacher-forcing input, and
    which positions are real steps (up to and including the one that chose EOS)."""
    cfg = model.cfg
    src = pad([tokenizer.encode(s) for s in sources], cfg.pad_id)
    out = greedy(model, src, max_new_tokens=max_new)
    tgt_in = torch.cat([torch.full((len(sources), 1), cfg.bos_id), out[:, :-1]], 1)
    ended = (out[:, :-1] == cfg.eos_id) | (out[:, :-1] == cfg.pad_id)
    real = torch.cat([torch.ones(len(sources), 1, dtype=torch.bool), ~ended], 1)
    real = real.cumprod(1).bool()  # nothing after EOS
    tgt_in = tgt_in.masked_fill(~real, cfg.pad_id)
    return src, tgt_in, real


def log_probs(model: torch.nn.Module, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    """Log-probabilities as greedy ranks them: <pad> and <s> are never chosen."""
    with torch.inference_mode():
        logits = model(src, tgt_in).float()
        logits[..., [model.cfg.pad_id, model.cfg.bos_id]] = float("-inf")
        return torch.log_softmax(logits, -1).clone()


def margins_and_shift(
    model: Transformer, other: LogProbs, tokenizer: Tokenizer, sources: Sequence[str]
) -> tuple[list[float], float]:
    """Per sentence, the narrowest gap (nats) between the float model's two best tokens
    along its greedy path; and the largest change ``other`` (teacher-forced on the same
    paths) makes to such a gap anywhere."""
    src, tgt_in, real = greedy_paths(model, tokenizer, sources)
    ours = log_probs(model, src, tgt_in)
    theirs = other(src, tgt_in)
    top2 = ours.topk(2, -1).indices
    gap = ours.gather(-1, top2).diff(dim=-1).squeeze(-1).neg()
    their_gap = theirs.gather(-1, top2).diff(dim=-1).squeeze(-1).neg()
    shift = float((gap - their_gap).abs()[real].max())
    narrowest = gap.masked_fill(~real, float("inf")).min(1).values
    return narrowest.tolist(), shift
