"""Batched beam search with the GNMT length penalty (Section 6.1: beam 4, alpha 0.6)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.decode.core import (
    DecodeStep,
    ForcedPrefix,
    Models,
    as_list,
    banned_ids,
    force,
    inference,
    search_limits,
)
from aiayn.decode.options import DecodeOptions, resolve
from aiayn.errors import DecodeError


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
    if kind == "hf":
        return float(length) ** alpha
    return ((5.0 + length) / 6.0) ** alpha


def check_beam_settings(beam_size: int, alpha: float, n_best: int) -> None:
    """DecodeError unless 1 <= n_best <= beam_size and alpha is a finite number >= 0."""
    DecodeOptions(beam=beam_size, alpha=alpha, n_best=n_best)


def beam_search(
    model: Models,
    src: Tensor,
    options: DecodeOptions | int | None = None,
    alpha: float | None = None,
    max_len_b: int | None = None,
    n_best: int | None = None,
    use_cache: bool = True,
    *,
    beam_size: int | None = None,
    max_len_a: float | None = None,
    max_new_tokens: int | None = None,
    prefix: Sequence[Sequence[int]] | None = None,
) -> list[list[Hypothesis]]:
    """Translate every sentence of ``src [B, S]`` together, keeping ``options.beam`` beams
    each.

    Settings come from ``options`` (:class:`DecodeOptions`; default beam 4, alpha 0.6);
    the keyword ones override it, and an int in its place is the beam size (the order
    before options existed). Returns, per sentence, its ``n_best`` hypotheses best first.
    Sentence i may produce at most ``max_len_a * src_len_i + max_len_b`` tokens, EOS
    included (default: its real length + 50), at most ``max_new_tokens`` when given, and
    never more than the model's ``max_len``; ``prefix[i]`` (ids) is forced as the start of
    its output and counts in the score. A sentence is done once it has ``beam`` finished
    hypotheses that no active beam can beat any more, and then leaves the batch. The
    decoder cache is reordered whenever beams are reselected. ``model`` may be a list of
    models: an ensemble.
    """
    if isinstance(options, int) and not isinstance(options, bool):
        options, beam_size = None, options if beam_size is None else beam_size
    options = resolve(
        options,
        beam=beam_size,
        alpha=alpha,
        n_best=n_best,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
        max_new_tokens=max_new_tokens,
    )
    if options.sampling:
        raise DecodeError("beam search does not sample: use aiayn.decode.search")
    cfg = as_list(model)[0].cfg
    forced = ForcedPrefix.make(prefix, cfg, src.size(0), src.device)
    limits = search_limits(cfg, src, options, forced).tolist()
    with inference(model):
        return _beam_search(model, src, options, limits, forced, use_cache)


def _beam_search(
    model: Models,
    src: Tensor,
    options: DecodeOptions,
    limit: list[int],
    forced: ForcedPrefix | None,
    use_cache: bool,
) -> list[list[Hypothesis]]:
    cfg = as_list(model)[0].cfg
    K, alpha, kind = options.beam, options.alpha, options.length_penalty
    device = src.device
    B = src.size(0)
    # Per-sentence bookkeeping lives on the host, so that a GPU is synchronised only for
    # the few small tensors each step must look at (EOS hits, best active scores).
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    # With log-probs <= 0 an active beam's final score can never exceed its current
    # log-prob divided by the largest length penalty it can reach (stop_bound).

    # Rows: sentence-major, K beams each, sharing their sentence's encoder output.
    step = DecodeStep(model, src, use_cache, expand=K, share=True)
    sent = list(range(B))  # original sentence of each active group
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    prefix = torch.full((B * K, 1), cfg.bos_id, dtype=torch.long, device=device)
    banned = banned_ids(cfg, device)

    for t in range(max(limit, default=0)):
        logp = step.logprobs(prefix, banned)  # [n*K, V]
        if forced is not None:  # one forced token per sentence, the same for its beams
            now = forced.at(t)
            force(logp, now.repeat_interleave(K) if now is not None else None)
        ending = [t + 1 >= limit[s] for s in sent]  # these sentences must end now
        top_scores, beam, is_eos, scores, parent, token = select(
            scores, logp, ending, cfg.eos_id, options.forced_eos
        )

        groups, rows, log_probs = eos_hits(beam, is_eos, top_scores)
        if groups:
            hit_tokens = prefix.index_select(0, rows)[:, 1:].tolist()  # without BOS
            for g, tokens, log_prob in zip(groups, hit_tokens, log_probs):
                finished[sent[g]].append(hypothesis(tokens, log_prob, alpha, kind))

        prefix = torch.cat([prefix.index_select(0, parent), token], dim=1)
        step.reorder(parent)  # parents share their sentence's memory: only the cache moves

        best = scores.max(dim=1).values.tolist()
        done = [
            end or is_done(finished[s], b, stop_bound(options, limit[s], t + 1), K)
            for s, b, end in zip(sent, best, ending)
        ]
        if all(done):
            break
        if any(done):
            keep = [i for i, d in enumerate(done) if not d]
            keep_groups = torch.tensor(keep, device=device)
            rows = (keep_groups[:, None] * K + torch.arange(K, device=device)).view(-1)
            sent, scores, prefix = [sent[i] for i in keep], scores[keep_groups], prefix[rows]
            step.keep(rows)
            if forced is not None:
                forced.keep(keep_groups)

    return [sorted(h, key=lambda h: h.score, reverse=True)[: options.n_best] for h in finished]


def select(
    scores: Tensor,
    logp: Tensor,
    ending: list[bool],
    eos_id: int,
    eos_scores_zero: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One step's choice for n sentences of K beams (shared with continuous batching).

    ``scores [n, K]`` are the beams' log-probs so far; ``logp [n*K, V]`` the next-token
    log-probs (:func:`next_logprobs`; banned ids at -inf). The beams of sentences with
    ``ending[i]`` may only take EOS (``logp`` is changed in place for them), which adds its
    log-prob to the score, or 0 with ``eos_scores_zero`` (Hugging Face's
    ``forced_eos_token_id``). Returns the 2K best candidates of each sentence
    (``top_scores``, ``beam`` index within the sentence, ``is_eos``: all ``[n, 2K]``) and
    the K best non-EOS ones that continue: their ``scores [n, K]``, ``parent`` rows
    ``[n*K]`` and ``token [n*K, 1]``.

    The 2K best of a sentence's K x V candidates are among the 2K best of each beam's own
    V (one beam's candidates all shift by its score), so each row's top 2K are found
    first and only those K x 2K are ranked: the K x V sums are never formed.
    """
    n, K = scores.shape
    device = scores.device
    if any(ending):
        at_limit = torch.tensor(ending, device=device).repeat_interleave(K)
        eos = 0.0 if eos_scores_zero else logp[at_limit, eos_id]
        logp[at_limit] = float("-inf")
        logp[at_limit, eos_id] = eos
    k = min(2 * K, logp.size(-1))
    top_logp, top_tokens = logp.topk(k, dim=-1)  # [n*K, k]
    cand = (scores.view(-1, 1) + top_logp).view(n, K * k)
    top_scores, pos = cand.topk(2 * K, dim=1)  # [n, 2K]; >= K of them are not EOS
    beam, token = pos // k, top_tokens.view(n, K * k).gather(1, pos)
    is_eos = token == eos_id
    # The best K non-EOS candidates continue.
    rank = torch.where(is_eos, 2 * K, torch.arange(2 * K, device=device))
    pick = rank.argsort(dim=1, stable=True)[:, :K]  # [n, K]
    next_scores = top_scores.gather(1, pick)
    parent = (beam.gather(1, pick) + torch.arange(n, device=device)[:, None] * K).view(-1)
    return top_scores, beam, is_eos, next_scores, parent, token.gather(1, pick).view(-1, 1)


