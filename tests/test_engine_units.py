"""The beam engine's parts that the end-to-end decode tests leave unchecked (issue 45, the
mutation score of decode/engine.py): sentences that join or leave with forced prefixes
still pending, the removal of the first of three sentences, a source of padding only, a
length penalty per added batch, an engine without a cache, the refusals' messages, and
the pure steps of the search (choosing the beams that continue, finding the EOS hits) on
tensors built by hand.

Each sentence run through the engine is checked against offline beam search of that
sentence alone (its whole list of hypotheses, not only the best one): a sentence's result
must not depend on what ran beside it. Tiny random models, fixed seeds, milliseconds."""

from __future__ import annotations

import pytest
import torch

from aiayn import Transformer
from aiayn.decode import BeamEngine, DecodeOptions, Hypothesis, length_penalty, search
from aiayn.decode.beam import eos_hits, select
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
    candidate of the sentence is beam 0's EOS: it is among the 2K best (``is_eos``) but
    does not continue; the K best of the others do (beam 1's id 4 at -2 + log .6, then
    beam 0's id 3 at -1 + log .2), with their parent rows."""
    scores = torch.tensor([[-1.0, -2.0]])
    logp = beams([0.05, 0.1, 0.6, 0.2, 0.05], [0.1, 0.1, 0.1, 0.1, 0.6])
    top_scores, beam, is_eos, next_scores, parent, token = select(scores, logp, [False], 2)
    log = torch.tensor([0.6, 0.2, 0.1]).log().tolist()
    want = [-1 + log[0], -2 + log[0], -1 + log[1], -1 + log[2]]
    assert top_scores[0].tolist() == pytest.approx(want)
    assert beam.tolist() == [[0, 1, 0, 0]] and is_eos.tolist() == [[True, False, False, False]]
    assert token.view(-1).tolist() == [4, 3] and parent.tolist() == [1, 0]
    assert next_scores[0].tolist() == pytest.approx(want[1:3])


def test_select_at_the_limit_takes_eos_with_its_log_prob_unless_told_zero() -> None:
    """A sentence at its length limit may only end: every candidate but EOS is -inf, and
    the EOS adds its log-prob to the beam's score (by default) or 0 (``eos_scores_zero``,
    Hugging Face's forced EOS)."""
    scores = torch.tensor([[-1.0, -2.0]])
    logp = beams([0.05, 0.1, 0.6, 0.2, 0.05], [0.1, 0.1, 0.1, 0.1, 0.6])
    eos = logp[:, 2].tolist()
    top_scores, _, is_eos, _, _, _ = select(scores, logp.clone(), [True], 2)
    assert top_scores[0, :2].tolist() == pytest.approx([-1 + eos[0], -2 + eos[1]])
    assert is_eos[0, :2].all() and top_scores[0, 2:].tolist() == [-INF, -INF]
    top_scores, *_ = select(scores, logp.clone(), [True], 2, eos_scores_zero=True)
    assert top_scores[0, :2].tolist() == [-1.0, -2.0]


def test_eos_hits_are_the_finite_eos_among_the_best_k() -> None:
    """n = 2 sentences of K = 2 beams, each with its 2K best candidates. Sentence 0: an
    EOS at rank 1 (a hit: its parent is beam 1, row 1) and one at rank 2 (outside the best
    K: no hit). Sentence 1: an EOS at -inf (a dead beam's candidate: no hit)."""
    top_scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-0.5, -INF, -INF, -INF]])
    is_eos = torch.tensor([[False, True, True, False], [False, True, False, True]])
    beam = torch.tensor([[0, 1, 0, 1], [0, 1, 1, 0]])
    groups, rows, log_probs = eos_hits(beam, is_eos, top_scores)
    assert (groups, rows.tolist(), log_probs) == ([0], [1], [-2.0])
    groups, rows, log_probs = eos_hits(beam, torch.zeros_like(is_eos), top_scores)
    assert (groups, rows.tolist(), log_probs) == ([], [], [])  # one entry per hit: none
