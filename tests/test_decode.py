"""Greedy and beam search: agreement with teacher forcing, the cache, and overfitting."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from aiayn import Transformer
from aiayn.decode import (
    DecodeOptions,
    beam_search,
    greedy,
    inference,
    length_limits,
    length_penalty,
    search,
)
from aiayn.decode.core import DecodeStep
from aiayn.errors import AiaynError, DecodeError, ModelInputError
from aiayn.model import DecoderState, projection
from aiayn.train.loss import label_smoothed_cross_entropy
from conftest import random_batch, tiny_config

PAIRS = [  # (source ids, target ids): no specials, arbitrary "translations"
    ([5, 6, 7], [9, 10, 11, 12]),
    ([8, 9], [20, 3, 4]),
    ([10, 11, 12, 13, 14], [7]),
    ([15, 5, 15, 5], [25, 26, 25, 26, 25]),
    ([20, 21, 22], [13, 14, 15]),
    ([7, 7], [16, 17, 18, 19, 20, 21]),
]


def pad_rows(rows, pad=0):
    out = torch.full((len(rows), max(map(len, rows))), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out


@pytest.fixture(scope="module")
def overfit_model() -> Transformer:
    """A tiny model trained until it reproduces PAIRS (a few seconds on a CPU)."""
    torch.manual_seed(0)
    cfg = tiny_config(d_model=64, d_ff=128)
    model = Transformer(cfg)
    src = pad_rows([s for s, _ in PAIRS])
    tgt_in = pad_rows([[cfg.bos_id, *t] for _, t in PAIRS])
    tgt_out = pad_rows([[*t, cfg.eos_id] for _, t in PAIRS])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    for _ in range(300):
        loss, _, n = label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, epsilon=0.0)
        optimizer.zero_grad()
        (loss / n).backward()
        optimizer.step()
    return model.eval()


def test_tiny_model_overfits_to_exact_reproduction(overfit_model):
    cfg = overfit_model.cfg
    out = greedy(overfit_model, pad_rows([s for s, _ in PAIRS]), max_new_tokens=10)
    for row, (_, target) in zip(out.tolist(), PAIRS):
        assert row[: len(target) + 1] == [*target, cfg.eos_id]
        assert all(t == cfg.pad_id for t in row[len(target) + 1 :])  # pad after EOS
    hyps = beam_search(overfit_model, pad_rows([s for s, _ in PAIRS]), beam_size=4)
    assert [h[0].tokens for h in hyps] == [t for _, t in PAIRS]


def test_greedy_agrees_with_teacher_forcing(overfit_model):
    cfg = overfit_model.cfg
    src, _ = random_batch(cfg, [5, 3, 7], [1, 1, 1], seed=3)  # unseen inputs
    out = greedy(overfit_model, src, max_new_tokens=12)
    tgt_in = torch.cat([torch.full((3, 1), cfg.bos_id), out], dim=1)
    tgt_in = tgt_in.masked_fill(tgt_in == cfg.eos_id, cfg.pad_id)  # nothing fed after EOS
    with torch.no_grad():
        logits = overfit_model(src, tgt_in)[:, :-1]
    logits[..., [cfg.pad_id, cfg.bos_id]] = float("-inf")
    real = torch.cat([torch.ones(3, 1, dtype=torch.bool), out[:, :-1] != cfg.eos_id], 1)
    real &= torch.cat([torch.ones(3, 1, dtype=torch.bool), out[:, :-1] != cfg.pad_id], 1)
    assert real.sum() > 6
    assert torch.equal(logits.argmax(-1)[real], out[real])


def test_greedy_shape_and_padding_contract():
    """Rows that end early are padded after their EOS while the others run on. A random
    model rarely says EOS, so EOS's output bias is raised to the median of the first
    step's margins: about half the rows end at once, the rest never do."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(output_bias=True)).eval()
    cfg = model.cfg
    src, _ = random_batch(cfg, [5, 2, 7, 4, 3, 6, 1, 5], [1] * 8, seed=1)
    with torch.no_grad():
        first = model(src, torch.full((8, 1), cfg.bos_id))[:, 0]
        first[:, [cfg.pad_id, cfg.bos_id]] = float("-inf")
        model.out_bias[cfg.eos_id] = (first.max(-1).values - first[:, cfg.eos_id]).median()
    out = greedy(model, src, max_new_tokens=7)
    assert out.dtype == torch.long and out.shape == (8, 7)
    assert not (out == cfg.bos_id).any()
    ended = [row for row in out.tolist() if cfg.eos_id in row]
    assert 0 < len(ended) < 8, out  # both kinds of row are there
    for row in ended:
        assert all(t == cfg.pad_id for t in row[row.index(cfg.eos_id) + 1 :]), out
    for row in out.tolist():
        if cfg.eos_id not in row:
            assert cfg.pad_id not in row, out  # a running row is never padded


