"""One entry point over every search, :func:`search`: token ids and one
:class:`DecodeOptions` in, scored n-best hypotheses out, from the
:class:`~aiayn.decode.engine.BeamEngine` the server steps too (every sentence added at
once, stepped until none is left). :func:`greedy` and :func:`beam_search` are keyword
conveniences over it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from aiayn.decode.beam import Hypothesis
from aiayn.decode.core import Models, as_list, check_src, inference
from aiayn.decode.engine import BeamEngine
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
    need the tokens. ``use_cache=False`` recomputes the whole output so far every step
    (the slow reference the cache is tested against).
    """
    engine: BeamEngine[int] = BeamEngine(models, options, use_cache=use_cache, scores=scores)
    return _run(engine, src, prefix, lines)


def _run(
    engine: BeamEngine[int], src: Tensor, prefix: Prefix, lines: Sequence[int] | None = None
) -> list[list[Hypothesis]]:
    """Every sentence of ``src`` joins ``engine`` at once, which then steps until none is
    left (each leaves as soon as it is done): per sentence its first ``n_best`` outputs."""
    check_src(src)
    found: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]
    with inference(engine.models):  # once: not at every step
        if src.size(0):
            engine.add(src, range(src.size(0)), prefix=prefix, lines=lines)
        while len(engine):
            for i, hypotheses in engine.step():
                found[i] = hypotheses[: engine.options.n_best]
    return found


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

    Returns a LongTensor ``[B, L]`` of generated ids (never PAD or BOS): no BOS, the EOS
    kept where reached, ``pad_id`` after it; ``L`` is the longest output. Lengths follow
    ``options`` (:class:`DecodeOptions`), with the keyword settings given applied;
    ``prefix[i]`` (ids) is forced as the start of output i.
    """
    options = resolve(
        options, max_new_tokens=max_new_tokens, max_len_a=max_len_a, max_len_b=max_len_b
    )
    if options.sampling:
        raise DecodeError("greedy decoding does not sample: use aiayn.decode.search")
    found = search(
        model,
        src,
        options.replace(beam=1, n_best=1),
        prefix=prefix,
        use_cache=use_cache,
        scores=False,
    )
    cfg = as_list(model)[0].cfg
    rows = [h.tokens + [cfg.eos_id] * h.eos for (h,) in found]  # the EOS where reached
    out = torch.full((len(rows), max(map(len, rows), default=0)), cfg.pad_id, device=src.device)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


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
    return _run(BeamEngine(model, options, use_cache=use_cache, one_per_row=False), src, prefix)
