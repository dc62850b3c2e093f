"""Sampling: each next token drawn from the model's distribution, sharpened or flattened by
a temperature and cut to the top-k tokens and to the nucleus (top-p; Holtzman et al.
2020), e.g. for back-translation (Edunov et al. 2018).

Reproducible per line: every output row owns a stream of uniform numbers seeded from (seed,
line index, sample index), and a token is drawn by inverting the cumulative distribution
at the row's number for that step. No row reads another's numbers, so what a line gets
does not depend on its neighbours, the batch or how many processes share the input, up to
float rounding: padding and batch size move the last bits of the model's probabilities,
and a draw that falls within that rounding of the boundary between two tokens takes the
other one. Every token with a probability above 0 is such a boundary, so a top-k or top-p
cut makes this rarer (``benchmarks/sampling_batches.py`` counts it). The same input
decoded the same way always gets the same samples.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from torch import Tensor


def row_uniforms(seed: int | None, lines: Sequence[int], samples: int, steps: int) -> Tensor:
    """Uniform numbers in [0, 1) for ``len(lines) * samples`` rows (line-major, as the
    search lays them out) and ``steps`` steps: ``[rows, steps]`` float64. Row (i, j) is a
    pure function of (seed, lines[i], j); ``seed=None`` draws one seed at random."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item())
    out = torch.empty(len(lines) * samples, steps, dtype=torch.float64, device="cpu")
    generator = torch.Generator()
    for i, line in enumerate(lines):
        for j in range(samples):
            generator.manual_seed(stream_seed(seed, line, j))
            out[i * samples + j] = torch.rand(
                steps, generator=generator, dtype=torch.float64, device="cpu"
            )
    return out


def stream_seed(*parts: int) -> int:
    """A seed (< 2**63) that is a pure function of ``parts``, the same in every process and
    Python: a hash, not arithmetic (parts that sum alike must not share a stream), and not
    hash(), which maps -1 and -2 alike. A sample's (seed, line, sample); a training rank's
    dropout (:mod:`aiayn.train.trainer`)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


# At or below this temperature a row is its limit, the most likely token alone. Decided by
# the temperature, not per step by checking logp / temperature (a host sync each step):
# the best log-prob is above -ln(vocabulary) > -50, so it only overflows below ~1e-307,
# and a GPU flushes a subnormal temperature (< 2.2e-308) to 0 (0 / 0: NaN); while from
# here down any two float32 log-probs that differ at all are ~1e255 apart after dividing,
# so the softmax is already exactly that limit.
LIMIT_TEMPERATURE = 1e-300


def sampling_probs(logp: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """The distribution to draw from, for rows of log-probs ``logp [n, V]`` (banned tokens
    at -inf): softmax(logp / temperature), then only the ``top_k`` most likely tokens (0:
    all; ties with the k-th are kept), then only the nucleus: the most likely tokens whose
    mass, before each one is added, is below ``top_p`` (the most likely token always stays).
    Returns ``[n, V]`` probabilities, each row summing to 1, zero outside what is kept."""
    if temperature > LIMIT_TEMPERATURE:
        scaled = logp.double() / temperature
    else:  # its limit, the most likely token (ties shared): see LIMIT_TEMPERATURE
        best = logp == logp.amax(dim=-1, keepdim=True)
        scaled = torch.zeros_like(logp, dtype=torch.float64).masked_fill(~best, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if 0 < top_k < probs.size(-1):
        kth = probs.topk(top_k, dim=-1).values[:, -1:]
        probs = probs.masked_fill(probs < kth, 0.0)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the more likely ones
        sorted_probs = sorted_probs.masked_fill(before >= top_p * probs.sum(-1, True), 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return probs / probs.sum(dim=-1, keepdim=True)


def draw(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Row i's token at ``uniforms[i]`` in [0, 1) by the inverse of its cumulative
    distribution over ``probs [n, V]`` (token order, so the draw depends on the row alone):
    ``[n]`` LongTensor, never a zero-probability token."""
    cdf = probs.cumsum(dim=-1)
    target = uniforms.to(cdf.dtype)[:, None] * cdf[:, -1:]
    token = torch.searchsorted(cdf, target, right=True).squeeze(1)
    token = token.clamp(max=probs.size(-1) - 1)
    # Float rounding can land a draw on a zero-probability token after the last kept one
    # (the cdf is flat there): step back to the kept token that ends the flat stretch.
    bad = probs.gather(1, token[:, None]).squeeze(1) == 0
    if bool(bad.any()):
        last_kept = (probs > 0).cumsum(dim=-1).argmax(dim=-1)
        token = torch.where(bad, last_kept, token)
    return token
