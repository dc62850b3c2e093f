"""Gaps a mutation run found in decode/sampling.py, decode/options.py and decode/core.py:
the sampling streams, the inverse-cdf draw at its edges, the options' checks and what the
searches share."""

from __future__ import annotations

import pytest
import torch

from aiayn.decode.options import DecodeOptions, length_rule
from aiayn.decode.sampling import draw, row_uniforms, sampling_probs, stream_seed
from aiayn.errors import DecodeError

# -- sampling ------------------------------------------------------------------------------


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


# -- options -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "tokens"),
    [({"max_new_tokens": 1}, 1), ({"max_length": 2}, 1), ({"max_new_tokens": 7}, 7)],
)
def test_generation_lengths_down_to_one_token(settings, tokens):
    """max_new_tokens, or max_length less the decoder's start token, is the output's
    length: one token is enough room (generate() refuses only 0 or less)."""
    options = DecodeOptions.from_generation({"max_length": 20, **settings})
    assert (options.max_len_a, options.max_len_b) == (0.0, tokens)


def test_generation_lengths_without_room_are_named():
    """The setting that leaves no room is the one named; max_length's message says why."""
    with pytest.raises(DecodeError) as e:
        DecodeOptions.from_generation({"max_length": 1})
    assert str(e.value) == (
        "generation settings: max_length 1 leaves no room for an output token "
        "(it counts the decoder's start token)"
    )
    with pytest.raises(DecodeError) as e:
        DecodeOptions.from_generation({"max_new_tokens": 0, "max_length": 40})
    assert (
        str(e.value) == "generation settings: max_new_tokens 0 leaves no room for an output token"
    )


def test_a_forced_eos_id_ends_outputs_at_the_limit_with_eos():
    """forced_eos_token_id set: forced_eos, not cut_at_limit; without it the other way."""
    forced = DecodeOptions.from_generation({"forced_eos_token_id": 0, "num_beams": 4})
    assert (forced.forced_eos, forced.cut_at_limit, forced.beam) == (True, False, 4)
    plain = DecodeOptions.from_generation({"forced_eos_token_id": None})
    assert (plain.forced_eos, plain.cut_at_limit) == (False, True)


def test_the_length_rule_is_said_in_one_line_with_where_it_comes_from():
    """length_rule: the cap (max_new_tokens, a fixed length, or the rule of the source's
    length), the model's positions, and whose rule it is."""
    rule = DecodeOptions(max_len_a=1.5, max_len_b=10)
    assert (
        length_rule(rule, 64)
        == "1.5 x source + 10 tokens, within the model's 64 positions (aiayn's rule)"
    )
    fixed = DecodeOptions(max_len_a=0.0, max_len_b=20)
    imported = {"max_length": 21}
    assert length_rule(fixed, 512, imported) == (
        "at most 20 tokens, within the model's 512 positions (generation_config.json)"
    )
    capped = DecodeOptions(max_new_tokens=7)
    assert length_rule(capped, 64, {"num_beams": 4}) == (
        "at most 7 tokens, within the model's 64 positions "
        "(aiayn's rule: generation_config.json sets no max_length)"
    )


def test_sampling_given_without_a_beam_samples_and_with_one_is_refused():
    """given(sampling=True) on options of a beam (the defaults: 4) samples with beam 1 and
    keeps the other settings; a beam given with it is taken as given, so beam 4 with
    sampling is the usual refusal."""
    options = DecodeOptions(beam=5, n_best=2, alpha=0.8).given(sampling=True, top_k=3)
    assert (options.sampling, options.beam, options.n_best, options.top_k) == (True, 1, 2, 3)
    assert options.alpha == 0.8 and not options.greedy
    assert DecodeOptions().given(sampling=True, beam=None).beam == 1
    with pytest.raises(DecodeError, match="sampling draws one token at a time"):
        DecodeOptions().given(sampling=True, beam=4)
