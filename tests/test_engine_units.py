"""The engine's parts that the end-to-end decode tests leave unchecked (issue 45, the
mutation score of decode/engine.py and decode/beam.py): sentences that join or leave with
forced prefixes still pending, the removal of the first of three sentences, a source of
padding only, a length penalty per added batch, an engine without a cache, the refusals'
messages, the pure steps of beam search (choosing the beams that continue, finding the
EOS hits) on tensors built by hand; greedy decoding and sampling as units of one row
(joining, leaving early, ``scores=False``, units allowed no token); and the device every
tensor the engine makes goes on.

Each beam-search sentence run through the engine is checked against offline beam search
of that sentence alone (its whole list of hypotheses, not only the best one), each greedy
or sampled one against a plain uncached loop over ``model.decode`` of that sentence alone:
a sentence's result must not depend on what ran beside it. Tiny random models, fixed
seeds, milliseconds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from aiayn import Transformer
from aiayn.decode import (
    BeamEngine,
    DecodeOptions,
    Hypothesis,
    beam_search,
    greedy,
    length_penalty,
    search,
)
from aiayn.decode.beam import finishing, select
from aiayn.decode.sampling import draw, row_uniforms, sampling_probs
from aiayn.errors import DecodeError
from conftest import random_batch, tiny_config

INF = float("inf")


@pytest.fixture
def model() -> Transformer:
    """The tiny model with EOS made competitive, so hypotheses end after different steps
    and the beams of a sentence hold different tokens."""
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    with torch.no_grad():
        model.tgt_embed.weight[model.cfg.eos_id] *= 3.0
    return model


def sources(model: Transformer, lengths: list[int], seed: int) -> list[torch.Tensor]:
    """Unpadded random sources ``[1, n]``, one per length."""
    src, _ = random_batch(model.cfg, lengths, [1] * len(lengths), seed=seed)
    return [src[i : i + 1, :n] for i, n in enumerate(lengths)]


def alone(
    model: Transformer, src: torch.Tensor, options: DecodeOptions, prefix: list[int]
) -> list[tuple[list[int], object]]:
    """Offline beam search of one sentence: its hypotheses' tokens and scores (to float
    noise: a batch pads its sources to the longest one, which moves the last bits)."""
    hyps = search(model, src, options, prefix=[prefix])[0]
    return [(h.tokens, pytest.approx(h.score, rel=1e-4, abs=1e-4)) for h in hyps]


def padded(rows: list[torch.Tensor], pad_id: int) -> torch.Tensor:
    """Sources ``[1, n_i]`` as one right-padded batch."""
    out = torch.full((len(rows), max(r.size(1) for r in rows)), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : r.size(1)] = r[0]
    return out


def summary(hyps: list[Hypothesis], n: int) -> list[tuple[list[int], float]]:
    return [(h.tokens, h.score) for h in hyps[:n]]


def run(engine: BeamEngine[str]) -> dict[str, list[Hypothesis]]:
    """Step until every sentence is done."""
    done: dict[str, list[Hypothesis]] = {}
    while len(engine):
        done.update(engine.step())
    return done


@pytest.mark.parametrize(
    ("running", "joining"),
    [
        ([], [5, 6]),  # only the joining sentence forces tokens
        ([5, 6, 7], []),  # only the running one still does
        ([5, 6, 7, 9], [8]),  # both: the running one's pending prefix is the wider
        ([5, 6], [8, 9, 10]),  # both: the joining one's is the wider
    ],
    ids=["joining", "running", "both-running-wider", "both-joining-wider"],
)
def test_a_sentence_joining_with_a_prefix_gets_its_offline_result(
    model: Transformer, running: list[int], joining: list[int]
) -> None:
    """Forced prefixes line up per sentence when a batch joins a running one: what the
    running sentence still has to force (its prefix less the step taken) and what the
    joining one forces, each padded with "free" past its own end, neither lost."""
    a, b = sources(model, [6, 4], seed=5)
    options = DecodeOptions(beam=3, n_best=3, max_len_a=0.0, max_len_b=8)
    engine: BeamEngine[str] = BeamEngine(model, options)
    engine.add(a, ["a"], prefix=[running])
    done = dict(engine.step())
    engine.add(b, ["b"], prefix=[joining])
    done.update(run(engine))
    for tag, src, prefix in (("a", a, running), ("b", b, joining)):
        assert done[tag][0].tokens[: len(prefix)] == prefix
        assert summary(done[tag], 3) == alone(model, src, options, prefix)


def test_removing_a_sentence_keeps_the_others_on_their_own_rows(model: Transformer) -> None:
    """After a few free steps a sentence's K beams hold different tokens; removing the
    first sentence of three must keep each other sentence's K rows (decoded tokens and
    cache) in their order, and what the third still has to force."""
    a, b, c = sources(model, [5, 7, 4], seed=9)
    options = DecodeOptions(beam=3, n_best=3, max_len_a=0.0, max_len_b=10)
    prefixes = {"a": [], "b": [], "c": [4, 5, 6, 7, 8]}  # c is still forced after 3 steps
    engine: BeamEngine[str] = BeamEngine(model, options)
    engine.add(padded([a, b, c], model.cfg.pad_id), ["a", "b", "c"], prefix=list(prefixes.values()))
    for _ in range(3):
        assert engine.step() == []  # nobody is done yet: the limit is 10
    assert bool(torch.isfinite(engine.scores[1]).all())  # b's beams have all diverged
    engine.remove({"a"})
    assert [u.tag for u in engine.units] == ["b", "c"]
    done = run(engine)
    assert set(done) == {"b", "c"}
    for tag, src in (("b", b), ("c", c)):
        assert summary(done[tag], 3) == alone(model, src, options, prefixes[tag])


def test_a_source_of_padding_only_left_alone_is_cropped_to_no_position(model: Transformer) -> None:
    """A source's width counts up to its last real id: none for a source of padding only.
    Once the sentence beside it leaves, the batch keeps no source position at all, and
    the empty source still gets its offline result."""
    cfg = model.cfg
    (a,) = sources(model, [6], seed=3)
    empty = torch.full((1, 4), cfg.pad_id)
    options = DecodeOptions(beam=2, n_best=2, max_len_a=0.0, max_len_b=5)
    engine: BeamEngine[str] = BeamEngine(model, options)
    engine.add(torch.cat([a, torch.full((1, 6), cfg.pad_id)]), ["a", "empty"])
    assert engine.width == 6
    engine.step()
    engine.remove({"a"})
    assert engine.width == 0
    done = run(engine)
    assert summary(done["empty"], 2) == alone(model, empty, options, [])


def test_each_added_batch_scores_with_its_own_length_penalty(model: Transformer) -> None:
    """``add(alpha=...)`` sets the length penalty of those sentences only; the others keep
    the engine's. A finished hypothesis scores log_prob / lp(its length with the EOS)."""
    a, b = sources(model, [5, 6], seed=4)
    options = DecodeOptions(beam=2, n_best=2, alpha=0.6, max_len_a=0.0, max_len_b=7)
    engine: BeamEngine[str] = BeamEngine(model, options)
    engine.add(a, ["a"])
    engine.add(b, ["b"], alpha=1.5)
    done = run(engine)
    for tag, src, alpha in (("a", a, 0.6), ("b", b, 1.5)):
        for h in done[tag]:
            lp = length_penalty(len(h.tokens) + 1, alpha)
            assert h.score == pytest.approx(h.log_prob / lp)
        want = alone(model, src, options.replace(alpha=alpha), [])
        assert summary(done[tag], 2) == want