def eos_hits(
    beam: Tensor, is_eos: Tensor, top_scores: Tensor
) -> tuple[list[int], Tensor, list[float]]:
    """EOS among the best K candidates of a sentence ends that hypothesis (as fairseq
    does). Returns, for each such hit in order, its sentence index (a list), the row of its
    parent beam (a LongTensor, to gather the parents' tokens at once) and its log-prob."""
    K = beam.size(1) // 2
    hits = (is_eos[:, :K] & (top_scores[:, :K] > float("-inf"))).nonzero()  # [h, 2]
    if not hits.numel():
        return [], hits.new_empty(0), []
    g, j = hits[:, 0], hits[:, 1]
    return g.tolist(), g * K + beam[g, j], top_scores[g, j].tolist()


def hypothesis(tokens: list[int], log_prob: float, alpha: float, kind: str = "gnmt") -> Hypothesis:
    """A finished hypothesis (``tokens`` without BOS/EOS), scored with the length penalty
    of its length with the EOS."""
    return Hypothesis(tokens, log_prob / length_penalty(len(tokens) + 1, alpha, kind), log_prob)


def is_done(finished: list[Hypothesis], best_active: float, lp_max: float, K: int) -> bool:
    """A sentence is done when K hypotheses have finished and no active beam can still
    beat the K-th best of them (so an early, poor EOS cannot end the search): its best
    log-prob over ``lp_max``, the largest length penalty it can reach (0: K finished is
    enough)."""
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
