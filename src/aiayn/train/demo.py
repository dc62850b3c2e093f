"""`aiayn demo`: train a small Transformer on the built-in numbers-to-words task, then
translate held-out numbers it never saw, in about two minutes on two CPU cores."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from aiayn.config import TransformerConfig
from aiayn.data.batching import Batch, collate
from aiayn.data.demo import MAX_NUMBER, DemoVocab, as_pair, make_splits, word_sources
from aiayn.decode import greedy
from aiayn.decode.alignment import cross_attention, hard_alignment
from aiayn.errors import AiaynError
from aiayn.model.transformer import Transformer
from aiayn.progress import progress as progress_bar
from aiayn.train.loss import label_smoothed_cross_entropy
from aiayn.train.schedule import NoamSchedule

MAX_SEED = 2**63 - 1  # torch.manual_seed overflows past a signed 64-bit integer
TRAIN_NUMBERS = 50_000  # the numbers it trains on; the test numbers are others


@dataclass
class DemoResult:
    accuracy: float  # exact match on held-out numbers, 0..1
    train_seconds: float
    total_seconds: float
    steps: int
    n_parameters: int
    examples: list[tuple[str, str, str]]  # (source, reference, output)
    # Word alignment from each decoder layer's encoder-decoder attention (heads averaged)
    # against the true alignment, over the correctly translated numbers; and what a
    # uniformly random source position would score.
    alignment: list[float] = field(default_factory=list)
    alignment_chance: float = 0.0


def _encode(vocab: DemoVocab, numbers: list[int]) -> Batch:
    """src [B, S], tgt_in = BOS + words [B, T], tgt_out = words + EOS [B, T]."""
    pairs = [as_pair(n) for n in numbers]
    return collate([vocab.encode(s) for s, _ in pairs], [vocab.encode(t) for _, t in pairs])


def demo_config(vocab_size: int) -> TransformerConfig:
    """A small model: the paper's architecture at 1/4 width and 1/3 depth."""
    return TransformerConfig(
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        d_model=128,
        n_heads=4,
        n_layers=2,
        d_ff=512,
        dropout=0.1,
        max_len=32,
        share_embeddings=True,
    )


def run_demo(
    steps: int = 800,
    batch_size: int = 128,
    n_test: int = 1000,
    seed: int = 0,
    show: int = 8,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> DemoResult:
    """Train for ``steps`` updates with label smoothing 0.1 and the warmup schedule, then
    decode ``n_test`` held-out numbers greedily and report exact-match accuracy.
    AiaynError, before any training, for fewer than one step, example or test number,
    more test numbers than the 1,000,000 less the 50,000 it trains on, or a seed outside
    [0, 2**63 - 1] (what torch's generator takes)."""
    for name, value in (("steps", steps), ("batch_size", batch_size), ("n_test", n_test)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise AiaynError(f"{name} must be an integer >= 1, got {value!r}")
    if n_test > MAX_NUMBER + 1 - TRAIN_NUMBERS:
        raise AiaynError(
            f"n_test must be at most {MAX_NUMBER + 1 - TRAIN_NUMBERS:,} (the demo's "
            f"{MAX_NUMBER + 1:,} numbers less the {TRAIN_NUMBERS:,} it trains on), got {n_test:,}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise AiaynError(f"seed must be an integer in [0, 2**63 - 1], got {seed!r}")
    start = time.perf_counter()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    vocab = DemoVocab.build()
    train_numbers, test_numbers = make_splits(TRAIN_NUMBERS, n_test, seed)
    cfg = demo_config(len(vocab))
    model = Transformer(cfg)
    optimizer = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)
    schedule = NoamSchedule(optimizer, cfg.d_model, warmup=200, scale=1.0)
    log(
        f"demo: numbers -> English words; {model.num_parameters() / 1e6:.2f}M parameters, "
        f"{steps} steps of {batch_size} examples"
    )

    model.train()
    bar = progress_bar(range(steps), desc="train", unit="step", disable=not progress)
    for _ in bar:
        batch = _encode(vocab, rng.sample(train_numbers, batch_size))
        logits = model(batch.src, batch.tgt_in)
        loss, _nll, n_tokens = label_smoothed_cross_entropy(logits, batch.tgt_out, 0.1)
        optimizer.zero_grad(set_to_none=True)
        (loss / n_tokens).backward()
        optimizer.step()
        schedule.step()
        bar.set_postfix(loss=f"{loss.item() / n_tokens:.3f}", lr=f"{schedule.rate():.2e}")
    train_seconds = time.perf_counter() - start

    model.eval()
    right: list[int] = []
    examples: list[tuple[str, str, str]] = []
    for i in range(0, len(test_numbers), 250):
        chunk = test_numbers[i : i + 250]
        out = greedy(model, _encode(vocab, chunk).src, max_new_tokens=16)
        for n, ids in zip(chunk, out.tolist()):
            source, reference = as_pair(n)
            hypothesis = vocab.decode(ids)
            if hypothesis == reference:
                right.append(n)
            if len(examples) < show:
                examples.append((source, reference, hypothesis))
    accuracy = len(right) / len(test_numbers)
    alignment, chance = alignment_accuracy(model, vocab, right)
    total = time.perf_counter() - start
    for source, reference, hypothesis in examples:
        mark = "ok " if hypothesis == reference else "BAD"
        log(f"  {mark} {source.replace(' ', ''):>7} -> {hypothesis}")
    log(
        f"exact match on {len(test_numbers)} held-out numbers: {accuracy:.1%} "
        f"(train {train_seconds:.0f}s, total {total:.0f}s)"
    )
    if alignment:
        per_layer = ", ".join(f"layer {i} {a:.1%}" for i, a in enumerate(alignment, start=1))
        log(f"word alignment from cross-attention: {per_layer} (chance {chance:.1%})")
    return DemoResult(
        accuracy, train_seconds, total, steps, model.num_parameters(), examples, alignment, chance
    )


def alignment_accuracy(
    model: Transformer, vocab: DemoVocab, numbers: list[int]
) -> tuple[list[float], float]:
    """For each decoder layer, the share of output words whose most-attended source digit
    (encoder-decoder attention, heads averaged: :mod:`aiayn.decode.alignment`) is one the
    word comes from (:func:`word_sources`), over the correct translations of ``numbers``;
    and the share a uniformly random digit would get."""
    if not numbers:
        return [], 0.0
    batch = _encode(vocab, numbers)
    hits = [0] * model.cfg.decoder_layers
    words = chance = 0.0
    for layer in range(1, model.cfg.decoder_layers + 1):
        weights = cross_attention(model, batch.src, batch.tgt_in, layer)  # [B, T, S]
        for b, n in enumerate(numbers):
            gold, S = word_sources(n), len(str(n))
            links = hard_alignment(weights[b, : len(gold), :S])
            hits[layer - 1] += sum(link in g for link, g in zip(links, gold))
            if layer == 1:
                words += len(gold)
                chance += sum(len(g) / S for g in gold)
    return [h / words for h in hits], chance / words