def test_an_engine_without_a_cache_takes_no_sentence_while_others_run(model: Transformer) -> None:
    """``use_cache=False`` (the slow reference that recomputes every prefix) keeps each
    row's own copy of its source and no cache, so a batch cannot join a running one."""
    a, b = sources(model, [5, 3], seed=6)
    engine: BeamEngine[str] = BeamEngine(model, DecodeOptions(beam=2), use_cache=False)
    engine.add(a, ["a"])
    engine.step()
    with pytest.raises(DecodeError, match="only cached rows can join a running search"):
        engine.add(b, ["b"])


def test_the_refusals_say_what_is_wrong(model: Transformer) -> None:
    """The server and the command line show these messages as they are: each names the
    mistake (sampling options for a beam search, a beam size for options; a source count
    that is not the tag count, an empty batch included) and the engine stays empty."""
    (src,) = sources(model, [5], seed=8)
    with pytest.raises(DecodeError) as e:
        BeamEngine(model, DecodeOptions(beam=1, sampling=True), one_per_row=False)
    assert str(e.value) == "beam search does not sample"
    with pytest.raises(DecodeError) as e:
        BeamEngine(model, 2)  # type: ignore[arg-type]
    assert str(e.value) == "options must be a DecodeOptions, got int"
    engine: BeamEngine[str] = BeamEngine(model, DecodeOptions(beam=2))
    with pytest.raises(DecodeError) as e:
        engine.add(src.expand(2, 5), ["only one tag"])
    assert str(e.value) == "add: 2 sentences but 1 tags"
    with pytest.raises(DecodeError) as e:
        engine.add(src[:0], [])
    assert str(e.value) == "add: 0 sentences but 0 tags"
    assert len(engine) == 0  # nothing joined


