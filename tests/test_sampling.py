"""Sampling: the limits of temperature and top-k, the support of top-k and top-p against a
slow reference, and samples that depend on (seed, line, sample) alone."""

from __future__ import annotations

import pytest
import torch

from aiayn import Transformer
from aiayn.decode import DecodeOptions, greedy, search
from aiayn.decode.sampling import draw, row_uniforms, sampling_probs
from aiayn.translator import Translator
from conftest import random_batch, tiny_config
from sample_data import PAIRS


@pytest.fixture(scope="module")
def peaked_model() -> Transformer:
    """A tiny random model with larger logits than the default init: distributions with
    a clear head and a long tail, so top-k and top-p cut something."""
    torch.manual_seed(1)
    model = Transformer(tiny_config(tgt_vocab_size=41)).eval()
    with torch.no_grad():
        model.tgt_embed.weight.mul_(6.0)
    return model


def sample(model, src, **settings) -> list[list[list[int]]]:
    options = DecodeOptions(beam=1, sampling=True, **settings)
    return [[h.tokens for h in s] for s in search(model, src, options)]


def test_top_k_one_and_temperature_near_zero_equal_greedy(peaked_model):
    cfg = peaked_model.cfg
    src, _ = random_batch(cfg, [6, 3, 5, 2, 7], [1] * 5, seed=3)
    want = [[h.tokens for h in s] for s in search(peaked_model, src, DecodeOptions(beam=1))]
    assert want == [
        [row[: row.index(cfg.eos_id)] if cfg.eos_id in row else row]
        for row in [[t for t in r if t != cfg.pad_id] for r in greedy(peaked_model, src).tolist()]
    ]
    for seed in (1, 2):
        assert sample(peaked_model, src, top_k=1, seed=seed) == want
        assert sample(peaked_model, src, temperature=1e-4, seed=seed) == want
        # So small that every log-prob / temperature overflows to -inf: still greedy.
        for temperature in (1e-310, 5e-324):
            assert sample(peaked_model, src, temperature=temperature, seed=seed) == want
    # ... and a real temperature does sample: some line differs between seeds.
    outs = [sample(peaked_model, src, seed=s) for s in range(4)]
    assert any(o != outs[0] for o in outs[1:])


def test_a_temperature_near_zero_keeps_only_the_best_token():
    logp = torch.log_softmax(torch.tensor([[0.5, 2.0, -1.0, 1.9], [3.0, 3.0, 0.0, -5.0]]), -1)
    logp[:, 3] = float("-inf")  # a banned token
    want = [[0.0, 1.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]]  # the best token; ties shared
    for temperature in (1e-310, 5e-324):
        probs = sampling_probs(logp, temperature, top_k=0, top_p=1.0)
        assert torch.isfinite(probs).all() and probs.tolist() == want, temperature
    # A GPU flushes a subnormal temperature to 0 (0 / 0: NaN); a CPU can be told to.
    if torch.set_flush_denormal(True):
        try:
            probs = sampling_probs(logp, 1e-310, top_k=0, top_p=1.0)
            assert torch.isfinite(probs).all() and probs.tolist() == want
        finally:
            torch.set_flush_denormal(False)


def allowed(probs: torch.Tensor, top_k: int, top_p: float) -> set[int]:
    """The slow reference: the tokens top-k then top-p may emit, from ``probs [V]``."""
    order = sorted(range(len(probs)), key=lambda i: -float(probs[i]))
    keep = [i for i in order if probs[i] > 0]
    if top_k:
        kth = float(probs[order[top_k - 1]])
        keep = [i for i in keep if float(probs[i]) >= kth]
    mass = sum(float(probs[i]) for i in keep)
    nucleus, before = [], 0.0
    for i in keep:  # most likely first, while the mass before it is below top_p
        if before >= top_p * mass - 1e-12:
            break
        nucleus.append(i)
        before += float(probs[i])
    return set(nucleus)


@pytest.mark.parametrize(("top_k", "top_p"), [(3, 1.0), (0, 0.6), (5, 0.5)])
def test_samples_stay_inside_top_k_and_the_nucleus(peaked_model, top_k, top_p):
    """Every token of 300 sampled outputs (over several steps) lies in the set a slow
    reference computes from a full recomputation of the model's distribution given the
    tokens before it; and the cut is real (the reference set is smaller than the
    vocabulary at most steps)."""
    cfg = peaked_model.cfg
    src, _ = random_batch(cfg, [5, 4, 6], [1] * 3, seed=7)
    options = DecodeOptions(
        beam=1, sampling=True, top_k=top_k, top_p=top_p, n_best=100, seed=5, max_len_b=4
    )
    outs = search(peaked_model, src, options)
    checked = cut = 0
    with torch.no_grad():
        for b, samples in enumerate(outs):
            for h in samples:
                tokens = h.tokens + ([cfg.eos_id] if h.eos else [])
                tgt_in = torch.tensor([[cfg.bos_id, *tokens[:-1]]])
                logits = peaked_model(src[b : b + 1], tgt_in)[0].float()
                logits[:, [cfg.pad_id, cfg.bos_id]] = float("-inf")
                for t, token in enumerate(tokens):
                    probs = torch.softmax(logits[t].double(), dim=-1)
                    ok = allowed(probs, top_k, top_p)
                    assert token in ok, (b, t, token, sorted(ok))
                    checked += 1
                    cut += len(ok) < int((probs > 0).sum())
    assert checked > 300 and cut > checked // 2


def test_draws_follow_the_filtered_distribution():
    """Many draws from one fixed distribution: the frequencies match the kept
    probabilities (renormalised), and nothing outside them is ever drawn."""
    logp = torch.log_softmax(torch.tensor([[2.0, 1.5, 1.0, 0.0, -1.0, -3.0]]), dim=-1)
    probs = sampling_probs(logp, temperature=1.0, top_k=4, top_p=0.9)
    kept = probs[0] > 0
    assert kept.tolist() == [True, True, True, False, False, False]  # 0.9 reached at 3
    u = row_uniforms(3, range(20000), 1, 1)[:, 0]
    tokens = draw(probs.expand(20000, -1), u)
    freq = torch.bincount(tokens, minlength=6).double() / 20000
    assert freq[~kept].sum() == 0
    assert torch.allclose(freq, probs[0], atol=0.015)


def test_the_same_seed_gives_each_line_the_same_samples_in_any_batch(sample_model_dir):
    translator = Translator.from_dir(sample_model_dir(False))
    lines = [s for s, _ in PAIRS[:70]]
    options = DecodeOptions(beam=1, sampling=True, n_best=2, seed=11, top_p=0.95)
    runs = [translator.translate(lines, options, batch_size=size) for size in (1, 7, 64)]
    assert runs[0] == runs[1] == runs[2]
    # A line's samples do not depend on its neighbours: alone, or at another position in
    # a shorter input that says which line it is, it gets the same ones.
    alone = translator.translate(lines[40:41], options, first_line=40)
    assert alone[0] == runs[0][40]
    assert translator.translate(lines, options.replace(seed=12)) != runs[0]
    assert len({tuple(r) for r in runs[0]}) > 10  # varied samples, not one output
