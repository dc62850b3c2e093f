"""The beam search engine (Section 6.1: beam 4, alpha 0.6): sentences join between two
decoding steps and leave as soon as they are done.

One engine under both users, as vLLM's: offline beam search
(:func:`~aiayn.decode.search.search`) adds every sentence and steps until none is left;
the server (:mod:`aiayn.serve.running`) adds requests' sentences while others run (the
continuous batching of Hugging Face TGI and vLLM, here for an encoder-decoder model).

Each sentence keeps its own step count, length limit, forced prefix, length penalty and
finished hypotheses; its K beams share one source row, and its rows sit at their own
target positions in a ragged :class:`~aiayn.model.transformer.DecoderState`. So a
sentence's result does not depend on when it joined: the same choice per step
(:func:`select`), the same length and stopping rules. Only the padding differs (sources
padded to the longest one running, target keys left-padded for the sentences that joined
late), all of it masked: float noise in the last bits, as between two offline batches of
different widths. Sentences that all join at once decode exactly as one offline batch.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch
from torch import Tensor
from torch.nn import functional as F

from aiayn.decode.core import (
    DecodeStep,
    Models,
    as_list,
    banned_ids,
    force,
    forced_ids,
    inference,
    next_forced,
    search_limits,
)
from aiayn.decode.options import DecodeOptions
from aiayn.errors import DecodeError

Tag = TypeVar("Tag", bound=Hashable)  # what a caller names its sentences by


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


@dataclass
class _Sentence(Generic[Tag]):
    tag: Tag  # the caller's name for it
    limit: int  # the most tokens it may produce, EOS included
    width: int  # its source length (padding excluded; a pad id inside it counts)
    options: DecodeOptions  # the engine's, with this sentence's length penalty alpha
    steps: int = 0  # tokens decoded so far: its rows' decoded tokens: BOS + this many
    finished: list[Hypothesis] = field(default_factory=list)


class BeamEngine(Generic[Tag]):
    """Beam search over a batch that changes between steps, for one model or an ensemble.

    :meth:`add` encodes new sentences (with their forced prefixes) and appends them, K =
    ``options.beam`` rows each; :meth:`step` advances every sentence by one token and
    returns those that are done; :meth:`remove` drops sentences nobody waits for. The
    options (beam, length rule, stopping) hold for every sentence; the length penalty
    ``alpha`` only scores finished hypotheses, so each :meth:`add` may set its own.

    Tensors, for n running sentences and rows = n * K (sentence-major, K beams each):
    ``rows`` (:class:`~aiayn.decode.core.DecodeStep`: source, encoder output and cache,
    one source row per sentence); ``decoded [rows, P]`` BOS + tokens, left-padded with PAD
    so that its columns line up with the self-attention cache; ``scores [n, K]``;
    ``forced [n, F]`` what each sentence's next steps force (-1: free; None: nothing).
    """

    def __init__(self, models: Models, options: DecodeOptions, *, use_cache: bool = True):
        if not isinstance(options, DecodeOptions) or options.sampling:
            raise DecodeError("beam search takes DecodeOptions without sampling")
        self.models, self.options, self.K = as_list(models), options, options.beam
        self.cfg, self.use_cache = self.models[0].cfg, use_cache
        self.device = next(self.models[0].parameters()).device
        self._banned = banned_ids(self.cfg, self.device)
        self._clear()

    def __len__(self) -> int:
        """Sentences running."""
        return len(self.sentences)

    @property
    def width(self) -> int:
        """The longest source running (padded source positions per sentence)."""
        return self.rows.width if self.rows is not None else 0

    def _clear(self) -> None:
        self.sentences: list[_Sentence[Tag]] = []
        self.rows: DecodeStep | None = None
        self.decoded = torch.zeros(0, 1, dtype=torch.long, device=self.device)
        self.scores = torch.zeros(0, self.K, device=self.device)
        self.forced: Tensor | None = None

    def add(
        self,
        src: Tensor,
        tags: Sequence[Tag],
        *,
        prefix: Sequence[Sequence[int]] | None = None,
        alpha: float | None = None,
    ) -> None:
        """Encode ``src [m, S]`` (right-padded token ids) and let those sentences join the
        running batch; ``tags[i]`` names sentence i in :meth:`step`'s results,
        ``prefix[i]`` (ids) is forced as the start of its outputs (and counts in the
        score), ``alpha`` is their length penalty (default: the engine's). A source the
        model rejects raises before the running batch changes."""
        if src.size(0) != len(tags) or not len(tags):
            raise DecodeError(f"add: {src.size(0)} sentences but {len(tags)} tags")
        options = self.options if alpha is None else self.options.replace(alpha=alpha)
        src, K = src.to(self.device), self.K
        forced = forced_ids(prefix, self.cfg, len(tags), self.device)
        limits = search_limits(self.cfg, src, options, forced).tolist()
        real = src != self.cfg.pad_id  # a source's width: up to its last real id
        widths = torch.where(real.any(dim=1), src.size(1) - real.flip(1).int().argmax(1), 0)
        with inference(self.models):
            rows = DecodeStep(self.models, src, group=K, use_cache=self.use_cache)
        scores = torch.full((len(tags), K), float("-inf"), device=self.device)
        scores[:, 0] = 0.0  # all beams start identical: expand only the first
        bos = torch.full((len(tags) * K, 1), self.cfg.bos_id, dtype=torch.long, device=src.device)
        new = [_Sentence(t, n, w, options) for t, n, w in zip(tags, limits, widths.tolist())]
        if self.rows is None:
            self.rows, self.decoded, self.scores, self.forced = rows, bos, scores, forced
            self.sentences = new
            return
        with inference(self.models):
            self.rows.join(rows)
        P = self.decoded.size(1)
        self.decoded = torch.cat([self.decoded, F.pad(bos, (P - 1, 0), value=self.cfg.pad_id)])
        self.scores = torch.cat([self.scores, scores])
        self.forced = _stack_forced(self.forced, forced, len(self.sentences), len(new))
        self.sentences += new

    def step(self) -> list[tuple[Tag, list[Hypothesis]]]:
        """Decode one token for every running sentence; returns ``(tag, hypotheses)`` of
        the sentences that are done (they leave the batch), hypotheses best first: all the
        finished ones (callers keep the first ``n_best``). If this raises, the running
        sentences are dropped (the state may be half updated)."""
        if self.rows is None:
            return []
        try:
            with inference(self.models):
                return self._step(self.rows)
        except BaseException:
            self._clear()
            raise

    def _step(self, rows: DecodeStep) -> list[tuple[Tag, list[Hypothesis]]]:
        K, decoded, sentences = self.K, self.decoded, self.sentences
        logp = rows.normalise(rows.logits(decoded), self._banned)  # [n*K, V]
        now, self.forced = next_forced(self.forced)  # one per sentence, the same for its beams
        force(logp, now.repeat_interleave(K) if now is not None else None)
        ending = [s.steps + 1 >= s.limit for s in sentences]  # these must end now
        top_scores, beam, is_eos, scores, parent, token = select(
            self.scores, logp, ending, self.cfg.eos_id, self.options.forced_eos
        )
        groups, hit_rows, log_probs = eos_hits(beam, is_eos, top_scores)
        if groups:
            P, hits = decoded.size(1), decoded.index_select(0, hit_rows).tolist()
            for g, row, log_prob in zip(groups, hits, log_probs):
                sentence = sentences[g]  # its tokens: the last `steps` columns
                o = sentence.options
                tokens = row[P - sentence.steps :]
                sentence.finished.append(hypothesis(tokens, log_prob, o.alpha, o.length_penalty))
        best = scores.max(dim=1).values.tolist()
        keep: list[int] = []
        out: list[tuple[Tag, list[Hypothesis]]] = []
        for i, (sentence, b, end) in enumerate(zip(sentences, best, ending)):
            sentence.steps += 1
            bound = stop_bound(sentence.options, sentence.limit, sentence.steps)
            if end or is_done(sentence.finished, b, bound, K):
                out.append((sentence.tag, sorted(sentence.finished, key=_score, reverse=True)))
            else:
                keep.append(i)
        if not keep:
            self._clear()
            return out
        if not out:  # beams move within their sentences: the source side stays
            self.scores = scores
            self.decoded = torch.cat([decoded.index_select(0, parent), token], dim=1)
            rows.reorder(parent)
            return out
        # The sentences that are done leave in the same gather as the beam moves.
        kept = torch.tensor(keep, device=self.device)
        parent, token = parent.view(-1, K)[kept].view(-1), token.view(-1, K)[kept]
        self.scores = scores[kept]
        self.decoded = torch.cat([decoded.index_select(0, parent), token.view(-1, 1)], dim=1)
        rows.keep(parent, kept)
        self._leave(keep, kept)
        return out

    def remove(self, tags: set[Tag]) -> None:
        """Drop the running sentences named in ``tags`` (their requests went away)."""
        keep = [i for i, s in enumerate(self.sentences) if s.tag not in tags]
        if len(keep) == len(self.sentences) or self.rows is None:
            return
        if not keep:
            self._clear()
            return
        kept = torch.tensor(keep, device=self.device)
        rows = (kept[:, None] * self.K + torch.arange(self.K, device=self.device)).view(-1)
        self.scores, self.decoded = self.scores[kept], self.decoded[rows]
        with inference(self.models):
            self.rows.keep(rows, kept)
            self._leave(keep, kept)

    def _leave(self, keep: list[int], kept: Tensor) -> None:
        """Keep only sentences ``keep`` (their rows already kept), and drop the columns
        that are padding for every row left: the longest source and the longest running
        output may have been among the sentences that left."""
        assert self.rows is not None
        self.sentences = [self.sentences[i] for i in keep]
        self.forced = self.forced[kept] if self.forced is not None else None
        width, states = max(s.width for s in self.sentences), self.rows.states
        if width < self.rows.width or (states is not None and states[0].keys is not None):
            self.rows.crop(width)
        if states is not None:
            self.decoded = self.decoded[:, self.decoded.size(1) - states[0].offset - 1 :]


def _stack_forced(a: Tensor | None, b: Tensor | None, n_a: int, n_b: int) -> Tensor | None:
    """The forced ids of ``n_a`` running sentences (``a``) then ``n_b`` joining ones."""
    if a is None and b is None:
        return None
    parts = [t if t is not None else torch.full((n, 1), -1) for t, n in ((a, n_a), (b, n_b))]
    width = max(t.size(1) for t in parts)
    device = (a if a is not None else b).device  # type: ignore[union-attr]
    return torch.cat([F.pad(t.to(device), (0, width - t.size(1)), value=-1) for t in parts])


def select(
    scores: Tensor,
    logp: Tensor,
    ending: list[bool],
    eos_id: int,
    eos_scores_zero: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One step's choice for n sentences of K beams.

    ``scores [n, K]`` are the beams' log-probs so far; ``logp [n*K, V]`` the next-token
    log-probs (:func:`~aiayn.decode.core.next_logprobs`; banned ids at -inf). The beams of
    sentences with ``ending[i]`` may only take EOS (``logp`` is changed in place for
    them), which adds its log-prob to the score, or 0 with ``eos_scores_zero`` (Hugging
    Face's ``forced_eos_token_id``). Returns the 2K best candidates of each sentence
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


def _score(h: Hypothesis) -> float:
    return h.score
