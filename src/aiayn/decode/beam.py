"""Batched beam search with the GNMT length penalty (Section 6.1: beam 4, alpha 0.6)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.decode.core import DecodeStep, ban, banned_ids, inference, length_limits
from aiayn.errors import DecodeError
from aiayn.model.transformer import Transformer


@dataclass
class Hypothesis:
    """One finished translation: ``tokens`` without BOS/EOS, ``score`` = log p / lp."""

    tokens: list[int]
    score: float
    log_prob: float


def length_penalty(length: int, alpha: float) -> float:
    """lp(Y) = ((5 + |Y|) / 6) ** alpha  (Wu et al. 2016, used by the paper)."""
    return ((5.0 + length) / 6.0) ** alpha


def check_beam_settings(beam_size: int, alpha: float, n_best: int) -> None:
    """DecodeError unless 1 <= n_best <= beam_size and alpha is a finite number >= 0."""
    if beam_size < 1 or not 1 <= n_best <= beam_size:
        raise DecodeError(
            f"need beam_size >= 1 and 1 <= n_best <= beam_size, got {beam_size}, {n_best}"
        )
    # NaN compares false with everything: every hypothesis would look unbeaten and the
    # search would run to the length limit. A negative alpha breaks the stopping bound.
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0):
        raise DecodeError(f"length penalty alpha must be a finite number >= 0, got {alpha}")


def beam_search(
    model: Transformer,
    src: Tensor,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len_b: int = 50,
    n_best: int = 1,
    use_cache: bool = True,
    *,
    max_len_a: float = 1.0,
    max_new_tokens: int | None = None,
) -> list[list[Hypothesis]]:
    """Translate every sentence of ``src [B, S]`` together, keeping ``beam_size`` beams each.

    Returns, per sentence, its ``n_best`` hypotheses best first. Sentence i may produce at
    most ``max_len_a * src_len_i + max_len_b`` tokens, EOS included (default: its real
    length + 50), at most ``max_new_tokens`` when given, and never more than the model's
    ``max_len``; a sentence is done once it has ``beam_size`` finished hypotheses that no
    active beam can beat any more, and then leaves the batch. The decoder cache is
    reordered whenever beams are reselected.
    """
    check_beam_settings(beam_size, alpha, n_best)
    limits = length_limits(model.cfg, src, max_new_tokens, max_len_a, max_len_b).tolist()
    with inference(model):
        return _beam_search(model, src, beam_size, alpha, n_best, limits, use_cache)


def _beam_search(model, src, K, alpha, n_best, limit, use_cache):
    cfg = model.cfg
    device = src.device
    B = src.size(0)
    # Per-sentence bookkeeping lives on the host, so that a GPU is synchronised only for
    # the few small tensors each step must look at (EOS hits, best active scores).
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    # The largest length penalty a sentence can reach; with log-probs <= 0 an active beam's
    # final score can never exceed its current log-prob divided by it.
    lp_bound = [length_penalty(n, alpha) for n in limit]

    step = DecodeStep(model, src, use_cache, expand=K)  # rows: sentence-major, K beams each
    sent = list(range(B))  # original sentence of each active group
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    prefix = torch.full((B * K, 1), cfg.bos_id, dtype=torch.long, device=device)
    banned = banned_ids(cfg, device)

    for t in range(max(limit, default=0)):
        # Log-probabilities over the whole vocabulary first, then the ban: banning before
        # the softmax would renormalise over fewer tokens and change the scores.
        logp = ban(torch.log_softmax(step.logits(prefix).float(), dim=-1), banned)  # [n*K, V]
        ending = [t + 1 >= limit[s] for s in sent]  # these sentences must end now
        top_scores, beam, is_eos, scores, parent, token = select(scores, logp, ending, cfg.eos_id)

        groups, rows, log_probs = eos_hits(beam, is_eos, top_scores)
        if groups:
            hit_tokens = prefix.index_select(0, rows)[:, 1:].tolist()  # without BOS
            for g, tokens, log_prob in zip(groups, hit_tokens, log_probs):
                finished[sent[g]].append(hypothesis(tokens, log_prob, alpha))

        prefix = torch.cat([prefix.index_select(0, parent), token], dim=1)
        step.reorder(parent)  # parents share their sentence's memory: only the cache moves

        best = scores.max(dim=1).values.tolist()
        done = [
            end or is_done(finished[s], b, lp_bound[s], K) for s, b, end in zip(sent, best, ending)
        ]
        if all(done):
            break
        if any(done):
            keep = [i for i, d in enumerate(done) if not d]
            keep_groups = torch.tensor(keep, device=device)
            rows = (keep_groups[:, None] * K + torch.arange(K, device=device)).view(-1)
            sent, scores, prefix = [sent[i] for i in keep], scores[keep_groups], prefix[rows]
            step.keep(rows)

    return [sorted(h, key=lambda h: h.score, reverse=True)[:n_best] for h in finished]


def select(scores: Tensor, logp: Tensor, ending: list[bool], eos_id: int):
    """One step's choice for n sentences of K beams (shared with continuous batching).

    ``scores [n, K]`` are the beams' log-probs so far, ``logp [n*K, V]`` the next-token
    log-probs (banned ids at -inf); the beams of sentences with ``ending[i]`` may only take
    EOS (``logp`` is changed in place for them). Returns the 2K best candidates of each
    sentence (``top_scores``, ``beam`` index within the sentence, ``is_eos``: all ``[n, 2K]``)
    and the K best non-EOS ones that continue: their ``scores [n, K]``, ``parent`` rows
    ``[n*K]`` and ``token [n*K, 1]``.
    """
    n, K = scores.shape
    device = scores.device
    if any(ending):
        at_limit = torch.tensor(ending, device=device).repeat_interleave(K)
        forced = torch.full_like(logp[0], float("-inf"))
        forced[eos_id] = 0.0
        logp[at_limit] = forced + logp[at_limit, eos_id : eos_id + 1]
    V = logp.size(-1)
    cand = (scores[:, :, None] + logp.view(n, K, V)).view(n, K * V)
    top_scores, top_idx = cand.topk(2 * K, dim=1)  # [n, 2K]; >= K of them are not EOS
    beam, token = top_idx // V, top_idx % V
    is_eos = token == eos_id
    # The best K non-EOS candidates continue.
    rank = torch.where(is_eos, 2 * K, torch.arange(2 * K, device=device))
    pick = rank.argsort(dim=1, stable=True)[:, :K]  # [n, K]
    next_scores = top_scores.gather(1, pick)
    parent = (beam.gather(1, pick) + torch.arange(n, device=device)[:, None] * K).view(-1)
    return top_scores, beam, is_eos, next_scores, parent, token.gather(1, pick).view(-1, 1)


def eos_hits(beam: Tensor, is_eos: Tensor, top_scores: Tensor):
    """EOS among the best K candidates of a sentence ends that hypothesis (as fairseq
    does). Returns, for each such hit in order, its sentence index (a list), the row of its
    parent beam (a LongTensor, to gather the parents' tokens at once) and its log-prob."""
    K = beam.size(1) // 2
    hits = (is_eos[:, :K] & (top_scores[:, :K] > float("-inf"))).nonzero()  # [h, 2]
    if not hits.numel():
        return [], None, []
    g, j = hits[:, 0], hits[:, 1]
    return g.tolist(), g * K + beam[g, j], top_scores[g, j].tolist()


def hypothesis(tokens: list[int], log_prob: float, alpha: float) -> Hypothesis:
    """A finished hypothesis (``tokens`` without BOS/EOS), scored with the length penalty
    of its length with the EOS."""
    return Hypothesis(tokens, log_prob / length_penalty(len(tokens) + 1, alpha), log_prob)


def is_done(finished: list[Hypothesis], best_active: float, lp_max: float, K: int) -> bool:
    """A sentence is done when K hypotheses have finished and no active beam can still
    beat the K-th best of them (so an early, poor EOS cannot end the search)."""
    if best_active == float("-inf"):
        return True
    if len(finished) < K:
        return False
    kth = sorted((h.score for h in finished), reverse=True)[K - 1]
    return kth >= best_active / lp_max
