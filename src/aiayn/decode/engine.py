"""The decoding engine: sentences join between two decoding steps and leave as soon as they
are done, under every search (beam search, greedy decoding and sampling).

One engine under every user, as vLLM's: offline decoding
(:func:`~aiayn.decode.search.search`) adds every sentence and steps until none is left;
the server (:mod:`aiayn.serve.running`) adds requests' sentences while others run (the
continuous batching of Hugging Face TGI and vLLM, here for an encoder-decoder model).

Beam search keeps K rows per sentence that move together (the rules are
:mod:`aiayn.decode.beam`'s). Greedy decoding and sampling are the same engine with one row
per output that never moves: a greedy sentence has one, a sampled one ``n_best`` (its
samples share the encoder pass and leave one by one), each taking the argmax of the raw
logits (no softmax when no score is asked for) or a token drawn from its own stream.

Each sentence keeps its own step count, length limit, forced prefix, length penalty and
finished hypotheses; its rows sit at their own target positions in a ragged
:class:`~aiayn.model.transformer.DecoderState`. So a sentence's result does not depend on
when it joined: the same choice per step, the same length and stopping rules. Only the
padding differs (sources padded to the longest one running, target keys left-padded for
the sentences that joined late), all of it masked: float noise in the last bits, as
between two offline batches of different widths. Sentences that all join at once decode
exactly as one offline batch.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

import torch
from torch import Tensor
from torch.nn import functional as F

from aiayn.decode.beam import Hypothesis, finishing, hypothesis, is_done, select, stop_bound
from aiayn.decode.core import (
    DecodeStep,
    Models,
    as_list,
    ban,
    banned_ids,
    check_src,
    force,
    forced_ids,
    inference,
    search_limits,
)
from aiayn.decode.options import DecodeOptions
from aiayn.decode.sampling import draw, row_uniforms, sampling_probs
from aiayn.errors import DecodeError

Tag = TypeVar("Tag", bound=Hashable)  # what a caller names its sentences by
Done = list[tuple[Tag, list[Hypothesis]]]  # sentences that are done, with their outputs


@dataclass
class _Unit(Generic[Tag]):
    """What moves through the batch together: a sentence's K beams, or one output of greedy
    decoding or sampling (``sample``: its index among the sentence's samples)."""

    tag: Tag  # the caller's name for its sentence
    limit: int  # the most tokens it may produce, EOS included
    width: int  # its source length (padding excluded; a pad id inside it counts)
    options: DecodeOptions  # the engine's, with this sentence's length penalty alpha
    prefix: list[int]  # the ids forced as the start of its output (step t forces prefix[t])
    uniforms: list[float]  # a sample's random stream: step t draws at uniforms[t]
    sample: int = 0
    steps: int = 0  # tokens decoded so far: its rows' decoded tokens: BOS + this many
    log_prob: float = 0.0  # one row per unit: its total so far
    finished: list[Hypothesis] = field(default_factory=list)  # beam search


class BeamEngine(Generic[Tag]):
    """Decoding over a batch that changes between steps, for one model or an ensemble.

    :meth:`add` encodes new sentences (with their forced prefixes) and appends them;
    :meth:`step` advances every sentence by one token and returns those that are done;
    :meth:`remove` drops sentences nobody waits for. The options (search, length rule,
    stopping) hold for every sentence; the length penalty ``alpha`` only scores finished
    outputs, so each :meth:`add` may set its own. ``scores=False`` lets greedy decoding
    skip the log-probs (then 0). Beam 1 is greedy decoding unless ``one_per_row=False``
    (beam search of one beam: it goes on past a first EOS that an active beam may beat).

    Tensors, for n running units of K rows (K = ``options.beam`` in beam search, else 1;
    rows sentence-major): ``rows`` (:class:`~aiayn.decode.core.DecodeStep`: source,
    encoder output and cache, one source row per unit); ``decoded [n*K, P]`` BOS + tokens,
    left-padded with PAD so that its columns line up with the self-attention cache;
    ``scores [n, K]`` the beams' log-probs.
    """

    def __init__(
        self,
        models: Models,
        options: DecodeOptions,
        *,
        use_cache: bool = True,
        scores: bool = True,
        one_per_row: bool | None = None,
    ):
        if not isinstance(options, DecodeOptions):
            raise DecodeError(f"options must be a DecodeOptions, got {type(options).__name__}")
        if options.sampling and one_per_row is False:
            raise DecodeError("beam search does not sample")
        if one_per_row and options.beam > 1:
            raise DecodeError(f"one row per sentence is beam 1, got beam {options.beam}")
        self.models, self.options = as_list(models), options
        self.one_per_row = (
            options.greedy or options.sampling if one_per_row is None else one_per_row
        )
        self.K = 1 if self.one_per_row else options.beam
        vocab = self.models[0].cfg.tgt_vocab_size
        if options.beam > vocab and not self.one_per_row:  # more beams than tokens to start
            raise DecodeError(f"beam {options.beam} is larger than the target vocabulary ({vocab})")
        # The ensemble's shortest positions bound every output (and its forced prefix).
        max_len = min(model.cfg.max_len for model in self.models)
        self.cfg, self.use_cache = replace(self.models[0].cfg, max_len=max_len), use_cache
        self.want_scores = scores or options.sampling
        self.device = next(self.models[0].parameters()).device
        self._banned = banned_ids(self.cfg, self.device)
        self._clear()

    def __len__(self) -> int:
        """Sentences running (a sampled one has a slot in ``_samples`` until it is done)."""
        return len(self._samples) if self.options.sampling else len(self.units)

    @property
    def width(self) -> int:
        """The longest source running (padded source positions per sentence)."""
        return self.rows.width if self.rows is not None else 0

    def _clear(self) -> None:
        self.units: list[_Unit[Tag]] = []
        self.rows: DecodeStep | None = None
        self.decoded = torch.zeros(0, 1, dtype=torch.long, device=self.device)
        self.scores = torch.zeros(0, self.K, device=self.device)
        self._samples: dict[Tag, list[Hypothesis | None]] = {}  # a sampled sentence's so far

    def add(
        self,
        src: Tensor,
        tags: Sequence[Tag],
        *,
        prefix: Sequence[Sequence[int]] | None = None,
        alpha: float | None = None,
        lines: Sequence[int] | None = None,
    ) -> None:
        """Encode ``src [m, S]`` (right-padded token ids) and let those sentences join the
        running batch; ``tags[i]`` names sentence i in :meth:`step`'s results,
        ``prefix[i]`` (ids) is forced as the start of its outputs (and counts in the
        score), ``alpha`` is their length penalty (default: the engine's), ``lines[i]``
        (default i) seeds its samples. A source the model rejects raises before the
        running batch changes."""
        check_src(src)
        if src.size(0) != len(tags) or not len(tags):
            raise DecodeError(f"add: {src.size(0)} sentences but {len(tags)} tags")
        if len(set(tags) | {u.tag for u in self.units}) != len(tags) + len(self):
            raise DecodeError("add: every sentence needs a tag of its own (one is running)")
        options = self.options if alpha is None else self.options.replace(alpha=alpha)
        n = options.n_best if options.sampling else 1  # units per sentence
        src, K, m = src.to(self.device), self.K, len(tags)
        if not src.size(1):  # no source token: as a source of padding only
            src = F.pad(src, (0, 1), value=self.cfg.pad_id)
        forced = forced_ids(prefix, self.cfg, m)
        limits = search_limits(self.cfg, src, options, forced)
        real = src != self.cfg.pad_id  # a source's width: up to its last real id
        widths = torch.where(real.any(dim=1), src.size(1) - real.flip(1).int().argmax(1), 0)
        streams: list[list[float]] = [[]] * (m * n)
        if options.sampling:
            lines = range(m) if lines is None else lines
            if len(lines) != m:
                raise DecodeError(f"{len(lines)} line indices for {m} sentences")
            steps = max(max(limits), 1)  # a unit allowed no token still draws once
            streams = row_uniforms(options.seed, lines, n, steps).tolist()
        with inference(self.models):
            rows = DecodeStep(self.models, src, group=K, expand=n, use_cache=self.use_cache)
            if self.rows is None:
                self.rows = rows
            else:
                self.rows.join(rows)
        scores = torch.full((m * n, K), float("-inf"), device=self.device)
        scores[:, 0] = 0.0  # all beams start identical: expand only the first
        bos = torch.full((m * n * K, 1), self.cfg.bos_id, dtype=torch.long, device=self.device)
        P = self.decoded.size(1)  # the new rows' BOS lines up with the running rows' last column
        self.decoded = torch.cat([self.decoded, F.pad(bos, (P - 1, 0), value=self.cfg.pad_id)])
        self.scores = torch.cat([self.scores, scores])
        self.units += [
            _Unit(tag, limit, w, options, p, streams[i * n + j], j)
            for i, (tag, limit, w, p) in enumerate(zip(tags, limits, widths.tolist(), forced))
            for j in range(n)
        ]
        for tag in tags if options.sampling else ():
            self._samples[tag] = [None] * n

    def step(self) -> Done:
        """Decode one token for every running sentence; returns ``(tag, hypotheses)`` of
        the sentences that are done (they leave the batch): in beam search all its
        finished hypotheses, best first (callers keep the first ``n_best``); else its
        output, or its ``n_best`` samples in the order drawn. If this raises, the running
        sentences are dropped (the state may be half updated)."""
        if self.rows is None:
            return []
        try:
            with inference(self.models):
                return self._step(self.rows)
        except BaseException:
            self._clear()
            raise

    def _step(self, rows: DecodeStep) -> Done:
        decoded, units = self.decoded, self.units
        logits = rows.logits(decoded)  # [n*K, V]
        ending = [u.steps + 1 >= u.limit for u in units]  # these must end now
        choose = self._choose_one if self.one_per_row else self._choose_beams
        scores, parent, token, keep, out = choose(rows, logits, self._forced(), ending)
        if len(keep) < len(units):  # the units that are done leave in the beams' gather
            self._keep(keep, scores, parent, token)
            return out
        self.scores = scores  # nobody leaves: beams move within their sentences
        if parent is not None:
            decoded = decoded.index_select(0, parent)
            rows.reorder(parent)
        self.decoded = torch.cat([decoded, token], dim=1)
        return out

    def _forced(self) -> Tensor | None:
        """This step's forced token of each unit (-1: free), or None when none is forced."""
        if not any(u.steps < len(u.prefix) for u in self.units):
            return None
        now = [u.prefix[u.steps] if u.steps < len(u.prefix) else -1 for u in self.units]
        return torch.tensor(now, device=self.device)

    def _choose_beams(
        self, rows: DecodeStep, logits: Tensor, now: Tensor | None, ending: list[bool]
    ) -> tuple[Tensor, Tensor | None, Tensor, list[int], Done]:
        """Beam search's step (:mod:`aiayn.decode.beam`): the beams' new ``scores [n, K]``,
        their ``parent`` rows and new ``token [n*K, 1]``, the units that go on, and the
        sentences that are done."""
        K, units, eos, o = self.K, self.units, self.cfg.eos_id, self.options
        logp = rows.normalise(logits, self._banned)  # [n*K, V]
        force(logp, now.repeat_interleave(K) if now is not None else None)
        top_scores, beam, top_token, scores, parent, token = select(
            self.scores, logp, ending, eos, o.forced_eos, o.cut_at_limit
        )
        groups, hit_rows, log_probs, ends = finishing(beam, top_token, top_scores, eos, ending)
        if groups:
            P, hits = self.decoded.size(1), self.decoded.index_select(0, hit_rows).tolist()
            for g, row, log_prob, last in zip(groups, hits, log_probs, ends):
                unit = units[g]  # its tokens: the last `steps` columns, then `last` unless EOS
                tokens = row[P - unit.steps :] + ([] if last == eos else [last])
                alpha, kind = unit.options.alpha, unit.options.length_penalty
                unit.finished.append(hypothesis(tokens, log_prob, alpha, kind, last == eos))
        best = scores.max(dim=1).values.tolist()
        keep: list[int] = []
        out: Done = []
        for i, (unit, b, end) in enumerate(zip(units, best, ending)):
            unit.steps += 1
            if not unit.limit:  # no token allowed, EOS neither: empty, as greedy decoding
                alpha, kind = unit.options.alpha, unit.options.length_penalty
                unit.finished = [hypothesis([], 0.0, alpha, kind, eos=False)]
            bound = stop_bound(unit.options, unit.limit, unit.steps)
            if end or is_done(unit.finished, b, bound, K):
                out.append((unit.tag, sorted(unit.finished, key=_score, reverse=True)))
            else:
                keep.append(i)
        return scores, parent, token, keep, out

    def _choose_one(
        self, rows: DecodeStep, logits: Tensor, now: Tensor | None, ending: list[bool]
    ) -> tuple[Tensor, Tensor | None, Tensor, list[int], Done]:
        """Greedy decoding's or sampling's step: each row's token (``[n, 1]``; forced,
        else the argmax or a draw), the rows that go on (not at EOS or their limit), and
        the sentences that are done."""
        o, units, eos = self.options, self.units, self.cfg.eos_id
        # Log-probs normalised over the whole vocabulary, before the ban (as in beam
        # search); one fused log_softmax, into reused memory.
        logp = rows.normalise(logits, self._banned) if self.want_scores else None
        if o.sampling:
            assert logp is not None  # made when sampling
            uniforms = [u.uniforms[u.steps] for u in units]
            probs = sampling_probs(logp, o.temperature, o.top_k, o.top_p)
            token = draw(probs, torch.tensor(uniforms, dtype=torch.float64, device=self.device))
        else:
            # [n]: on the logits, as always; max's indices are argmax's (the first of
            # ties) at a third of its time on a CPU (torch 2.13: 0.12 against 0.35 ms at
            # 64 x 8000)
            token = ban(logits, self._banned).max(dim=-1).indices
        if now is not None:
            token = torch.where(now >= 0, now, token)
        last = torch.tensor(ending, device=self.device) if o.forced_eos else None
        if last is not None:  # as Hugging Face's forced_eos_token_id: EOS, scored 0
            token = torch.where(last, eos, token)
        gained = [0.0] * len(units)
        if logp is not None:
            token_logp = logp.gather(1, token[:, None]).squeeze(1).double()  # never banned
            gained = (token_logp if last is None else token_logp.masked_fill(last, 0.0)).tolist()
        tokens, is_eos = token.tolist(), (token == eos).tolist()
        keep: list[int] = []
        done: list[int] = []
        for i, (unit, g, end) in enumerate(zip(units, gained, ending)):
            unit.steps += 1
            unit.log_prob += g
            (done if end or is_eos[i] else keep).append(i)
        # The rows that end, copied to the host at once (one transfer per step, not per row).
        P, ended = self.decoded.size(1), self.decoded[done].tolist() if done else []
        out: Done = []
        for i, row in zip(done, ended):
            unit = units[i]
            alpha, kind = unit.options.alpha, unit.options.length_penalty
            if not unit.limit:  # no token allowed: it decoded one for nothing
                h = hypothesis([], 0.0, alpha, kind, eos=False)
            else:  # its tokens: the last `steps - 1` columns, then this one (not EOS)
                output = row[P - unit.steps + 1 :] + ([] if is_eos[i] else [tokens[i]])
                h = hypothesis(output, unit.log_prob, alpha, kind, bool(is_eos[i]))
            samples = self._samples.get(unit.tag)
            if samples is None:
                out.append((unit.tag, [h]))
                continue
            samples[unit.sample] = h
            if all(x is not None for x in samples):
                out.append((unit.tag, [x for x in samples if x is not None]))
                del self._samples[unit.tag]
        return self.scores, None, token[:, None], keep, out

    def remove(self, tags: set[Tag]) -> None:
        """Drop the running sentences named in ``tags`` (their requests went away)."""
        if isinstance(tags, str):  # type: ignore[unreachable]  # "ab" would drop "a" and "b"
            raise DecodeError(f"remove: tags must be a set of tags, not the str {tags!r}")
        for tag in tags:
            self._samples.pop(tag, None)
        keep = [i for i, u in enumerate(self.units) if u.tag not in tags]
        if len(keep) < len(self.units):
            with inference(self.models):
                self._keep(keep, self.scores)

    def _keep(
        self,
        keep: list[int],
        scores: Tensor,
        parent: Tensor | None = None,
        token: Tensor | None = None,
    ) -> None:
        """Keep only units ``keep``, with their ``scores [n, K]``: their rows taken from
        the ``parent`` rows (beam moves in the same gather; default: their own) and
        extended by ``token [n*K, 1]`` when given. Then drop the columns that are padding
        for every row left: the longest source and the longest running output may have
        been among the units that left."""
        if not keep:
            self._clear()
            return
        assert self.rows is not None  # units are running
        K, kept = self.K, torch.tensor(keep, device=self.device)
        if parent is None:
            parent = (kept[:, None] * K + torch.arange(K, device=self.device)).view(-1)
        else:
            parent = parent.view(-1, K)[kept].view(-1)
        decoded = self.decoded.index_select(0, parent)
        if token is not None:
            decoded = torch.cat([decoded, token.view(-1, K)[kept].view(-1, 1)], dim=1)
        self.scores, self.units = scores[kept], [self.units[i] for i in keep]
        self.rows.keep(parent, kept)
        width, states = max(u.width for u in self.units), self.rows.states
        if width < self.rows.width or (states is not None and states[0].keys is not None):
            self.rows.crop(width)
        if states is not None:
            decoded = decoded[:, decoded.size(1) - states[0].offset - 1 :]
        self.decoded = decoded


def _score(h: Hypothesis) -> float:
    return h.score
