"""Continuous batching for beam search: sentences join a running search between decoding
steps and leave as soon as they are done (the scheduling of Hugging Face TGI and vLLM,
here for an encoder-decoder model), so a server never makes a new request wait for a
whole batch to finish.

Each sentence keeps its own step count, length limit, scores and finished hypotheses, and
its rows sit at their own target positions in a ragged
:class:`~aiayn.model.transformer.DecoderState` (per-row positions and key masks), so its
result is the one :func:`~aiayn.decode.beam.beam_search` gives it: the same choice per
step (:func:`~aiayn.decode.beam.select`), the same length and stopping rules. Only the
padding differs (sources padded to the longest one in the batch, target keys left-padded
to the longest running prefix), all of it masked: float noise in the last bits, as between
two offline batches of different widths.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch
from torch import Tensor
from torch.nn import functional as F

from aiayn.decode.beam import (
    Hypothesis,
    eos_hits,
    hypothesis,
    is_done,
    select,
    stop_bound,
)
from aiayn.decode.core import banned_ids, inference, next_logprobs, search_limits
from aiayn.decode.options import DecodeOptions, resolve
from aiayn.errors import DecodeError
from aiayn.model.transformer import DecoderState, Transformer

Tag = TypeVar("Tag", bound=Hashable)  # what a caller names its sentences by


@dataclass
class _Sentence(Generic[Tag]):
    tag: Tag  # the caller's name for it
    limit: int  # the most tokens it may produce, EOS included
    options: DecodeOptions  # the instance's, with this sentence's length penalty alpha
    steps: int = 0  # tokens decoded so far: its rows' prefix is BOS + this many tokens
    finished: list[Hypothesis] = field(default_factory=list)


class ContinuousBeamSearch(Generic[Tag]):
    """Beam search over a batch that changes between steps.

    :meth:`add` encodes new sentences and appends them, ``beam_size`` rows each, to the
    running batch; :meth:`step` advances every sentence by one token and returns those that
    are done; :meth:`remove` drops sentences nobody waits for. Settings (beam size, length
    rule) are fixed per instance, as in one :func:`beam_search` call; the length penalty
    ``alpha`` only scores finished hypotheses, so each :meth:`add` may set its own.

    Tensors, for n running sentences and rows = n * K (sentence-major, K beams each):
    ``src [n, S]`` and ``memory [n, S, d_model]`` right-padded to the longest source
    running, one row per sentence (its beams share it: a ragged state with ``group=K``);
    ``prefix [rows, P]`` BOS + tokens, left-padded with PAD so that its columns line up with
    the self-attention cache (P = cached columns + 1); ``scores [n, K]``.
    """

    def __init__(
        self,
        model: Transformer,
        options: DecodeOptions | int | None = None,
        alpha: float | None = None,
        *,
        beam_size: int | None = None,
        max_len_a: float | None = None,
        max_len_b: int | None = None,
    ):
        if isinstance(options, int) and not isinstance(options, bool):
            options, beam_size = None, options if beam_size is None else beam_size
        options = resolve(
            options, beam=beam_size, alpha=alpha, max_len_a=max_len_a, max_len_b=max_len_b
        )
        if options.sampling or options.prefix:
            raise DecodeError("continuous beam search takes neither sampling nor a prefix")
        self.options = options.replace(n_best=1)  # every finished hypothesis is returned
        self.model, self.K, self.alpha = model, options.beam, options.alpha
        self.device = next(model.parameters()).device
        self._banned = banned_ids(model.cfg, self.device)
        self._clear()

    def __len__(self) -> int:
        """Sentences running."""
        return len(self.sentences)

    @property
    def width(self) -> int:
        """The longest source running (padded source positions per sentence)."""
        return self.src.size(1)

    def _clear(self) -> None:
        self.sentences: list[_Sentence[Tag]] = []
        self.src = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        # Set while sentences run (see :meth:`_running`).
        self.memory: Tensor | None = None
        self.prefix: Tensor | None = None
        self.scores: Tensor | None = None
        self.state: DecoderState | None = None

    def _running(self) -> tuple[Tensor, Tensor, Tensor, DecoderState]:
        """``memory``, ``prefix``, ``scores`` and ``state`` of the running batch."""
        memory, prefix, scores, state = self.memory, self.prefix, self.scores, self.state
        if memory is None or prefix is None or scores is None or state is None:
            raise DecodeError("no sentence is running")
        return memory, prefix, scores, state

    def add(self, src: Tensor, tags: Sequence[Tag], alpha: float | None = None) -> None:
        """Encode ``src [m, S]`` (right-padded token ids, every row non-empty) and let those
        sentences join the running batch; ``tags[i]`` names sentence i in :meth:`step`'s
        results; ``alpha`` is their length penalty (default: the instance's). A source the
        model rejects raises before the running batch changes."""
        if src.size(0) != len(tags) or not len(tags):
            raise ValueError(f"add: {src.size(0)} sentences but {len(tags)} tags")
        alpha = self.alpha if alpha is None else alpha
        options = self.options.replace(alpha=alpha)  # checks alpha
        cfg, K = self.model.cfg, self.K
        src = src.to(self.device)
        limits = search_limits(cfg, src, options, None).tolist()
        with inference(self.model):
            memory = self.model.encode(src)  # [m, S, d]
            state = self.model.start_state(memory, group=K)
        scores = torch.full((len(tags), K), float("-inf"), device=self.device)
        scores[:, 0] = 0.0  # all beams start identical: expand only the first
        bos = torch.full((len(tags) * K, 1), cfg.bos_id, dtype=torch.long, device=self.device)
        new = [_Sentence(t, n, options) for t, n in zip(tags, limits)]
        if not self.sentences:
            self.src, self.memory, self.prefix = src, memory, bos
            self.scores, self.state, self.sentences = scores, state, new
            return
        old_memory, old_prefix, old_scores, old_state = self._running()
        width = max(self.width, src.size(1))
        pad_id, P = cfg.pad_id, old_prefix.size(1)
        with inference(self.model):
            old_state.join(state)
            self.src = torch.cat([_pad_right(s, width, pad_id) for s in (self.src, src)])
            self.memory = torch.cat([_pad_right(m, width, 0.0) for m in (old_memory, memory)])
            self.prefix = torch.cat([old_prefix, F.pad(bos, (P - 1, 0), value=pad_id)])
            self.scores = torch.cat([old_scores, scores])
        self.sentences += new

    def step(self) -> list[tuple[Tag, list[Hypothesis]]]:
        """Decode one token for every running sentence; returns ``(tag, hypotheses)`` of
        the sentences that are done (they leave the batch), hypotheses best first: all the
        finished ones, of which :func:`beam_search` would return the first ``n_best``.
        If this raises, the running sentences are dropped (the state may be half updated)."""
        if not self.sentences:
            return []
        try:
            with inference(self.model):
                return self._step()
        except BaseException:
            self._clear()
            raise

    def _step(self) -> list[tuple[Tag, list[Hypothesis]]]:
        cfg, K = self.model.cfg, self.K
        memory, prefix, running_scores, state = self._running()
        logits = self.model.decode(prefix[:, -1:], memory, self.src, state)
        logp = next_logprobs(logits[:, -1], self._banned)
        ending = [s.steps + 1 >= s.limit for s in self.sentences]
        top_scores, beam, is_eos, scores, parent, token = select(
            running_scores, logp, ending, cfg.eos_id, self.options.forced_eos
        )
        groups, rows, log_probs = eos_hits(beam, is_eos, top_scores)
        if groups:
            P, hit_rows = prefix.size(1), prefix.index_select(0, rows).tolist()
            for g, row, log_prob in zip(groups, hit_rows, log_probs):
                sentence = self.sentences[g]  # its tokens: the last `steps` columns
                tokens = row[P - sentence.steps :]
                o = sentence.options
                sentence.finished.append(hypothesis(tokens, log_prob, o.alpha, o.length_penalty))
        best = scores.max(dim=1).values.tolist()
        keep: list[int] = []
        out: list[tuple[Tag, list[Hypothesis]]] = []
        for i, (sentence, b, end) in enumerate(zip(self.sentences, best, ending)):
            sentence.steps += 1
            bound = stop_bound(sentence.options, sentence.limit, sentence.steps)
            if end or is_done(sentence.finished, b, bound, K):
                out.append((sentence.tag, sorted(sentence.finished, key=_score, reverse=True)))
            else:
                keep.append(i)
        if not keep:
            self._clear()
            return out
        sources = None  # beams move within their sentences: the source side stays
        if out:  # the sentences that are done leave in the same gather as the beam moves
            sources = torch.tensor(keep, device=self.device)
            parent, token = parent.view(-1, K)[sources].view(-1), token.view(-1, K)[sources]
            self.sentences = [self.sentences[i] for i in keep]
            scores, self.src, self.memory = scores[sources], self.src[sources], memory[sources]
        self.scores = scores
        self.prefix = torch.cat([prefix.index_select(0, parent), token.view(-1, 1)], dim=1)
        state.reorder(parent, sources)
        if out:
            self._crop()
        return out

    def remove(self, tags: set[Tag]) -> None:
        """Drop the running sentences named in ``tags`` (their requests went away)."""
        keep = [i for i, s in enumerate(self.sentences) if s.tag not in tags]
        if len(keep) == len(self.sentences):
            return
        if not keep:
            self._clear()
            return
        memory, prefix, scores, state = self._running()
        K, sources = self.K, torch.tensor(keep, device=self.device)
        rows = (sources[:, None] * K + torch.arange(K, device=self.device)).view(-1)
        with inference(self.model):
            self.sentences = [self.sentences[i] for i in keep]
            self.scores, self.prefix = scores[sources], prefix[rows]
            self.src, self.memory = self.src[sources], memory[sources]
            state.reorder(rows, sources)
            self._crop()

    def _crop(self) -> None:
        """Drop the columns that are padding for every row left (the longest running
        prefix and the longest source may have been among the sentences that left)."""
        memory, prefix, _, state = self._running()
        width = int((self.src != self.model.cfg.pad_id).sum(dim=1).max())
        self.src, self.memory = self.src[:, :width], memory[:, :width]
        state.crop(width)
        self.prefix = prefix[:, prefix.size(1) - state.offset - 1 :]


def _score(h: Hypothesis) -> float:
    return h.score


def _pad_right(t: Tensor, width: int, value: float) -> Tensor:
    """Pad dim 1 of ``t`` ([n, S] or [n, S, d]) to ``width`` with ``value``."""
    extra = width - t.size(1)
    if not extra:
        return t
    return F.pad(t, (0, extra) if t.dim() == 2 else (0, 0, 0, extra), value=value)