def beams(*rows: list[float]) -> torch.Tensor:
    """Next-token log-probs ``[K, V]`` of the given probabilities."""
    return torch.tensor(rows).log()


def test_select_continues_the_best_non_eos_candidates() -> None:
    """One sentence, K = 2 beams at log-probs -1 and -2, V = 5 ids, EOS = 2. The best
    candidate of the sentence is beam 0's EOS: it is among the 2K best (``top_token``) but
    does not continue; the K best of the others do (beam 1's id 4 at -2 + log .6, then
    beam 0's id 3 at -1 + log .2), with their parent rows."""
    scores = torch.tensor([[-1.0, -2.0]])
    logp = beams([0.05, 0.1, 0.6, 0.2, 0.05], [0.1, 0.1, 0.1, 0.1, 0.6])
    top_scores, beam, top_token, next_scores, parent, token = select(scores, logp, [False], 2)
    log = torch.tensor([0.6, 0.2, 0.1]).log().tolist()
    want = [-1 + log[0], -2 + log[0], -1 + log[1], -1 + log[2]]
    assert top_scores[0].tolist() == pytest.approx(want)
    assert beam.tolist() == [[0, 1, 0, 0]] and top_token[0, :3].tolist() == [2, 4, 3]
    assert token.view(-1).tolist() == [4, 3] and parent.tolist() == [1, 0]
    assert next_scores[0].tolist() == pytest.approx(want[1:3])


def test_select_at_the_limit_takes_eos_with_its_log_prob_unless_told_zero() -> None:
    """A sentence at its length limit may only end: every candidate but EOS is -inf, and
    the EOS adds its log-prob to the beam's score (by default) or 0 (``eos_scores_zero``,
    Hugging Face's forced EOS)."""
    scores = torch.tensor([[-1.0, -2.0]])
    logp = beams([0.05, 0.1, 0.6, 0.2, 0.05], [0.1, 0.1, 0.1, 0.1, 0.6])
    eos = logp[:, 2].tolist()
    top_scores, _, top_token, _, _, _ = select(scores, logp.clone(), [True], 2)
    assert top_scores[0, :2].tolist() == pytest.approx([-1 + eos[0], -2 + eos[1]])
    assert top_token[0, :2].tolist() == [2, 2] and top_scores[0, 2:].tolist() == [-INF, -INF]
    top_scores, *_ = select(scores, logp.clone(), [True], 2, eos_scores_zero=True)
    assert top_scores[0, :2].tolist() == [-1.0, -2.0]


def test_select_at_the_limit_with_cut_chooses_freely() -> None:
    """``cut`` (DecodeOptions.cut_at_limit): a sentence at its limit ranks every token as
    on any other step, and its log-probs are left as they are."""
    scores = torch.tensor([[-1.0, -2.0]])
    logp = beams([0.05, 0.1, 0.6, 0.2, 0.05], [0.1, 0.1, 0.1, 0.1, 0.6])
    free = select(scores, logp.clone(), [False], 2)
    cut = select(scores, logp.clone(), [True], 2, cut=True)
    for a, b in zip(free, cut, strict=True):
        assert torch.equal(a, b)
    assert cut[2][0].tolist() == [2, 4, 3, 1]  # EOS, then other tokens


