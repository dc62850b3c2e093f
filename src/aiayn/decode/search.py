"""One entry point over every search, :func:`search`: token ids and one
:class:`DecodeOptions` in, scored n-best hypotheses out. :func:`greedy` and
:func:`beam_search` are keyword conveniences over it.

Beam search runs on the :class:`~aiayn.decode.engine.BeamEngine` the server steps too
(every sentence added at once, stepped until none is left). Greedy decoding and sampling
run :func:`~aiayn.decode.greedy.one_per_row`, a second loop of the same shape: one row per
output that never moves between rows, so it needs none of the engine's reselection.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from aiayn.decode.core import Models, as_list
from aiayn.decode.engine import BeamEngine, Hypothesis, length_penalty
from aiayn.decode.greedy import one_per_row
from aiayn.decode.options import DecodeOptions, resolve
from aiayn.errors import DecodeError

Prefix = Sequence[Sequence[int]] | None  # per sentence, the forced first output ids


def search(
    models: Models,
    src: Tensor,
    options: DecodeOptions,
    *,
    prefix: Prefix = None,
    lines: Sequence[int] | None = None,
    use_cache: bool = True,
    scores: bool = True,
) -> list[list[Hypothesis]]:
    """Decode ``src [B, S]`` (right-padded ids) as ``options`` say (greedy, beam search or
    sampling) with one model or an ensemble (a list of models).

    Returns, per sentence, its hypotheses: up to ``n_best`` best first from a search, or
    exactly ``n_best`` samples in the order drawn (sample j of line ``lines[i]`` depends
    only on the seed, the line and j). ``prefix[i]`` (ids) is forced as the start of output
    i. Each hypothesis carries its tokens (no BOS/EOS), its total log-prob under the model
    (forced tokens and EOS included) and its score, the log-prob over the length penalty;
    ``scores=False`` lets greedy decoding skip them (log-prob 0), for callers that only
    need the tokens. ``use_cache=False`` recomputes the whole prefix every step (the slow
    reference the cache is tested against).
    """
    if not isinstance(options, DecodeOptions):
        raise DecodeError(f"options must be a DecodeOptions, got {type(options).__name__}")
    if not options.greedy and not options.sampling:
        return _beam(models, src, options, prefix, use_cache)
    out = one_per_row(models, src, options, prefix, lines, use_cache, scores or options.sampling)
    cfg = as_list(models)[0].cfg
    n = options.n_best if options.sampling else 1
    rows = []
    for tokens, log_prob, ended in zip(
        out.tokens.tolist(), out.log_probs.tolist(), out.ended.tolist()
    ):
        tokens = _until(tokens, cfg.eos_id, cfg.pad_id)
        lp = length_penalty(len(tokens) + int(ended), options.alpha, options.length_penalty)
        rows.append(Hypothesis(tokens, log_prob / lp, log_prob, eos=ended))
    return [rows[i : i + n] for i in range(0, len(rows), n)]


def _until(row: list[int], eos: int, pad: int) -> list[int]:
    """The ids before the first EOS or PAD (rows that ended early are padded; neither id
    is ever produced elsewhere)."""
    for i, token in enumerate(row):
        if token in (eos, pad):
            return row[:i]
    return row


def greedy(
    model: Models,
    src: Tensor,
    options: DecodeOptions | None = None,
    *,
    max_new_tokens: int | None = None,
    max_len_a: float | None = None,
    max_len_b: int | None = None,
    prefix: Prefix = None,
    use_cache: bool = True,
) -> Tensor:
    """Decode every sentence of ``src [B, S]`` at once, taking the argmax token each step.

    PAD and BOS are never produced. Returns a LongTensor ``[B, L]`` of generated ids: no
    BOS, the EOS kept where reached, ``pad_id`` after it. Lengths follow ``options`` (see
    :class:`DecodeOptions`; the keyword settings given override it): sentence i produces
    at most ``max_len_a * src_len_i + max_len_b`` tokens (default: its real length + 50),
    at most ``max_new_tokens``, never past the model's ``max_len``; ``L`` is the longest
    output. ``prefix[i]`` (ids) is forced as the start of output i.
    """
    options = resolve(
        options, max_new_tokens=max_new_tokens, max_len_a=max_len_a, max_len_b=max_len_b
    )
    if options.sampling:
        raise DecodeError("greedy decoding does not sample: use aiayn.decode.search")
    return one_per_row(model, src, options, prefix, None, use_cache, scores=False).tokens


def beam_search(
    model: Models,
    src: Tensor,
    options: DecodeOptions | None = None,
    *,
    beam_size: int | None = None,
    alpha: float | None = None,
    n_best: int | None = None,
    max_len_a: float | None = None,
    max_len_b: int | None = None,
    max_new_tokens: int | None = None,
    prefix: Prefix = None,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """Beam search over every sentence of ``src [B, S]`` (default: beam 4, alpha 0.6; the
    keyword settings given override ``options``). Returns, per sentence, its ``n_best``
    hypotheses best first; beam 1 here is beam search too, not greedy decoding. A sentence
    is done once it has ``beam`` finished hypotheses that no active beam can beat any more,
    and then leaves the batch."""
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
    return _beam(model, src, options, prefix, use_cache)


def _beam(
    models: Models, src: Tensor, options: DecodeOptions, prefix: Prefix, use_cache: bool
) -> list[list[Hypothesis]]:
    """Offline beam search: every sentence joins the engine at once, which then steps
    until none is left (each leaves as soon as it is done)."""
    engine: BeamEngine[int] = BeamEngine(models, options, use_cache=use_cache)
    found: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]
    if src.size(0):
        engine.add(src, range(src.size(0)), prefix=prefix)
    while len(engine):
        for i, hypotheses in engine.step():
            found[i] = hypotheses[: options.n_best]
    return found
