"""One entry point over every search: token ids in, scored n-best hypotheses out."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from aiayn.decode.beam import Hypothesis, beam_search, length_penalty
from aiayn.decode.core import Models, as_list
from aiayn.decode.greedy import one_per_row
from aiayn.decode.options import DecodeOptions, resolve


def search(
    model: Models,
    src: Tensor,
    options: DecodeOptions | None = None,
    *,
    prefix: Sequence[Sequence[int]] | None = None,
    lines: Sequence[int] | None = None,
    use_cache: bool = True,
    scores: bool = True,
) -> list[list[Hypothesis]]:
    """Decode ``src [B, S]`` as ``options`` say (greedy, beam search or sampling) with one
    model or an ensemble (a list of models).

    Returns, per sentence, its hypotheses: up to ``n_best`` best first from a search, or
    exactly ``n_best`` samples in the order drawn (sample j of line ``lines[i]`` depends
    only on the seed, the line and j). ``prefix[i]`` (ids) is forced as the start of output
    i. Each hypothesis carries its tokens (no BOS/EOS), its total log-prob under the model
    (forced tokens and EOS included) and its score, the log-prob over the length penalty;
    ``scores=False`` lets greedy decoding skip them (log-prob 0), for callers that only
    need the tokens.
    """
    options = resolve(options)
    if not options.greedy and not options.sampling:
        return beam_search(model, src, options, use_cache=use_cache, prefix=prefix)
    out = one_per_row(model, src, options, prefix, lines, use_cache, scores or options.sampling)
    cfg = as_list(model)[0].cfg
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


def generate(
    model: Models,
    src: Tensor,
    options: DecodeOptions | int | None = None,
    alpha: float | None = None,
    n_best: int | None = None,
    *,
    beam_size: int | None = None,
    max_len_a: float | None = None,
    max_len_b: int | None = None,
) -> list[list[list[int]]]:
    """For each sentence of ``src [B, S]``, its ``n_best`` outputs best first, each a list of
    token ids without BOS and EOS (fewer than ``n_best`` if the search finished fewer).
    ``options`` as in :func:`search` (an int in its place is the beam size, followed by
    alpha and n_best: the order before options existed); beam 1 is greedy decoding."""
    if isinstance(options, int) and not isinstance(options, bool):
        options, beam_size = None, options if beam_size is None else beam_size
    options = resolve(
        options,
        beam=beam_size,
        alpha=alpha,
        n_best=n_best,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
    )
    found = search(model, src, options, scores=False)
    return [[h.tokens for h in sentence] for sentence in found]