def test_finishing_takes_the_finite_eos_among_the_best_k_and_all_at_the_limit() -> None:
    """n = 2 sentences of K = 2 beams, each with its 2K best candidates; EOS is id 2.
    Sentence 0: an EOS at rank 1 (a hit: its parent is beam 1, row 1) and one at rank 2
    (outside the best K: no hit). Sentence 1: an EOS at -inf (a dead beam's candidate: no
    hit). At the limit, each of a sentence's best K finite candidates ends, EOS or not."""
    top_scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-0.5, -INF, -INF, -INF]])
    top_token = torch.tensor([[5, 2, 2, 7], [6, 2, 8, 2]])
    beam = torch.tensor([[0, 1, 0, 1], [0, 1, 1, 0]])
    groups, rows, log_probs, tokens = finishing(beam, top_token, top_scores, 2, [False, False])
    assert (groups, rows.tolist(), log_probs, tokens) == ([0], [1], [-2.0], [2])
    groups, rows, log_probs, tokens = finishing(beam, top_token, top_scores, 9, [False, False])
    assert (groups, rows.tolist(), log_probs, tokens) == ([], [], [], [])  # no EOS: none
    groups, rows, log_probs, tokens = finishing(beam, top_token, top_scores, 2, [True, True])
    assert (groups, rows.tolist(), log_probs, tokens) == (
        [0, 0, 1], [0, 1, 2], [-1.0, -2.0, -0.5], [5, 2, 6]
    )  # fmt: skip


def test_select_makes_its_tensors_on_the_device_of_its_inputs() -> None:
    """``select`` builds index tensors of its own (the mask of the sentences that must end,
    the ranks, the parents' row offsets): on the inputs' device, not on torch's default
    one, or a model on a GPU would meet CPU indices. The default device here is "meta"
    (tensors without data) and the inputs are on the CPU: a tensor made on the default
    device cannot mix with them, so the result would fail or differ."""
    scores = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    logp = beams(
        [0.05, 0.1, 0.6, 0.2, 0.05],
        [0.1, 0.1, 0.1, 0.1, 0.6],
        [0.3, 0.1, 0.1, 0.4, 0.1],
        [0.2, 0.2, 0.2, 0.2, 0.2],
    )
    want = select(scores, logp.clone(), [True, False], 2)
    with torch.device("meta"):
        got = select(scores, logp.clone(), [True, False], 2)
    for g, w in zip(got, want, strict=True):
        assert g.device == w.device and torch.equal(g, w)


# Greedy decoding and sampling run on the engine as units of one row. The reference they
# are checked against is independent of it: a plain loop over ``model.decode`` without a
# cache, one sentence alone, that picks each token with ``pick`` (argmax, or a draw).
Pick = Callable[[int, torch.Tensor], int]  # (step, banned log-probs [V]) -> token


def plain_loop(
    model: Transformer, src: torch.Tensor, limit: int, pick: Pick, prefix: Sequence[int] = ()
) -> tuple[list[int], float, bool]:
    """One sentence ``src [1, S]`` decoded by full recomputation: up to ``limit`` tokens,
    ``prefix`` forced first. Returns its tokens (no EOS), their total log-prob (normalised
    before PAD and BOS are banned, the EOS's included) and whether it ended with EOS."""
    cfg, total = model.cfg, 0.0
    out: list[int] = []
    with torch.no_grad():
        memory = model.encode(src)
        for t in range(limit):
            tgt = torch.tensor([[cfg.bos_id, *out]])
            logp = torch.log_softmax(model.decode(tgt, memory, src)[0, -1].float(), dim=-1)
            logp[[cfg.pad_id, cfg.bos_id]] = -INF
            token = prefix[t] if t < len(prefix) else pick(t, logp)
            total += float(logp[token])
            if token == cfg.eos_id:
                return out, total, True
            out.append(token)
    return out, total, False