@pytest.mark.parametrize("norm_first", [False, True])  # the post-LN and pre-LN cache paths
def test_cached_and_uncached_greedy_and_beam_agree(norm_first):
    torch.manual_seed(0)
    model = Transformer(tiny_config(norm_first=norm_first)).eval()
    src, _ = random_batch(model.cfg, [6, 3, 5, 1], [1] * 4, seed=4)
    assert torch.equal(
        greedy(model, src, max_new_tokens=15),
        greedy(model, src, max_new_tokens=15, use_cache=False),
    )
    cached = beam_search(model, src, beam_size=3, max_len_b=8, n_best=3)
    plain = beam_search(model, src, beam_size=3, max_len_b=8, n_best=3, use_cache=False)
    for a, b in zip(cached, plain):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_incremental_logits_equal_full_recomputation(tiny_model):
    cfg = tiny_model.cfg
    src, tgt = random_batch(cfg, [6, 4], [7, 7], seed=5)
    with torch.no_grad():
        memory = tiny_model.encode(src)
        full = tiny_model.decode(tgt, memory, src)
        state = DecoderState()
        steps = [tiny_model.decode(tgt[:, t : t + 1], memory, src, state) for t in range(7)]
        chunked_state = DecoderState()  # several steps at a time also work
        chunks = [
            tiny_model.decode(tgt[:, a:b], memory, src, chunked_state) for a, b in [(0, 3), (3, 7)]
        ]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(chunks, 1), full, atol=1e-5, rtol=1e-5)
    assert state.offset == 7


def test_a_state_gives_the_positions_and_mask_of_its_new_steps():
    """DecoderState.advance, for each kind of state: one step sees every key (no mask),
    several steps are causal over cached and new keys, a padded state's rows sit at their
    own positions and see their own keys; a refused call counts nothing."""
    ids = torch.zeros(2, 3, dtype=torch.long)
    state = DecoderState(offset=2)
    assert state.advance(ids[:, :1]) == (2, None) and state.offset == 3
    positions, mask = state.advance(ids[:, :2])
    assert positions == 3 and state.offset == 5 and mask is not None
    assert mask.tolist() == [[[[True] * 4 + [False], [True] * 5]]]
    keys = torch.tensor([[True, True], [False, True]])
    padded = DecoderState(offset=2, positions=torch.tensor([2, 1]), keys=keys)
    with pytest.raises(ModelInputError, match="one step at a time"):
        padded.advance(ids[:, :2])
    assert padded.offset == 2 and padded.keys is keys
    positions, mask = padded.advance(ids[:, :1])
    assert isinstance(positions, torch.Tensor) and positions.tolist() == [2, 1]
    assert padded.offset == 3 and padded.positions is not None
    assert padded.positions.tolist() == [3, 2]
    assert mask is not None and mask.shape == (2, 1, 1, 3)
    assert mask[:, 0, 0].tolist() == [[True, True, True], [False, True, True]]


def test_beam_of_one_is_greedy(tiny_model):
    cfg = tiny_model.cfg
    src, _ = random_batch(cfg, [6, 3, 5], [1] * 3, seed=6)
    beams = beam_search(tiny_model, src, beam_size=1, max_len_b=4)
    for i, (length, hyps) in enumerate(zip([6, 3, 5], beams)):
        # The beam's limit counts the EOS: at most length + 3 tokens before it.
        row = greedy(tiny_model, src[i : i + 1, :length], max_new_tokens=length + 3)[0].tolist()
        tokens = [t for t in row if t != cfg.pad_id]
        if cfg.eos_id in tokens:
            tokens = tokens[: tokens.index(cfg.eos_id)]
        assert hyps[0].tokens == tokens


