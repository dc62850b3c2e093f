"""Edges of the decoders, through their public entry points only (greedy, beam_search,
search, DecodeOptions), so that they hold for any implementation: the ways of giving a
length, forced prefixes past the length limit and holding token id 0, an empty batch,
every row ending at once, and samples seeded by their line index."""

from __future__ import annotations

import copy

import pytest
import torch

from aiayn import Transformer
from aiayn.decode import DecodeOptions, beam_search, greedy, length_penalty, search
from aiayn.errors import DecodeError
from conftest import random_batch, tiny_config


def test_an_int_in_place_of_options_is_refused(tiny_model):
    """Issue 41: options are a DecodeOptions or nothing; lengths go by keyword. The random
    tiny model never says EOS: every output runs to its limit."""
    src, _ = random_batch(tiny_model.cfg, [5, 3], [1, 1], seed=2)
    assert greedy(tiny_model, src, max_new_tokens=5).shape == (2, 5)
    limited = greedy(tiny_model, src, DecodeOptions(max_new_tokens=5), max_new_tokens=3)
    assert limited.shape == (2, 3)  # the keyword wins over the options
    with pytest.raises(DecodeError, match="options must be a DecodeOptions, got int"):
        greedy(tiny_model, src, 5)  # type: ignore[arg-type]
    with pytest.raises(DecodeError) as e:
        greedy(tiny_model, src, DecodeOptions(beam=1, sampling=True))
    assert str(e.value) == "greedy decoding does not sample: use aiayn.decode.search"


@pytest.mark.parametrize("beam", [1, 3])
def test_a_prefix_longer_than_the_limit_is_forced_whole_then_eos(tiny_model, beam):
    src, _ = random_batch(tiny_model.cfg, [5, 3], [1, 1], seed=2)
    prefix = [[5, 6, 7, 8], [9]]
    options = DecodeOptions(beam=beam, max_len_a=0.0, max_len_b=2)
    if beam == 1:
        out = greedy(tiny_model, src, options, prefix=prefix).tolist()
        assert out[0][:4] == [5, 6, 7, 8] and out[1][0] == 9
        assert len(out[0]) == 5  # the limit raised to the prefix and one more token
    hyps = search(tiny_model, src, options, prefix=prefix)
    assert hyps[0][0].tokens[:4] == [5, 6, 7, 8] and hyps[1][0].tokens[:1] == [9]
    assert len(hyps[0][0].tokens) <= 5 and len(hyps[1][0].tokens) <= 2


@pytest.mark.parametrize("beam", [1, 3])
def test_token_id_0_can_be_forced(beam):
    """In a vocabulary whose special ids are elsewhere, id 0 is a token like any other."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(pad_id=2, bos_id=1, eos_id=3)).eval()
    src = torch.tensor([[5, 6, 7, 8]])
    hyps = search(model, src, DecodeOptions(beam=beam, max_len_b=6), prefix=[[0, 0, 4]])
    assert hyps[0][0].tokens[:3] == [0, 0, 4]


def test_an_empty_batch_gives_empty_outputs(tiny_model):
    src = torch.empty(0, 4, dtype=torch.long)
    assert greedy(tiny_model, src).shape == (0, 0)
    for options in (
        DecodeOptions(beam=1),
        DecodeOptions(beam=3),
        DecodeOptions(beam=1, sampling=True, n_best=2, seed=1),
    ):
        assert search(tiny_model, src, options) == []  # was a ZeroDivisionError


def test_rows_that_all_end_at_once_leave_no_empty_columns():
    """Every row says EOS first: one column, however long the limit."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(output_bias=True)).eval()
    with torch.no_grad():
        model.out_bias[model.cfg.eos_id] = 100.0
    src, _ = random_batch(model.cfg, [5, 2, 4], [1, 1, 1])
    out = greedy(model, src, max_new_tokens=9)
    assert out.tolist() == [[model.cfg.eos_id]] * 3
    for hyps in beam_search(model, src, beam_size=3, max_len_b=9):
        assert hyps[0].tokens == [] and hyps[0].eos


