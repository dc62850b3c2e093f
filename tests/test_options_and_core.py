"""What decode/options.py and decode/core.py promise, checked without a trained model (issue
45, their mutation scores): generation settings read as generate() reads them, a setting
given replacing the rule it is part of, and the searches' shared parts (length limits,
forced prefixes, bans, the ensemble's model checks) on tensors built by hand. Milliseconds."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn import Transformer
from aiayn.decode.core import DecodeStep, as_list, banned_ids, check_src, forced_ids, length_limits
from aiayn.decode.options import DecodeOptions, length_rule, sets_length
from aiayn.errors import DecodeError
from conftest import random_batch, tiny_config

# -- generation settings -------------------------------------------------------------------

# What generate() does with no settings at all: greedy, |Y|^1.0, the heuristic early stop,
# outputs cut at the limit (no forced EOS id), aiayn's length rule (no max_length given).
GENERATE_DEFAULTS = DecodeOptions(
    beam=1, alpha=1.0, length_penalty="hf", early_stopping=False, cut_at_limit=True
)


def test_generation_settings_left_out_take_transformers_defaults():
    assert DecodeOptions.from_generation({}) == GENERATE_DEFAULTS
    nulls = dict.fromkeys(("num_beams", "length_penalty", "early_stopping", "do_sample"))
    assert DecodeOptions.from_generation(nulls) == GENERATE_DEFAULTS


def test_generation_settings_of_a_beam_search_are_each_read():
    settings = {
        "num_beams": 5,
        "length_penalty": 1.5,
        "num_return_sequences": 2,
        "early_stopping": True,
        "max_length": 40,
    }
    assert DecodeOptions.from_generation(settings) == GENERATE_DEFAULTS.replace(
        beam=5, alpha=1.5, n_best=2, early_stopping=True, max_len_a=0.0, max_len_b=39
    )
    never = DecodeOptions.from_generation({"num_beams": 2, "early_stopping": "never"})
    assert never.early_stopping == "never" and never.beam == 2


def test_sampling_settings_are_read_only_with_do_sample():
    """do_sample: one token drawn at a time (beam 1), top_k 50 unless set (generate()'s
    default); without it generate() searches and ignores temperature, top_k and top_p."""
    drawn = DecodeOptions.from_generation({"do_sample": True})
    assert drawn == GENERATE_DEFAULTS.replace(sampling=True, top_k=50)
    settings = {"temperature": 0.7, "top_k": 0, "top_p": 0.9, "num_return_sequences": 3}
    assert DecodeOptions.from_generation({"do_sample": True, **settings}) == (
        GENERATE_DEFAULTS.replace(sampling=True, temperature=0.7, top_p=0.9, n_best=3)
    )
    searched = DecodeOptions.from_generation({"do_sample": False, **settings, "num_beams": 3})
    assert searched == GENERATE_DEFAULTS.replace(beam=3, n_best=3)


def test_max_new_tokens_alone_gives_the_length():
    assert sets_length({"max_new_tokens": 5}) and sets_length({"max_length": 5})
    assert not sets_length({"max_new_tokens": None, "num_beams": 4}) and not sets_length(None)
    options = DecodeOptions.from_generation({"max_new_tokens": 5})
    assert (options.max_len_a, options.max_len_b) == (0.0, 5)


def test_generation_settings_that_are_not_a_mapping_are_named():
    with pytest.raises(DecodeError) as e:
        DecodeOptions.from_generation([1, 2])  # type: ignore[arg-type]
    assert str(e.value) == "generation settings: a mapping, not list"


# -- given(): a setting replaces the rule it is part of --------------------------------------

SAMPLER = DecodeOptions(
    beam=1, n_best=3, sampling=True, temperature=0.7, top_k=50, top_p=0.9, alpha=1.0
)
SEARCH = DecodeOptions(beam=1, n_best=1, alpha=1.0)  # SAMPLER with sampling's rule dropped


def test_sampling_turned_off_drops_its_settings_and_samples():
    """Without a beam given the beam stays 1, so the number of samples becomes 1."""
    assert SAMPLER.given(sampling=False) == SEARCH
    assert SAMPLER.given(sampling=False, beam=5) == SEARCH.replace(beam=5, n_best=3)
    assert SAMPLER.given(sampling=False, n_best=2, beam=4) == SEARCH.replace(beam=4, n_best=2)


@pytest.mark.parametrize("beam", [2, 4])
def test_a_beam_over_one_without_sampling_given_turns_sampling_off(beam):
    """n_best (the number of samples) is kept up to the beam."""
    assert SAMPLER.given(beam=beam) == SEARCH.replace(beam=beam, n_best=min(3, beam))
    assert SAMPLER.given(beam=1) == SAMPLER  # beam 1 is sampling's own: nothing turned off
    with pytest.raises(DecodeError, match="sampling draws one token at a time"):
        SAMPLER.given(beam=beam, sampling=True)


@pytest.mark.parametrize("beam", ["4", 2.5])
def test_a_beam_of_the_wrong_type_given_with_sampling_off_is_a_decode_error(beam):
    with pytest.raises(DecodeError, match="must be an integer >= 1"):
        SAMPLER.given(sampling=False, beam=beam)


def test_forced_eos_and_cut_at_limit_given_each_turn_the_other_off():
    cut = DecodeOptions(cut_at_limit=True)
    assert cut.given(forced_eos=True) == DecodeOptions(forced_eos=True)
    assert DecodeOptions(forced_eos=True).given(cut_at_limit=True) == cut
    with pytest.raises(DecodeError, match="set at most one"):
        cut.given(forced_eos=True, cut_at_limit=True)


# -- refusals: one DecodeError naming the setting ------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"beam": 0}, "beam must be an integer >= 1, got 0"),
        ({"beam": True}, "beam must be an integer >= 1, got True"),
        ({"n_best": 0}, "n_best must be an integer >= 1, got 0"),
        ({"max_len_b": -1}, "max_len_b must be an integer >= 0, got -1"),
        ({"max_new_tokens": -1}, "max_new_tokens must be an integer >= 0, got -1"),
        ({"top_k": -1}, "top_k must be an integer >= 0, got -1"),
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"alpha": float("nan")}, "alpha must be a finite number >= 0, got nan"),
        ({"max_len_a": -0.5}, "max_len_a must be a finite number >= 0, got -0.5"),
        ({"length_penalty": "fairseq"}, "length_penalty must be one of gnmt, hf, got 'fairseq'"),
        (
            {"early_stopping": "always"},
            "early_stopping must be true, false or 'never', got 'always'",
        ),
        ({"sampling": "yes"}, "sampling must be true or false, got 'yes'"),
        ({"forced_eos": 1}, "forced_eos must be true or false, got 1"),
        ({"cut_at_limit": None}, "cut_at_limit must be true or false, got None"),
        (
            {"forced_eos": True, "cut_at_limit": True},
            "forced_eos ends an output at its length limit with EOS and cut_at_limit without "
            "one: set at most one",
        ),
        ({"prefix": 3}, "prefix must be text, got int"),
        ({"top_k": 5}, "top_k=5 only applies with sampling, which is off"),
        (
            {"temperature": 0.5, "top_p": 0.9},
            "temperature=0.5, top_p=0.9 only apply with sampling, which is off",
        ),
    ],
)
def test_a_setting_out_of_range_is_one_decode_error_naming_it(settings, message):
    with pytest.raises(DecodeError) as e:
        DecodeOptions(**settings)
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"temperature": 0.0}, "temperature must be a finite number > 0, got 0.0"),
        ({"temperature": float("inf")}, "temperature must be a finite number > 0, got inf"),
        ({"temperature": "hot"}, "temperature must be a finite number > 0, got hot"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
        ({"top_p": True}, "top_p must be in (0, 1], got True"),
        ({"top_p": "0.5"}, "top_p must be in (0, 1], got 0.5"),
    ],
)
def test_sampling_settings_out_of_range_are_refused(settings, message):
    with pytest.raises(DecodeError) as e:
        DecodeOptions(beam=1, sampling=True, **settings)
    assert str(e.value) == message


def test_the_edges_of_the_ranges_are_taken():
    DecodeOptions(beam=1, sampling=True, seed=0, top_p=1.0, top_k=0, temperature=1e-3)
    DecodeOptions(max_len_b=0, max_new_tokens=0, alpha=0.0, max_len_a=0.0)


def test_replace_names_every_field_it_does_not_have():
    with pytest.raises(DecodeError) as e:
        DecodeOptions().replace(beem=3, bam=1)
    assert str(e.value) == "DecodeOptions has no field bam, beem"


# -- generation lengths, forced EOS, the length rule, sampling given -----------------------


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
    # A cap above the rule's least: the rule holds below it (it said "at most 100 tokens",
    # and a 3-token source got at most 53).
    assert length_rule(DecodeOptions(max_new_tokens=100), 512) == (
        "1 x source + 50 tokens, at most 100, within the model's 512 positions (aiayn's rule)"
    )
    assert length_rule(DecodeOptions(max_len_a=0.0, max_len_b=20, max_new_tokens=9), 64) == (
        "at most 9 tokens, within the model's 64 positions (aiayn's rule)"
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


# -- core: length limits, forced prefixes, the decode step -------------------------------------


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ((-1, 1.0, 5), "max_new_tokens must be >= 0, got -1"),
        ((None, -1.0, 5), "need max_len_a >= 0 and max_len_b >= 0, got -1.0, 5"),
        ((None, math.inf, 5), "need max_len_a >= 0 and max_len_b >= 0, got inf, 5"),
        ((None, 1.0, -1), "need max_len_a >= 0 and max_len_b >= 0, got 1.0, -1"),
    ],
)
def test_a_length_rule_out_of_range_is_refused(limits, message):
    src = torch.tensor([[4, 5, 2]])
    with pytest.raises(DecodeError) as e:
        length_limits(tiny_config(), src, *limits)
    assert str(e.value) == message


def test_length_limits_are_token_counts_even_for_no_sentences():
    src = torch.zeros(0, 3, dtype=torch.long)
    limits = length_limits(tiny_config(), src)
    assert limits.dtype == torch.long and limits.shape == (0,)


def test_prefix_ids_outside_the_vocabulary_name_the_largest():
    cfg = tiny_config()  # 29 target tokens: ids 0..28
    assert forced_ids([[28, 5]], cfg, 1) == [[28, 5]]
    for prefix, bad in (([[5, 29]], 29), ([[-1, 5], [40, 29]], 40)):
        with pytest.raises(DecodeError) as e:
            forced_ids(prefix, cfg, len(prefix))
        assert str(e.value) == f"prefix: id {bad} is outside the target vocabulary [0, 29)"


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ([[5, 2.0]], "prefix: per sentence, a sequence of token ids (integers)"),
        *(([[5, i]], "prefix: EOS, PAD and BOS cannot be forced") for i in (0, 1, 2)),
    ],
)
def test_prefixes_that_cannot_be_forced_are_refused(prefix, message):
    with pytest.raises(DecodeError) as e:
        forced_ids(prefix, tiny_config(), 1)
    assert str(e.value) == message


def _models(n: int, **overrides) -> list[Transformer]:
    models = []
    for seed in range(n):
        torch.manual_seed(seed)
        models.append(Transformer(tiny_config(**overrides)).eval())
    return models


@torch.no_grad()
def test_an_ensemble_step_is_the_log_of_the_mean_probability():
    """fairseq's rule: log(mean_m p_m(token)) over each row's vocabulary."""
    models = _models(2)
    src, tgt = random_batch(models[0].cfg, [5, 3, 4], [4, 4, 4])
    step = DecodeStep(models, src, use_cache=False)
    got = step.logits(tgt)
    probs = [torch.softmax(m(src, tgt)[:, -1].float(), dim=-1) for m in models]
    want = torch.log((probs[0] + probs[1]) / 2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.allclose(got.exp().sum(-1), torch.ones(3))


@torch.no_grad()
def test_only_cached_rows_can_join():
    model = _models(1)[0]
    src, _ = random_batch(model.cfg, [3, 4], [1, 1])
    cached, uncached = DecodeStep(model, src), DecodeStep(model, src, use_cache=False)
    for a, b in ((cached, uncached), (uncached, cached)):
        with pytest.raises(DecodeError) as e:
            a.join(b)
        assert str(e.value) == "only cached rows can join a running search"


@torch.no_grad()
def test_joined_sources_are_padded_with_the_models_pad_id():
    """A model whose PAD is not 0: the shorter sources are padded with its PAD, which the
    padding mask hides (padded with 0, a real token, they would be attended to)."""
    (model,) = _models(1, pad_id=3)
    src = torch.tensor([[5, 6, 2]])
    longer = torch.tensor([[5, 6, 7, 8, 2]])
    step = DecodeStep(model, src)
    step.join(DecodeStep(model, longer))
    assert step.src.tolist() == [[5, 6, 2, 3, 3], [5, 6, 7, 8, 2]]


def test_models_that_cannot_be_ensembled_are_named():
    one, other = _models(1)[0], _models(1, tgt_vocab_size=31)[0]
    assert as_list(one) == [one] and as_list((one, one)) == [one, one]
    with pytest.raises(DecodeError) as e:
        as_list([])
    assert str(e.value) == "no model to decode with"
    with pytest.raises(DecodeError) as e:
        as_list([one, "model.pt"])  # type: ignore[list-item]
    assert str(e.value) == "model 2 is a str, not a Transformer"
    with pytest.raises(DecodeError) as e:
        as_list([one, other, one])
    assert str(e.value) == (
        "ensemble: model 2 has tgt_vocab_size=31 but model 1 has 29; ensembled models need "
        "one target vocabulary"
    )
    with pytest.raises(DecodeError, match="model 3 has eos_id=4 but model 1 has 2"):
        as_list([one, one, _models(1, eos_id=4)[0]])
    with torch.device("meta"):
        meta = Transformer(tiny_config())
    with pytest.raises(DecodeError) as e:
        as_list([one, meta])
    assert str(e.value) == "model 2 is on the meta device, which holds no weights"
    partly = _models(1)[0]
    partly.decoder.to("meta")  # its decoder alone: torch's device error from deep inside
    with pytest.raises(DecodeError, match="model 1 is on the meta device"):
        as_list(partly)
    tables = _models(1)[0]
    tables.tgt_pos.to("meta")  # a buffer alone: the positions' table
    with pytest.raises(DecodeError, match="model 1 is on the meta device"):
        as_list(tables)


@pytest.mark.parametrize(
    ("src", "message"),
    [
        (
            torch.tensor([4, 5, 2]),
            "src must be a [batch, length] tensor of token ids, got a 1-D tensor",
        ),
        ([[4, 5, 2]], "src must be a [batch, length] tensor of token ids, got list"),
        (torch.empty(1, 3, device="meta"), "src is on the meta device, which holds no ids"),
    ],
)
def test_a_source_that_is_not_a_batch_of_ids_is_named(src, message):
    with pytest.raises(DecodeError) as e:
        check_src(src)
    assert str(e.value) == message
    check_src(torch.tensor([[4, 5, 2]]))


def test_pad_and_bos_are_banned_once_each():
    assert banned_ids(tiny_config(), torch.device("cpu")).tolist() == [0, 1]
    assert banned_ids(tiny_config(bos_id=0), torch.device("cpu")).tolist() == [0]


@torch.no_grad()
def test_a_bfloat16_model_steps_many_rows_in_its_own_dtype():
    """From 16 rows a CPU forms the projection blockwise in scratch memory, which must be in
    the model's dtype: a bfloat16 model's first step gives the logits of a full decode."""
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval().to(torch.bfloat16)
    src, _ = random_batch(model.cfg, [5] * 20, [1] * 20)
    decoded = torch.full((20, 1), model.cfg.bos_id)
    got = DecodeStep(model, src).logits(decoded)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, model(src, decoded)[:, -1])


def test_beam_sampling_is_refused_not_sampled_with_one_beam():
    """do_sample with num_beams > 1 is generate()'s beam sampling, which aiayn's searches do
    not do: refused, where it sampled with one beam as if num_beams were 1."""
    with pytest.raises(DecodeError, match="num_beams 4 with do_sample: aiayn samples without"):
        DecodeOptions.from_generation({"do_sample": True, "num_beams": 4})
    assert DecodeOptions.from_generation({"do_sample": True, "num_beams": 1}).beam == 1