def test_beam_respects_length_limit_and_orders_n_best(tiny_model):
    cfg = tiny_model.cfg
    src, _ = random_batch(cfg, [4, 2], [1, 1], seed=7)
    hyps = beam_search(tiny_model, src, beam_size=4, max_len_b=3, n_best=4)
    for sentence, real_len in zip(hyps, [4, 2]):
        assert len(sentence) >= 1
        assert all(len(h.tokens) + 1 <= real_len + 3 for h in sentence)  # EOS counted
        scores = [h.score for h in sentence]
        assert scores == sorted(scores, reverse=True)
        for h in sentence:
            assert h.score == pytest.approx(h.log_prob / length_penalty(len(h.tokens) + 1, 0.6))


def test_beam_search_finds_better_scores_than_greedy(overfit_model):
    cfg = overfit_model.cfg
    src, _ = random_batch(cfg, [5, 4, 6, 3], [1] * 4, seed=8)
    greedy_hyps = beam_search(overfit_model, src, beam_size=1, alpha=0.0)
    beam_hyps = beam_search(overfit_model, src, beam_size=4, alpha=0.0)
    for g, b in zip(greedy_hyps, beam_hyps):
        assert b[0].log_prob >= g[0].log_prob - 1e-4


def test_bad_beam_arguments():
    model = Transformer(tiny_config())
    src = torch.ones(1, 3, dtype=torch.long) * 5
    with pytest.raises(ValueError, match="n_best"):
        beam_search(model, src, beam_size=2, n_best=3)
    # NaN compares false with every score: unchecked, the search ran to the length limit.
    for alpha in (float("nan"), float("inf"), -0.5):
        with pytest.raises(DecodeError, match="alpha must be a finite number >= 0"):
            beam_search(model, src, beam_size=2, alpha=alpha)
        with pytest.raises(DecodeError, match="alpha"):  # greedy too: the setting is wrong
            search(model, src, DecodeOptions(beam=1, alpha=alpha))
    with pytest.raises(DecodeError, match="max_len_a"):
        greedy(model, src, max_len_a=-1.0)
    with pytest.raises(DecodeError, match="max_new_tokens"):
        beam_search(model, src, max_new_tokens=-1)
    assert issubclass(DecodeError, AiaynError) and issubclass(DecodeError, ValueError)


def test_one_length_rule_for_both_searches(tiny_model):
    """min(max_len_a * real source length + max_len_b, max_new_tokens, max_len), EOS
    included, per sentence: the same for greedy and beam search."""
    cfg = tiny_model.cfg
    src, _ = random_batch(cfg, [6, 2], [1, 1], seed=3)
    assert length_limits(cfg, src).tolist() == [56, 52]
    assert length_limits(cfg, src, max_len_a=1.5, max_len_b=2).tolist() == [11, 5]
    assert length_limits(cfg, src, max_new_tokens=10).tolist() == [10, 10]
    assert length_limits(cfg, src, max_new_tokens=1000).tolist() == [56, 52]
    assert length_limits(cfg, src, max_len_b=500).tolist() == [cfg.max_len] * 2
    # A rule too large for a float is the model's positions (it was an OverflowError).
    assert length_limits(cfg, src, max_len_a=1e308).tolist() == [cfg.max_len] * 2
    # fairseq's int(a * n + b) in float64: in float32, 1.3 * 90 gave 116, not 117.
    long_cfg = dataclasses.replace(cfg, max_len=65536)
    for a in (1.05, 1.3, 2.6, 3.1, 0.7, 1.0):
        for n in range(1, 400, 7):
            want = int(a * n + 5)
            assert length_limits(long_cfg, torch.full((1, n), 5), None, a, 5).tolist() == [want]
    with torch.no_grad():  # never EOS: every sentence runs to its limit
        tiny_model.tgt_embed.weight[cfg.eos_id] = -100.0
    out = greedy(tiny_model, src, max_len_a=0.5, max_len_b=1)
    assert [int((row != cfg.pad_id).sum()) for row in out] == [4, 2]
    hyps = beam_search(tiny_model, src, beam_size=2, max_len_a=0.5, max_len_b=1)
    assert [len(h[0].tokens) + 1 for h in hyps] == [4, 2]  # forced EOS at the limit
    # greedy is cut at the limit (no EOS reached), beam search ends with a forced EOS
    found = search(tiny_model, src, DecodeOptions(beam=1, max_len_a=0.5, max_len_b=1))
    assert [(len(h[0].tokens), h[0].eos) for h in found] == [(4, False), (2, False)]


