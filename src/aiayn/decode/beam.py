"""The rules of beam search (Section 6.1: beam 4, alpha 0.6): which candidates continue,
when a hypothesis ends, how it is scored and when a sentence is done. Pure functions over
tensors and lists, which :class:`~aiayn.decode.engine.BeamEngine` applies each step."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.decode.options import DecodeOptions


@dataclass
class Hypothesis:
    """One finished output: ``tokens`` without BOS/EOS, ``log_prob`` its total log-prob
    under the model (the EOS's included where ``eos``), ``score`` = log_prob / lp(length)."""

    tokens: list[int]
    score: float
    log_prob: float
    eos: bool = True  # False: it ran to its length limit without EOS (greedy, sampling)


def length_penalty(length: int, alpha: float, kind: str = "gnmt") -> float:
    """lp(Y) for an output of ``length`` tokens (EOS included): "gnmt" ((5 + |Y|) / 6) **
    alpha (Wu et al. 2016, used by the paper), "hf" |Y| ** alpha (Hugging Face)."""
    base = float(length) if kind == "hf" else (5.0 + length) / 6.0
    try:
        return base**alpha
    except OverflowError:  # an absurd alpha: every finished hypothesis then scores 0
        return math.inf


def select(
    scores: Tensor,
    logp: Tensor,
    ending: list[bool],
    eos_id: int,
    eos_scores_zero: bool = False,
    cut: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One step's choice for n sentences of K beams.

    ``scores [n, K]`` are the beams' log-probs so far; ``logp [n*K, V]`` the next-token
    log-probs (:meth:`~aiayn.decode.core.DecodeStep.normalise`; banned ids at -inf). The beams of
    sentences with ``ending[i]`` may only take EOS (``logp`` is changed in place for
    them), which adds its log-prob to the score, or 0 with ``eos_scores_zero`` (Hugging
    Face's ``forced_eos_token_id``); with ``cut`` they choose freely (:func:`finishing`
    ends them all). Returns the 2K best candidates of each sentence (``top_scores``,
    ``beam`` index within the sentence, ``top_token``: all ``[n, 2K]``) and the K best
    non-EOS ones that continue: their ``scores [n, K]``, ``parent`` rows ``[n*K]`` and
    ``token [n*K, 1]``.

    The 2K best of a sentence's K x V candidates are among the 2K best of each beam's own
    V (one beam's candidates all shift by its score), so each row's top 2K are found
    first and only those K x 2K are ranked: the K x V sums are never formed.
    """
    n, K = scores.shape
    device = scores.device
    if any(ending) and not cut:
        at_limit = torch.tensor(ending, device=device).repeat_interleave(K)
        eos = 0.0 if eos_scores_zero else logp[at_limit, eos_id]
        logp[at_limit] = float("-inf")
        logp[at_limit, eos_id] = eos
    k = min(2 * K, logp.size(-1))
    top_logp, top_tokens = logp.topk(k, dim=-1)  # [n*K, k]
    cand = (scores.view(-1, 1) + top_logp).view(n, K * k)
    top_scores, pos = cand.topk(2 * K, dim=1)  # [n, 2K]; >= K of them are not EOS
    beam, token = pos // k, top_tokens.view(n, K * k).gather(1, pos)
    # The best K non-EOS candidates continue.
    rank = torch.where(token == eos_id, 2 * K, torch.arange(2 * K, device=device))
    pick = rank.argsort(dim=1, stable=True)[:, :K]  # [n, K]
    next_scores = top_scores.gather(1, pick)
    parent = (beam.gather(1, pick) + torch.arange(n, device=device)[:, None] * K).view(-1)
    return top_scores, beam, token, next_scores, parent, token.gather(1, pick).view(-1, 1)


def finishing(
    beam: Tensor, top_token: Tensor, top_scores: Tensor, eos_id: int, ending: list[bool]
) -> tuple[list[int], Tensor, list[float], list[int]]:
    """The candidates that end a hypothesis: an EOS among the best K of a sentence (as
    fairseq), and every one of the best K of a sentence at its length limit (without EOS
    when :func:`select` let it choose freely). Returns, for each in order, its sentence
    index (a list), the row of its parent beam (a LongTensor, to gather the parents'
    tokens at once), its log-prob and its token."""
    K = beam.size(1) // 2
    ends = top_token[:, :K] == eos_id
    if any(ending):
        ends |= torch.tensor(ending, device=ends.device)[:, None]
    hits = (ends & (top_scores[:, :K] > float("-inf"))).nonzero()  # [h, 2]
    if not hits.numel():
        return [], hits.new_empty(0), [], []
    g, j = hits[:, 0], hits[:, 1]
    return g.tolist(), g * K + beam[g, j], top_scores[g, j].tolist(), top_token[g, j].tolist()


def hypothesis(
    tokens: list[int], log_prob: float, alpha: float, kind: str = "gnmt", eos: bool = True
) -> Hypothesis:
    """A finished hypothesis (``tokens`` without BOS/EOS), scored with the length penalty
    of its length, the EOS included where it ended with one."""
    lp = length_penalty(len(tokens) + int(eos), alpha, kind)
    return Hypothesis(tokens, log_prob / lp if lp else log_prob, log_prob, eos)


def is_done(finished: list[Hypothesis], best_active: float, lp_max: float, K: int) -> bool:
    """A sentence is done when K hypotheses have finished and no active beam can still
    beat the K-th best of them (so an early, poor EOS cannot end the search): its best
    log-prob over ``lp_max``, the largest length penalty it can reach (0: K finished is
    enough). With log-probs <= 0 an active beam's final score can never exceed that."""
    if best_active == float("-inf"):
        return True
    if len(finished) < K:
        return False
    if lp_max == 0:
        return True
    kth = sorted((h.score for h in finished), reverse=True)[K - 1]
    return kth >= best_active / lp_max


def stop_bound(options: DecodeOptions, limit: int, steps: int) -> float:
    """The length penalty :func:`is_done` divides the best active log-prob by, after
    ``steps`` tokens of a sentence that may produce ``limit``: the penalty at the limit
    (``early_stopping="never"``: exact), at the current length (False: Hugging Face's
    default heuristic), or 0 (True: stop once ``beam`` hypotheses finished)."""
    if options.early_stopping is True:
        return 0.0
    length = limit if options.early_stopping == "never" else steps
    return length_penalty(length, options.alpha, options.length_penalty)