def argmax(_: int, logp: torch.Tensor) -> int:
    return int(logp.argmax())


def expected_hypothesis(
    tokens: list[int], log_prob: float, eos: bool, alpha: float, kind: str
) -> tuple[list[int], object, object, bool]:
    """(tokens, score, log_prob, eos) as a finished output should carry them, to float
    noise: the engine's cached steps and a full recomputation differ in the last bits."""
    lp = length_penalty(len(tokens) + int(eos), alpha, kind)

    def near(x: float) -> object:
        return pytest.approx(x, rel=1e-4, abs=1e-5)

    return tokens, near(log_prob / lp), near(log_prob), eos


def as_tuple(h: Hypothesis) -> tuple[list[int], float, float, bool]:
    return h.tokens, h.score, h.log_prob, h.eos


@pytest.mark.parametrize("kind", ["gnmt", "hf"])
def test_greedy_sentences_that_join_and_leave_get_the_plain_argmax_loop(
    model: Transformer, kind: str
) -> None:
    """Greedy decoding on the engine (its default: with scores): a sentence that starts
    alone, two that join a step later (one with a forced prefix), outputs that end with
    EOS at different steps or run to their limit. Each gets what the plain argmax loop
    gives it alone: tokens, log-prob, and the score under the options' length penalty."""
    a, b, c = sources(model, [6, 4, 7], seed=12)
    options = DecodeOptions(beam=1, alpha=0.8, length_penalty=kind, max_len_a=0.0, max_len_b=7)
    engine: BeamEngine[str] = BeamEngine(model, options)
    engine.add(a, ["a"])
    done = dict(engine.step())
    engine.add(padded([b, c], model.cfg.pad_id), ["b", "c"], prefix=[[9, 4], []])
    done.update(run(engine))
    ends = set()
    for tag, src, prefix in (("a", a, []), ("b", b, [9, 4]), ("c", c, [])):
        tokens, log_prob, eos = plain_loop(model, src, 7, argmax, prefix)
        ends.add((len(tokens), eos))
        (h,) = done[tag]
        assert as_tuple(h) == expected_hypothesis(tokens, log_prob, eos, 0.8, kind)
    assert len(ends) == 3  # three different ends: the test covers sentences leaving early


def test_greedy_without_scores_gives_the_same_tokens_and_log_prob_zero(model: Transformer) -> None:
    """``scores=False`` skips the softmax: the same argmax tokens, each output with
    log-prob and score 0 (not a count of steps, nor the log-probs after all)."""
    src = padded(sources(model, [5, 3, 6], seed=13), model.cfg.pad_id)
    options = DecodeOptions(beam=1, max_len_a=0.0, max_len_b=6)
    with_scores = search(model, src, options)
    without = search(model, src, options, scores=False)
    assert [[h.tokens for h in s] for s in without] == [[h.tokens for h in s] for s in with_scores]
    assert any(h.log_prob < 0 for (h,) in with_scores)
    assert [(h.log_prob, h.score) for (h,) in without] == [(0.0, 0.0)] * 3


@pytest.mark.parametrize("kind", ["gnmt", "hf"])
@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sampling"])
def test_a_sentence_allowed_no_token_gets_one_empty_output_per_unit(
    model: Transformer, kind: str, sampling: bool
) -> None:
    """Half a token per source token: a source of one token may produce none. Each of
    its units (the greedy sentence, or each of its samples) ends at once with no token,
    no EOS, log-prob 0 and score 0 (the "hf" penalty of length 0 is 0: no division); the
    sentence beside it (limit 3) decodes as ever. greedy() of such a batch is ``[B, 0]``."""
    src = padded(sources(model, [1, 6], seed=14), model.cfg.pad_id)
    settings: dict[str, Any] = {"sampling": True, "n_best": 2, "seed": 3} if sampling else {}
    options = DecodeOptions(
        beam=1, max_len_a=0.5, max_len_b=0, alpha=1.0, length_penalty=kind, **settings
    )
    empty, other = search(model, src, options)
    n = 2 if sampling else 1
    assert [as_tuple(h) for h in empty] == [([], 0.0, 0.0, False)] * n
    assert len(other) == n and all(h.log_prob < 0 and len(h.tokens) <= 3 for h in other)
    if not sampling:
        assert greedy(model, src, options.replace(max_new_tokens=0)).shape == (2, 0)