def test_an_output_does_not_depend_on_the_other_sentences_of_its_batch(tiny_model):
    """The limit follows each sentence's own length, not the padded batch width."""
    cfg = tiny_model.cfg
    with torch.no_grad():
        tiny_model.tgt_embed.weight[cfg.eos_id] = -100.0
    src, _ = random_batch(cfg, [2, 9], [1, 1], seed=5)
    alone = greedy(tiny_model, src[:1, :2], max_len_b=3)
    together = greedy(tiny_model, src, max_len_b=3)
    assert alone.shape == (1, 5) and torch.equal(together[0, :5], alone[0])
    assert (together[0, 5:] == cfg.pad_id).all()
    beam_alone = beam_search(tiny_model, src[:1, :2], beam_size=2, max_len_b=3)
    beam_together = beam_search(tiny_model, src, beam_size=2, max_len_b=3)
    assert beam_alone[0][0].tokens == beam_together[0][0].tokens


def test_inference_context_restores_training_mode_even_on_error(tiny_model):
    tiny_model.train()
    with pytest.raises(RuntimeError, match="boom"), inference(tiny_model):
        assert not tiny_model.training and not torch.is_grad_enabled()
        raise RuntimeError("boom")
    assert tiny_model.training and torch.is_grad_enabled()
    tiny_model.encoder.eval()  # a part the caller froze stays so (train() set it training)
    with inference(tiny_model):
        assert not tiny_model.training
    assert tiny_model.training and not tiny_model.encoder.training
    assert not any(m.training for m in tiny_model.encoder.modules())
    tiny_model.train()
    bad = torch.full((1, 3), 10_000, dtype=torch.long)  # ids outside the vocabulary
    with pytest.raises(ValueError, match="outside the vocabulary"):
        greedy(tiny_model, bad)
    assert tiny_model.training


