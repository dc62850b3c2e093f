"""Gaps a mutation run found in decode/sampling.py: the random streams, the inverse-cdf
draw at its edges, and the top-k, nucleus and temperature cuts (decode/options.py and
decode/core.py: tests/test_options_and_core.py)."""

from __future__ import annotations

import pytest
import torch

from aiayn.decode.sampling import draw, row_uniforms, sampling_probs, stream_seed


def test_without_a_seed_every_call_draws_streams_of_its_own():
    """``seed=None`` draws one seed at random: calls get different streams (no two of 50
    alike, as a seed from a small range would give), each in [0, 1) as float64."""
    draws = [row_uniforms(None, [0], 1, 3) for _ in range(50)]
    assert len({tuple(d[0].tolist()) for d in draws}) == 50
    assert all(d.dtype == torch.float64 and d.shape == (1, 3) for d in draws)
    assert all(bool(((d >= 0) & (d < 1)).all()) for d in draws)


def test_streams_are_float64_on_the_cpu_whatever_the_default_device():
    """Row (i, j) is a pure function of (seed, lines[i], j): ``[rows, steps]`` float64 on
    the CPU, the same under a default device set elsewhere (``torch.set_default_device``,
    here the meta device), and the same as the generator's own float64 numbers."""
    want = row_uniforms(3, [4, 9], 2, 5)
    assert want.dtype == torch.float64 and want.device.type == "cpu" and want.shape == (4, 5)
    g = torch.Generator().manual_seed(stream_seed(3, 9, 1))
    assert torch.equal(want[3], torch.rand(5, generator=g, dtype=torch.float64))
    with torch.device("meta"):
        got = row_uniforms(3, [4, 9], 2, 5)
    assert got.device.type == "cpu" and torch.equal(got, want)


def test_stream_seeds_span_63_bits():
    """A stream's seed is below 2**63 (what every generator takes), spread over the whole
    range: odd and even, high and low, no two of many parts alike."""
    seeds = [stream_seed(7, line, sample) for line in range(100) for sample in range(3)]
    assert all(0 <= s < 2**63 for s in seeds)
    assert len(set(seeds)) == len(seeds)
    assert {s % 2 for s in seeds} == {0, 1}
    assert any(s >= 2**62 for s in seeds) and any(s < 2**62 for s in seeds)


def test_each_token_is_drawn_for_its_half_open_stretch_of_the_cdf():
    """Token i is drawn for u in [cdf before i, cdf at i): a draw exactly on a boundary
    takes the token after it, u = 0 the first token that can be drawn (not a
    zero-probability one before it), and the last token its stretch up to 1."""
    quarters = torch.full((1, 4), 0.25, dtype=torch.float64)
    for u, want in ((0.0, 0), (0.2499, 0), (0.25, 1), (0.5, 2), (0.75, 3), (0.9999, 3)):
        got = draw(quarters, torch.tensor([u], dtype=torch.float64))
        assert got.tolist() == [want], u
    gaps = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]], dtype=torch.float64)
    for u, want in ((0.0, 1), (0.4999, 1), (0.5, 3), (0.9999, 3)):
        assert draw(gaps, torch.tensor([u], dtype=torch.float64)).tolist() == [want], u


def test_a_draw_scales_to_the_rows_total_mass():
    """The cdf is read as a distribution over the row's own total: weights that do not
    sum to 1 (float rounding does that) are drawn in proportion, not cut off or shifted."""
    weights = torch.tensor([[2.0, 2.0, 4.0], [1.0, 1.0, 2.0]], dtype=torch.float64)
    for u, want in ((0.2, 0), (0.3, 1), (0.6, 2)):
        got = draw(weights, torch.tensor([u, u], dtype=torch.float64))
        assert got.tolist() == [want, want], u


def test_a_draw_rounded_past_the_last_kept_token_steps_back_to_it():
    """Float rounding can carry a draw past the end of the cdf (here a uniform just
    below 1 rounds to 1 in the float32 of the probabilities): it takes the last token
    each row keeps, never a zero-probability token after it, nor an index past the
    vocabulary."""
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.25, 0.75, 0.0]])
    u = torch.full((2,), 1 - 2**-30, dtype=torch.float64)
    assert draw(probs, u).tolist() == [1, 2]
    assert draw(probs.half(), u).tolist() == [1, 2]
    full = torch.tensor([[0.25, 0.25, 0.5]])  # nothing after the last token: the last one
    assert draw(full, u[:1]).tolist() == [2]


def test_top_k_cuts_a_single_row():
    """top_k keeps the k most likely tokens of each row, one row alone included."""
    logp = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]]), dim=-1)
    probs = sampling_probs(logp, 1.0, top_k=2, top_p=1.0)
    assert (probs[0] > 0).tolist() == [True, True, False, False, False]
    assert probs[0, :2].tolist() == pytest.approx(torch.softmax(logp[0, :2].double(), -1).tolist())


def test_the_nucleus_ends_where_the_mass_before_a_token_reaches_top_p():
    """A token stays while the mass of the more likely ones is below top_p: with four
    equally likely tokens and top_p 0.5 the third (0.5 before it) is cut, two stay; at
    top_p 0.51 three stay."""
    logp = torch.log_softmax(torch.zeros(1, 4), dim=-1)
    assert int((sampling_probs(logp, 1.0, 0, 0.5) > 0).sum()) == 2
    assert int((sampling_probs(logp, 1.0, 0, 0.51) > 0).sum()) == 3


def test_top_p_of_one_cuts_nothing_not_even_a_tail_lost_to_rounding():
    """top_p 1 is no limit: a token so unlikely that the mass before it rounds to the
    whole mass is still kept (with the probability it has)."""
    logp = torch.log_softmax(torch.tensor([[0.0, 0.0, -50.0]], dtype=torch.float64), dim=-1)
    probs = sampling_probs(logp.float(), 1.0, 0, 1.0)
    assert bool((probs > 0).all())
    assert probs[0, 2].item() == pytest.approx(torch.exp(logp[0, 2]).item(), rel=1e-5)


def test_the_limit_of_temperature_shares_ties_in_float64():
    """At a temperature near zero the distribution is its limit, the best tokens sharing
    equally, in float64 like every other temperature's (a tie of three: exactly 1/3 in
    float64, what the float64 draw compares against)."""
    logp = torch.log_softmax(torch.tensor([[1.0, 1.0, 1.0, 0.0]]), dim=-1)
    for temperature in (1e-310, 1.0):
        assert sampling_probs(logp, temperature, 0, 1.0).dtype == torch.float64
    probs = sampling_probs(logp, 1e-310, 0, 1.0)
    assert probs[0].tolist() == [1 / 3, 1 / 3, 1 / 3, 0.0]