def test_sampling_with_no_token_allowed_at_all_gives_empty_samples(model: Transformer) -> None:
    """``max_new_tokens=0`` with sampling: every sample is empty, as with greedy (the
    engine once drew no random number for a step it still took)."""
    src = padded(sources(model, [5, 3], seed=14), model.cfg.pad_id)
    options = DecodeOptions(beam=1, sampling=True, n_best=2, seed=3, max_new_tokens=0)
    found = search(model, src, options)
    assert [[as_tuple(h) for h in s] for s in found] == [[([], 0.0, 0.0, False)] * 2] * 2


@pytest.mark.parametrize("beam", [1, 3])
def test_beam_search_with_no_token_allowed_gives_what_greedy_gives(model: Transformer, beam):
    """A limit of 0 tokens leaves no room for EOS either: beam search's output is empty,
    without EOS, log-prob 0, as greedy decoding's and sampling's (it was an EOS scored
    with its log-prob, one token past the limit); the sentence beside it decodes as ever."""
    src = padded(sources(model, [1, 6], seed=14), model.cfg.pad_id)
    options = DecodeOptions(beam=beam, n_best=beam, max_len_a=0.5, max_len_b=0)
    empty, other = beam_search(model, src, options)
    assert [as_tuple(h) for h in empty] == [([], 0.0, 0.0, False)]
    assert other and all(h.log_prob < 0 and h.eos and len(h.tokens) <= 2 for h in other)
    (alone,) = beam_search(model, src[1:], options)
    assert [h.tokens for h in alone] == [h.tokens for h in other]


def drawing(uniforms: torch.Tensor, temperature: float, top_k: int) -> Pick:
    """Sampling's pick from one row's stream, with aiayn.decode.sampling's own filter and
    inverse-cdf draw (tested in test_sampling.py against a slow reference)."""

    def pick(t: int, logp: torch.Tensor) -> int:
        probs = sampling_probs(logp[None], temperature, top_k, 1.0)
        return int(draw(probs, uniforms[t : t + 1]))

    return pick


def test_samples_of_sentences_that_join_with_prefixes_follow_their_own_streams(
    model: Transformer,
) -> None:
    """Sampling on the engine: sentence a (line 0) starts, then b and c (lines 1 and 2,
    forcing [9, 4] and [6]) join; each has 2 samples, which share the sentence's encoder
    pass and leave one by one. Each sample j of line i is the plain loop drawing from
    stream (seed, i, j), with the prefix forced first (it still takes its stream's steps),
    so it does not depend on the batch or when the sentence joined. ``len`` counts
    sentences, not samples."""
    a, b, c = sources(model, [6, 4, 7], seed=15)
    limit, seed = 6, 5
    options = DecodeOptions(
        beam=1, sampling=True, n_best=2, seed=seed, temperature=1.5, top_k=12, max_len_b=limit
    )
    options = options.replace(max_len_a=0.0)
    engine: BeamEngine[str] = BeamEngine(model, options)
    engine.add(a, ["a"], lines=[0])
    assert len(engine) == 1
    done = dict(engine.step())
    prefixes = {"a": [], "b": [9, 4], "c": [6]}
    engine.add(padded([b, c], model.cfg.pad_id), ["b", "c"], prefix=[[9, 4], [6]], lines=[1, 2])
    assert len(engine) == 3
    done.update(run(engine))
    outputs = set()
    for line, (tag, src) in enumerate((("a", a), ("b", b), ("c", c))):
        streams = row_uniforms(seed, [line], 2, limit)
        want = []
        for j in range(2):
            pick = drawing(streams[j], 1.5, 12)
            tokens, log_prob, eos = plain_loop(model, src, limit, pick, prefixes[tag])
            want.append(expected_hypothesis(tokens, log_prob, eos, options.alpha, "gnmt"))
            outputs.add((tuple(tokens), eos))
        assert [as_tuple(h) for h in done[tag]] == want
    assert len(outputs) == 6  # six different samples: each stream is its own