def test_decoding_switches_off_dropout_in_a_part_left_in_training_mode():
    """model.eval(); model.decoder.train() (a decoder fine-tuned alone): only the models'
    own flags were looked at, so the decoder's dropout ran while decoding, and greedy
    decoding gave another output each call. Nested blocks (a search's steps) walk nothing."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.5)).eval()
    src = torch.tensor([[5, 6, 7, 8, 9]])
    want = greedy(model, src, max_new_tokens=8)
    model.decoder.train()
    for _ in range(10):
        assert torch.equal(greedy(model, src, max_new_tokens=8), want)
        assert [h.tokens for h in beam_search(model, src, beam_size=2)[0]] == [
            h.tokens for h in beam_search(model.eval(), src, beam_size=2)[0]
        ]
        model.decoder.train()
    assert model.decoder.training and not model.training and not model.encoder.training
    with inference(model):
        assert not any(m.training for m in model.modules())
        with inference([model]):  # nested: the outer block's switch holds
            assert not any(m.training for m in model.modules())
        assert not any(m.training for m in model.modules())
    assert all(m.training for m in model.decoder.modules()) and not model.training


def test_a_block_ending_in_another_thread_leaves_a_search_in_eval_mode():
    """Thread A holds inference() on a model in training mode while thread B decodes with
    it: when A's block ended, it switched the modes back under B's search, whose steps then
    ran with dropout (a per-thread record of blocks; the last block now switches back)."""
    import threading
    import time

    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.5)).train()
    calls: list[bool] = []

    def hook(module, args):
        calls.append(any(m.training for m in model.modules()))
        time.sleep(0.005)

    model.decoder.register_forward_pre_hook(hook)
    entered, release = threading.Event(), threading.Event()

    def hold():
        with inference(model):
            entered.set()
            release.wait(30)

    a = threading.Thread(target=hold)
    a.start()
    assert entered.wait(30)
    b = threading.Thread(target=lambda: greedy(model, torch.tensor([[5, 6, 7]]), max_new_tokens=30))
    b.start()
    time.sleep(0.05)
    release.set()
    a.join(30)
    b.join(30)
    assert len(calls) > 10 and not any(calls), calls
    assert all(m.training for m in model.modules())  # the last block switched them back


def test_cache_survives_sentences_finishing_at_different_steps(tiny_model):
    cfg = tiny_model.cfg
    with torch.no_grad():  # make EOS competitive so rows end at different steps
        tiny_model.tgt_embed.weight[cfg.eos_id] *= 4.0
    src, _ = random_batch(cfg, [6, 3, 5, 1, 4, 2], [1] * 6, seed=4)
    cached, plain = (
        greedy(tiny_model, src, max_new_tokens=15),
        greedy(tiny_model, src, max_new_tokens=15, use_cache=False),
    )
    ends = {row.index(cfg.eos_id) if cfg.eos_id in row else None for row in cached.tolist()}
    assert len(ends) >= 2, "the test needs sentences that finish at different steps"
    assert torch.equal(cached, plain)
    a = beam_search(tiny_model, src, beam_size=3, max_len_b=8, n_best=3)
    b = beam_search(tiny_model, src, beam_size=3, max_len_b=8, n_best=3, use_cache=False)
    assert [[h.tokens for h in s] for s in a] == [[h.tokens for h in s] for s in b]


def test_cache_reuses_its_memory_and_equals_recomputation_across_growth():
    """The self-attention cache is a view of a buffer with spare columns: a step without a
    reorder writes only its own column in place, a reorder gathers into a second buffer
    and the two swap, and rows leaving shrink the view. Over 60 steps (the buffers grow
    past their spare columns) with reorders and dropped rows, every step's logits still
    equal a full recomputation of the reordered prefixes."""
    torch.manual_seed(0)
    cfg = tiny_config(max_len=80)
    model = Transformer(cfg).eval()
    src, _ = random_batch(cfg, [6, 3, 5, 2], [1] * 4, seed=1)
    g = torch.Generator().manual_seed(2)
    state, prefix, buffers = DecoderState(), torch.full((4, 1), cfg.bos_id), set()
    appended_in_place = 0
    with torch.inference_mode():
        memory = model.encode(src)
        for t in range(60):
            cache = state.layers[0].self_attn if state.layers else None
            buffer = cache.key_buffer if cache is not None else None
            in_place = cache is not None and cache.order is None  # no reorder pending
            in_place = in_place and buffer is not None and buffer.size(2) > cache.keys.size(2)
            before = cache.keys.data_ptr() if cache is not None else None
            step = model.decode(prefix[:, -1:], memory, src, state)[:, -1]
            full = model.decode(prefix, memory, src)[:, -1]
            torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)
            cache = state.layers[0].self_attn
            assert cache.key_buffer is not None
            buffers.add(cache.key_buffer.data_ptr())
            if in_place:
                assert cache.keys.data_ptr() == before
                appended_in_place += 1
            token = torch.randint(3, cfg.tgt_vocab_size, (prefix.size(0), 1), generator=g)
            prefix = torch.cat([prefix, token], dim=1)
            if t % 7 == 0:  # a beam-like reselection within the rows
                rows = torch.randint(0, prefix.size(0), (prefix.size(0),), generator=g)
                prefix, memory, src = prefix[rows], memory[rows], src[rows]
                state.reorder(rows)
            if t in (20, 40):  # a sentence finishes: its row leaves
                rows = torch.arange(1, prefix.size(0))
                prefix, memory, src = prefix[rows], memory[rows], src[rows]
                state.reorder(rows)
    assert appended_in_place >= 40
    # Two buffers that swap, reallocated only to grow (60 columns: twice at most).
    assert len(buffers) <= 6


@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("tie_output", [True, False])
def test_decode_step_sets_aside_only_the_buffers_the_projection_uses(
    tie_output, blocked, monkeypatch
):
    """The logits go into memory kept across steps only where the projection can write
    there (tied, in the weight's dtype): an untied model gets no unused [n, V] scratch,
    and the blocked product's scratch is kept only where the CPU forms it so."""
    monkeypatch.setattr(projection, "BLOCKED", blocked)
    torch.manual_seed(0)
    model = Transformer(tiny_config(tie_output=tie_output)).eval()
    x = torch.randn(20, model.cfg.d_model)
    expected = {(True, 20): 1 + blocked, (True, 4): 1, (False, 20): 0, (False, 4): 0}
    with torch.no_grad():
        for n in (20, 4):
            assert model.projection_buffers(x[:n]) == expected[tie_output, n]
        assert model.projection_buffers(x.bfloat16()) == 0  # as under autocast
    assert model.projection_buffers(x) == 0  # autograd on: an out= product has no gradient
    src, _ = random_batch(model.cfg, [7, 3, 5, 2] * 5, [1] * 20)
    with inference(model):
        step = DecodeStep(model, src)
        prefix = torch.full((20, 1), model.cfg.bos_id)
        logits = step.logits(prefix)
        assert torch.allclose(logits, model(src, prefix)[:, -1], atol=1e-5)
    kept = set(step._scratch)
    assert kept == ({"logits0", *["work"] * blocked} if tie_output else set())