def test_samples_are_seeded_by_line_index_not_batch_row(tiny_model):
    src, _ = random_batch(tiny_model.cfg, [5, 3, 6], [1, 1, 1], seed=5)
    options = DecodeOptions(beam=1, sampling=True, n_best=2, seed=11, max_len_b=6)
    whole = search(tiny_model, src, options)
    alone = search(tiny_model, src[2:], options, lines=[2])
    assert [h.tokens for h in alone[0]] == [h.tokens for h in whole[2]]
    moved = search(tiny_model, src[2:], options, lines=[0])
    assert [h.tokens for h in moved[0]] != [h.tokens for h in whole[2]]  # the line counts
    with pytest.raises(DecodeError) as e:
        search(tiny_model, src, options, lines=[0, 1])
    assert str(e.value) == "2 line indices for 3 sentences"


def test_length_penalties_and_the_scores_they_give(tiny_model):
    assert length_penalty(7, 0.6) == pytest.approx((12 / 6) ** 0.6)  # GNMT, the default
    assert length_penalty(7, 0.6, "gnmt") == length_penalty(7, 0.6)
    assert length_penalty(7, 1.5, "hf") == pytest.approx(7**1.5)
    assert length_penalty(7, 0.0, "hf") == length_penalty(7, 0.0) == 1.0
    src, _ = random_batch(tiny_model.cfg, [5, 3], [1, 1], seed=2)
    for kind in ("gnmt", "hf"):
        options = DecodeOptions(beam=3, n_best=3, alpha=1.3, length_penalty=kind, max_len_b=4)
        for hyps in search(tiny_model, src, options):
            for h in hyps:  # EOS counts in the length (forced or not, it ends each here)
                lp = length_penalty(len(h.tokens) + 1, 1.3, kind)
                assert h.score == pytest.approx(h.log_prob / lp)


def test_beam_search_takes_its_size_by_keyword_and_refuses_sampling(tiny_model):
    src, _ = random_batch(tiny_model.cfg, [5, 3], [1, 1], seed=2)
    sized = beam_search(tiny_model, src, beam_size=3, n_best=3, max_len_b=4)
    assert [len(h) for h in sized] == [3, 3]
    same = beam_search(tiny_model, src, DecodeOptions(beam=3, n_best=3, max_len_b=4))
    assert [[x.tokens for x in h] for h in sized] == [[x.tokens for x in h] for h in same]
    options = DecodeOptions(beam=3, n_best=3)
    assert [len(h) for h in beam_search(tiny_model, src, options, beam_size=4)] == [3, 3]
    with pytest.raises(DecodeError):  # the keyword's beam 2 wins: n_best 3 is more than it holds
        beam_search(tiny_model, src, options, beam_size=2)
    with pytest.raises(DecodeError, match="options must be a DecodeOptions, got int"):
        beam_search(tiny_model, src, 3)  # type: ignore[arg-type]
    with pytest.raises(DecodeError) as e:
        beam_search(tiny_model, src, DecodeOptions(beam=1, sampling=True))
    assert str(e.value) == "beam search does not sample: use aiayn.decode.search"


