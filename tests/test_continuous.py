"""Continuous batching: a ragged decoder state (rows at their own positions) and a beam
search that sentences join and leave between steps, each sentence getting exactly the
result of beam_search on its own."""

from __future__ import annotations

import random

import pytest
import torch

from aiayn import Transformer
from aiayn.decode import BeamEngine, DecodeOptions, beam_search
from aiayn.errors import DecodeError, ModelInputError
from conftest import random_batch, tiny_config


@pytest.fixture
def varied_model() -> Transformer:
    """The tiny model with EOS made competitive, so sentences end after different steps."""
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    with torch.no_grad():
        model.tgt_embed.weight[model.cfg.eos_id] *= 3.0
    return model


def sources(cfg, lengths, seed):
    src, _ = random_batch(cfg, lengths, [1] * len(lengths), seed=seed)
    return [src[i, :n] for i, n in enumerate(lengths)]


def padded(rows, pad_id):
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def summary(hyps):
    return [(h.tokens, h.score) for h in hyps]


def expected(hyps):
    """``summary`` of the offline result, scores to float noise: padding differs between a
    continuous batch and an offline one, which moves the last bits (rounding both sides to
    a fixed number of decimals can split two equal scores across a rounding boundary)."""
    return [(h.tokens, pytest.approx(h.score, rel=1e-4, abs=1e-4)) for h in hyps]


def test_ragged_rows_get_the_logits_of_their_own_decoding(tiny_model):
    """Row b joins after b steps of the others: at every step its logits are those of
    decoding it alone from its first step (positions, masks and cache are per row), also
    after the first row has left and the columns only it used were cropped."""
    cfg = tiny_model.cfg
    src, tgt = random_batch(cfg, [5, 2, 7], [6, 6, 6], seed=1)
    with torch.no_grad():
        alone = [
            tiny_model.decode(tgt[b : b + 1], tiny_model.encode(src[b : b + 1]), src[b : b + 1])
            for b in range(3)
        ]
        memory = tiny_model.encode(src)
        state, rows = tiny_model.start_state(memory[:1]), [0]
        for t in range(7):
            if t in (1, 2):  # row t joins now (its keys are padded to the batch's)
                state.join(tiny_model.start_state(memory[t : t + 1]))
                rows.append(t)
            if t == 6:  # row 0 has left after 6 steps: its cached columns go
                state.reorder(torch.tensor([1, 2]))
                state.crop(src.size(1))
                rows = [1, 2]
                assert state.offset == 5  # row 1, joined at step 1, has 5 cached keys
            prefix = torch.stack([tgt[b, t - b] for b in rows])[:, None]
            logits = tiny_model.decode(prefix, memory[rows], src[rows], state)[:, -1]
            for i, b in enumerate(rows):
                torch.testing.assert_close(logits[i], alone[b][0, t - b], atol=1e-5, rtol=1e-5)
    with pytest.raises(ModelInputError, match="one step at a time"):  # padded: row 0 joined
        tiny_model.decode(tgt[rows, :2], memory[rows], src[rows], state)


def test_a_state_whose_rows_realign_is_no_longer_padded(tiny_model):
    """Rows that started together decode unpadded (no mask: a plain cached step); a row
    that joins later pads the state, and once it is the only row left, the crop drops its
    padding and the state is plain again."""
    src, tgt = random_batch(tiny_model.cfg, [4, 3], [3, 3], seed=2)
    with torch.no_grad():
        memory = tiny_model.encode(src)
        state = tiny_model.start_state(memory[:1])
        tiny_model.decode(tgt[:1, :1], memory[:1], src[:1], state)
        assert state.keys is None and state.positions is None
        state.join(tiny_model.start_state(memory[1:]))
        assert state.keys is not None and state.keys.tolist() == [[True], [False]]
        tiny_model.decode(tgt[:, 1:2], memory, src, state)
        state.reorder(torch.tensor([1]))
        state.crop(src.size(1))
        assert state.keys is None and state.offset == 1


@pytest.mark.parametrize("cut_at_limit", [False, True])
def test_joining_sentences_get_their_beam_search_results(varied_model, cut_at_limit):
    """Each sentence gets its offline n-best (under both rules at the length limit)."""
    cfg = varied_model.cfg
    rng = random.Random(0)
    rows = sources(cfg, [rng.randint(1, 12) for _ in range(30)], seed=3)
    options = DecodeOptions(beam=3, n_best=3, max_len_b=10, cut_at_limit=cut_at_limit)
    want = [beam_search(varied_model, r[None], options)[0] for r in rows]
    assert any(not h.eos for w in want for h in w) == cut_at_limit  # some cut at the limit
    search = BeamEngine(varied_model, options)
    got, joined_running, next_row, steps = {}, 0, 0, 0
    while next_row < len(rows) or len(search):
        n = rng.randint(0, 3)  # 0-3 sentences join before each step
        if next_row < len(rows) and (n or not len(search)):
            batch = rows[next_row : next_row + max(n, 1)]
            joined_running += bool(len(search))
            search.add(padded(batch, cfg.pad_id), range(next_row, next_row + len(batch)))
            next_row += len(batch)
        for tag, hyps in search.step():
            got[tag] = hyps[:3]
        steps += 1
        if len(search):  # the prefix lines up with the cache; no column is all padding
            state = search.rows.states[0]
            assert search.decoded.size(1) == state.offset + 1
            assert state.keys is None or bool(state.keys[:, 0].any())
            assert bool((search.rows.src[:, -1] != cfg.pad_id).any())
    assert joined_running > 10 and steps < 150
    assert [summary(got[i]) for i in range(len(rows))] == [expected(w) for w in want]


