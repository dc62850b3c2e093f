"""Greedy decoding and sampling: one candidate per row, one token per step, with a
key/value cache (Section 6.1 uses beam search; greedy is its beam size 1).

A loop of its own beside the beam engine, of the same shape (rows in a
:class:`~aiayn.decode.core.DecodeStep`, forced prefixes, length limits), because a row
here never moves: no reselection, no shared source rows (samples leave one by one), and
greedy picks the argmax of the raw logits, which skips the softmax when no score is
asked for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.decode.core import (
    DecodeStep,
    Models,
    as_list,
    ban,
    banned_ids,
    forced_ids,
    inference,
    next_forced,
    search_limits,
)
from aiayn.decode.options import DecodeOptions
from aiayn.decode.sampling import draw, row_uniforms, sampling_probs
from aiayn.errors import DecodeError


@dataclass
class RowOutputs:
    """What :func:`one_per_row` decoded: ``tokens [R, L]`` (EOS where reached, then PAD),
    per row its total log-prob (``[R]``, all zeros unless scores were asked for) and
    whether it ended with EOS (``[R]`` bool; False: it ran to its length limit)."""

    tokens: Tensor
    log_probs: Tensor
    ended: Tensor


def one_per_row(
    models: Models,
    src: Tensor,
    options: DecodeOptions,
    prefix: Sequence[Sequence[int]] | None,
    lines: Sequence[int] | None,
    use_cache: bool = True,
    scores: bool = True,
) -> RowOutputs:
    """Greedy decoding, or with ``options.sampling`` ``options.n_best`` samples per sentence
    (rows sentence-major: sentence i's samples are rows i*n .. i*n+n-1); ``lines[i]`` is
    sentence i's line index, which seeds its samples (default: its row in ``src``)."""
    cfg = as_list(models)[0].cfg
    n = options.n_best if options.sampling else 1
    forced = forced_ids(prefix, cfg, src.size(0), src.device)
    limits = search_limits(cfg, src, options, forced).repeat_interleave(n)
    forced = forced.repeat_interleave(n, dim=0) if forced is not None and n > 1 else forced
    R, device = limits.numel(), src.device
    steps = int(limits.max()) if R else 0
    uniforms = None
    if options.sampling:
        lines = range(src.size(0)) if lines is None else lines
        if len(lines) != src.size(0):
            raise DecodeError(f"{len(lines)} line indices for {src.size(0)} sentences")
        uniforms = row_uniforms(options.seed, lines, n, steps).to(device)
    out = torch.full((R, steps), cfg.pad_id, dtype=torch.long, device=device)
    total = torch.zeros(R, dtype=torch.float64, device=device)
    ended = torch.zeros(R, dtype=torch.bool, device=device)
    alive = torch.arange(R, device=device)  # original row of each decoding row
    decoded = torch.full((R, 1), cfg.bos_id, dtype=torch.long, device=device)
    banned, length = banned_ids(cfg, device), 0
    with inference(models):
        step = DecodeStep(models, src, expand=n, use_cache=use_cache)  # encodes, checks src
        for t in range(steps):
            logits = step.logits(decoded)  # [R', V]
            force_now, forced = next_forced(forced)
            # Log-probs normalised over the whole vocabulary, before the ban (as in beam
            # search); one fused log_softmax, into reused memory.
            logp = step.normalise(logits, banned) if scores or options.sampling else None
            if options.sampling:
                assert logp is not None and uniforms is not None  # both made when sampling
                probs = sampling_probs(logp, options.temperature, options.top_k, options.top_p)
                token = draw(probs, uniforms[alive, t])
            else:
                token = ban(logits, banned).argmax(dim=-1)  # [R']: on the logits, as always
            if force_now is not None:
                token = torch.where(force_now >= 0, force_now, token)
            last = limits[alive] == t + 1  # rows taking their last token
            if options.forced_eos:  # as Hugging Face's forced_eos_token_id: EOS, scored 0
                token = torch.where(last, cfg.eos_id, token)
            if scores:
                assert logp is not None
                token_logp = logp.gather(1, token[:, None]).squeeze(1).double()  # never banned
                if options.forced_eos:
                    token_logp = token_logp.masked_fill(last, 0.0)
                total[alive] += token_logp
            out[alive, t] = token
            length = t + 1
            is_eos = token == cfg.eos_id
            ended[alive] = is_eos
            running = ~is_eos & ~last
            if not bool(running.all()):
                keep = running.nonzero().squeeze(1)
                if keep.numel() == 0:
                    break
                alive, token, decoded = alive[keep], token[keep], decoded[keep]
                step.keep(keep)
                forced = forced[keep] if forced is not None else None
            decoded = torch.cat([decoded, token[:, None]], dim=1)
    return RowOutputs(out[:, :length], total, ended)