def test_searching_longer_never_finds_worse():
    """From the same beams, early_stopping True stops at the first K endings, False (the
    Hugging Face heuristic) once the best running beam at its current length cannot win,
    "never" once no continuation can: each goes on from where the one before stopped, so
    its best is at least as good. alpha 2 favours the long outputs found late."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(output_bias=True)).eval()
    with torch.no_grad():
        model.out_bias[model.cfg.eos_id] = 1.5  # some sentences end at once, some late
    src, _ = random_batch(model.cfg, [5, 2, 7, 4, 3, 6, 1, 5], [1] * 8, seed=1)
    best = {}
    for stop in (True, False, "never"):
        options = DecodeOptions(beam=3, n_best=3, alpha=2.0, max_len_b=10, early_stopping=stop)
        best[stop] = [hyps[0].score for hyps in search(model, src, options)]
    for first, then, never in zip(best[True], best[False], best["never"]):
        assert first <= then + 1e-9 and then <= never + 1e-9
    assert any(n > f + 1e-3 for f, n in zip(best[True], best["never"]))  # it matters here


def test_a_shared_source_row_equals_its_copies_over_several_steps(tiny_model):
    """A state of G target rows per source row (the beams of a sentence sharing its
    encoder-decoder keys/values) gives the logits and the attention weights of a state
    holding G copies of each source, also when several steps are fed at once (G*T
    queries attend together, then split back to their rows)."""
    cfg, G = tiny_model.cfg, 2
    src, _ = random_batch(cfg, [5, 3], [1, 1], seed=4)  # two sentences
    _, tgt_in = random_batch(cfg, [1] * 4, [4] * 4, seed=5)  # G = 2 rows each: [4, 4]
    with torch.inference_mode():
        memory = tiny_model.encode(src)
        shared, copies = (
            tiny_model.start_state(memory, G),
            tiny_model.start_state(memory.repeat_interleave(G, dim=0), 1),
        )
        want: dict[str, list[torch.Tensor]] = {"decoder_self": [], "cross": []}
        got: dict[str, list[torch.Tensor]] = {"decoder_self": [], "cross": []}
        for a, b in ((0, 1), (1, 4)):  # one step, then three at once
            step = tgt_in[:, a:b]
            reps = memory.repeat_interleave(G, dim=0), src.repeat_interleave(G, dim=0)
            expected = tiny_model.decode(step, *reps, copies, weights=want)
            found = tiny_model.decode(step, memory, src, shared, weights=got)
            torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-5)
    for kind in want:
        for w_got, w_want in zip(got[kind], want[kind], strict=True):
            assert w_got.shape == w_want.shape
            torch.testing.assert_close(w_got, w_want, rtol=1e-5, atol=1e-6)


def test_states_that_stepped_apart_join_and_go_on_as_alone(tiny_model):
    """Rows with cached keys of different lengths join one state (the shorter cache is
    left-padded with masked columns): the next step of each row gives the logits it would
    have given alone."""
    src, tgt = random_batch(tiny_model.cfg, [5, 3], [4, 4], seed=6)
    with torch.inference_mode():
        memory = tiny_model.encode(src)
        a, b = tiny_model.start_state(memory[:1]), tiny_model.start_state(memory[1:])
        for t in range(3):  # a takes three steps, b one
            tiny_model.decode(tgt[:1, t : t + 1], memory[:1], src[:1], a)
        tiny_model.decode(tgt[1:, :1], memory[1:], src[1:], b)
        alone_a = tiny_model.decode(tgt[:1, 3:4], memory[:1], src[:1], copy.deepcopy(a))
        alone_b = tiny_model.decode(tgt[1:, 1:2], memory[1:], src[1:], copy.deepcopy(b))
        a.join(b)
        both = tiny_model.decode(torch.cat([tgt[:1, 3:4], tgt[1:, 1:2]]), memory, src, a)
    torch.testing.assert_close(both[:1], alone_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(both[1:], alone_b, rtol=1e-5, atol=1e-5)


def test_a_source_of_max_len_tokens_is_taken_whole(sample_model_dir):
    """The encoder has ``max_len`` positions: a line of that many tokens is decoded whole,
    as ``generate()`` takes it (one position was kept free, which dropped a real token);
    a longer line is cut to them."""
    from aiayn.translator import Translator

    translator = Translator.from_dir(sample_model_dir())
    max_len, tok = translator.model.cfg.max_len, translator.tokenizer
    ids = tok.encode(" ".join(["Ein Hund rennt."] * max_len))[:max_len]
    assert len(ids) == max_len == translator.max_source_tokens
    line = tok.decode(ids)
    assert translator.encode(line) == ids and translator.encode(line + " Hund") == ids
    options = DecodeOptions(beam=2, max_len_b=5)
    ((hyp, *_),) = translator.hypotheses([ids], options)
    ((want, *_),) = search(translator.model, torch.tensor([ids]), options)
    assert hyp.tokens == want.tokens
    assert translator.translate([line], options) == [[tok.decode(want.tokens)]]