def test_sentences_that_leave_leave_nothing_behind(model: Transformer) -> None:
    """A running engine (a server's) keeps per-sentence state only while the sentence
    runs: beam search keeps no sample slots at all, and a sampled sentence that is removed
    or done takes its slots with it, while the others still run."""
    a, b = sources(model, [3, 7], seed=16)
    src = padded([a, b], model.cfg.pad_id)
    beam: BeamEngine[str] = BeamEngine(model, DecodeOptions(beam=2, max_len_b=4))
    beam.add(src, ["a", "b"])
    beam.step()
    assert len(beam) == 2 and beam._samples == {}
    options = DecodeOptions(beam=1, sampling=True, n_best=2, seed=1, max_len_a=0.0, max_len_b=5)
    sampled: BeamEngine[str] = BeamEngine(model, options)
    sampled.add(padded([a, b, a], model.cfg.pad_id), ["a", "b", "c"])
    sampled.step()
    sampled.remove({"a"})
    assert len(sampled) == 2 and set(sampled._samples) == {"b", "c"}


@pytest.mark.parametrize(
    "settings",
    [
        {"beam": 2, "n_best": 2},
        {"beam": 1},
        {"beam": 1, "forced_eos": True},  # the mask of the units at their limit is read
        {"beam": 1, "sampling": True, "n_best": 2, "forced_eos": True},
    ],
    ids=["beam", "greedy", "greedy-forced-eos", "sampling"],
)
def test_the_engine_makes_its_tensors_on_the_models_device(
    model: Transformer, settings: dict[str, Any]
) -> None:
    """Every tensor the engine makes (scores, BOS column, banned ids, the rows that stay,
    the step counts that pick random numbers) goes on the model's device, not on torch's
    default one: on a GPU a CPU index would not mix with the model's tensors. The default
    device here is "meta" (tensors without data), the model on the CPU: a tensor made on
    the default device fails or changes the result. Sentence a (limit 3) leaves while the
    others run; c is removed; b's forced prefix is read in the first steps. Sampling's
    streams are drawn on the CPU by design, so its engine is made and joined outside the
    meta context and only steps inside it."""
    a, b, c = sources(model, [3, 7, 5], seed=20)
    src = padded([a, b, c], model.cfg.pad_id)
    options = DecodeOptions(max_len_a=1.0, max_len_b=0, seed=2, **settings)

    def decode(default: str) -> dict[str, list[tuple[list[int], float]]]:
        sampling = options.sampling
        with torch.device("cpu" if sampling else default):
            engine: BeamEngine[str] = BeamEngine(model, options)
            engine.add(src, ["a", "b", "c"], prefix=[[], [5, 6], []])
        with torch.device(default):
            done = dict(engine.step())
            engine.remove({"c"})
            done.update(run(engine))
        return {tag: summary(hyps, 2) for tag, hyps in done.items()}

    want = decode("cpu")
    assert set(want) == {"a", "b"}
    assert decode("meta") == want


def test_tags_are_one_per_sentence_and_one_row_is_beam_one(model: Transformer) -> None:
    """A tag names one running sentence (the results are keyed by it): a repeated tag, or
    one already running, is refused before the batch changes; asking for one row per
    sentence with a beam is refused too."""
    src = padded(sources(model, [4, 3], seed=15), model.cfg.pad_id)
    engine: BeamEngine[str] = BeamEngine(model, DecodeOptions(beam=2))
    refusal = "add: every sentence needs a tag of its own (one is running)"
    with pytest.raises(DecodeError) as e:
        engine.add(src, ["a", "a"])
    assert str(e.value) == refusal
    engine.add(src, ["a", "b"])
    with pytest.raises(DecodeError) as e:
        engine.add(src[:1], ["b"])
    assert str(e.value) == refusal
    assert [u.tag for u in engine.units] == ["a", "b"]
    with pytest.raises(DecodeError, match="one row per sentence is beam 1, got beam 2"):
        BeamEngine(model, DecodeOptions(beam=2), one_per_row=True)
    assert BeamEngine(model, DecodeOptions(beam=1), one_per_row=True).K == 1