def test_finished_sentences_leave_at_once_and_their_padding_goes(tiny_model):
    """A (long source) starts, B (short source) joins two steps later; with EOS out of
    reach both run to their limit of 6 tokens. A leaves after its 6th step while B goes on:
    the batch keeps B's rows only, cropped to B's source and B's cached steps."""
    cfg = tiny_model.cfg
    with torch.no_grad():
        tiny_model.tgt_embed.weight[cfg.eos_id] = -100.0
    a, b = sources(cfg, [9, 2], seed=11)
    search = BeamEngine(tiny_model, DecodeOptions(beam=2, max_len_a=0.0, max_len_b=6))
    search.add(padded([a], cfg.pad_id), ["A"])
    done = [search.step(), search.step()]
    search.add(padded([b], cfg.pad_id), ["B"])
    assert search.width == 9 and search.decoded.shape == (4, 3)
    while len(search):
        done.append(search.step())
        if len(done) == 6:  # A's 6th step: it leaves now, B has taken 4 steps
            assert [tag for tag, _ in done[-1]] == ["A"] and len(search) == 1
            assert search.width == 2 and search.rows.memory[0].shape[:2] == (1, 2)
            assert search.rows.states[0].offset == 4 and search.decoded.shape == (2, 5)
    assert len(done) == 8 and [tag for tag, _ in done[-1]] == ["B"]
    results = dict(pair for step in done for pair in step)
    for tag, src in (("A", a), ("B", b)):
        want = beam_search(
            tiny_model, src[None], beam_size=2, max_len_a=0.0, max_len_b=6, n_best=2
        )[0]
        assert summary(results[tag][:2]) == expected(want)
        assert len(want[0].tokens) == 5  # the limit of 6 counts the EOS


def test_remove_and_a_failing_step(varied_model):
    cfg = varied_model.cfg
    rows = sources(cfg, [4, 6, 3], seed=2)
    search = BeamEngine(varied_model, DecodeOptions(beam=2, max_len_b=20))
    search.add(padded(rows, cfg.pad_id), ["a", "b", "c"])
    search.step()
    search.remove({"b"})
    assert len(search) == 2 and [u.tag for u in search.units] == ["a", "c"]
    results = {}
    while len(search):
        results.update(search.step())
    want = beam_search(
        varied_model, padded([rows[0], rows[2]], cfg.pad_id), beam_size=2, max_len_b=20
    )
    assert summary(results["a"][:1]) == expected(want[0])
    assert summary(results["c"][:1]) == expected(want[1])
    search.add(padded(rows, cfg.pad_id), [1, 2, 3])
    search.step()
    with pytest.raises(ModelInputError):  # a bad source is refused; the batch goes on
        search.add(torch.full((1, 3), 10_000, dtype=torch.long), [4])
    assert len(search) == 3
    cache = search.rows.states[0].layers[0].self_attn
    cache.keys = cache.keys[:1]  # break the state: the next step raises
    with pytest.raises((RuntimeError, IndexError)):
        search.step()
    assert len(search) == 0 and search.step() == []  # dropped, ready for a new batch
    with pytest.raises(DecodeError):
        BeamEngine(varied_model, 2)  # type: ignore[arg-type]  # options, not a beam size
    with pytest.raises(DecodeError, match="beam search does not sample"):
        BeamEngine(varied_model, DecodeOptions(sampling=True, beam=1), one_per_row=False)


def test_a_pad_id_inside_a_source_is_not_cropped(tiny_model):
    """A Marian source whose text holds "<pad>" has the pad id mid-sentence. When the
    longer sentence beside it leaves, the batch is cropped to the longest source left:
    counted up to its last real id, not as its number of non-pad ids (which would cut its
    last column, here its EOS-like final token), so it gets its offline result."""
    cfg = tiny_model.cfg
    with torch.no_grad():
        tiny_model.tgt_embed.weight[cfg.eos_id] = -100.0  # both run to their limit of 6
    (a,) = sources(cfg, [9], seed=11)
    b = torch.tensor([7, 8, cfg.pad_id, 9, 10])  # 5 positions, 4 of them not pad
    options = DecodeOptions(beam=2, n_best=2, max_len_a=0.0, max_len_b=6)
    search = BeamEngine(tiny_model, options)
    search.add(padded([a], cfg.pad_id), ["A"])
    done = [search.step(), search.step()]
    search.add(padded([b], cfg.pad_id), ["B"])
    while len(search):
        done.append(search.step())
        if len(search) == 1:
            assert search.width == 5  # cropped to B's whole source
    results = dict(pair for step in done for pair in step)
    want = beam_search(tiny_model, b[None], options)[0]
    assert summary(results["B"][:2]) == expected(want)
