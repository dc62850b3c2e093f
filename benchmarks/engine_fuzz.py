"""Differential fuzz of the decoding engine: sentences that join a running batch at random
steps, with random options, length penalties, forced prefixes and removes, against each
sentence decoded alone.

    python benchmarks/engine_fuzz.py --model DIR [--also CKPT] [--seed 1] [--seconds 300]

Each case draws one setting (beam 1-5 or sampling with temperature, top-k, top-p and a
seed; n-best, both length penalties, every early-stopping mode, forced EOS, length rules),
1-12 sentences of Multi30k test2016 (the built-in sample when the data is missing), some
with a forced prefix (the first words of their reference), and runs them through one
``BeamEngine``: groups of 1-4 join at random steps, each group with its own alpha, and now
and then a running sentence is removed. Every sentence that finished must equal
``search`` (``beam_search`` for beam search of one beam) on it alone, with its alpha,
prefix and line index: the same tokens, log-probs and scores to 1e-4. A quarter of the
cases decode with an ensemble of ``--model`` and ``--also`` (a checkpoint) when given.
Prints every difference and the counts, sampled sentences apart: a draw can flip at a
token boundary under float rounding (benchmarks/sampling_batches.py).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import torch

from aiayn.data.batching import pad
from aiayn.data.corpus import read_lines
from aiayn.decode import BeamEngine, DecodeOptions, Hypothesis, beam_search, search
from aiayn.translator import Translator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the data locator
from sample_data import PAIRS, multi30k_dir


def corpus() -> tuple[list[str], list[str]]:
    data = multi30k_dir()
    if data is None:
        return [de for de, _ in PAIRS], [en for _, en in PAIRS]
    return read_lines(data / "test2016.de.gz"), read_lines(data / "test2016.en.gz")


def random_options(rng: random.Random) -> DecodeOptions:
    sampling = rng.random() < 0.3
    beam = 1 if sampling else rng.choice([1, 1, 2, 3, 4, 5])
    settings = dict(
        beam=beam,
        n_best=rng.randint(1, 3) if sampling else rng.randint(1, beam),
        length_penalty=rng.choice(["gnmt", "hf"]),
        early_stopping=rng.choice(["never", False, True]),
        forced_eos=rng.random() < 0.2,
        max_new_tokens=rng.choice([None, None, None, 0, 1, 3, 12]),
        max_len_a=rng.choice([1.0, 0.5, 0.0]),
        max_len_b=rng.choice([50, 5, 0, 2]),
    )
    if sampling:
        settings.update(
            sampling=True,
            seed=rng.randint(0, 99),
            top_k=rng.choice([0, 5, 20]),
            top_p=rng.choice([1.0, 0.9, 0.5]),
            temperature=rng.choice([1.0, 0.7, 1.5]),
        )
    return DecodeOptions(**settings)


def same(got: list[Hypothesis] | None, want: list[Hypothesis]) -> bool:
    def close(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4)

    return (
        got is not None
        and [h.tokens for h in got] == [h.tokens for h in want]
        and all(
            close(a.log_prob, b.log_prob) and close(a.score, b.score) for a, b in zip(got, want)
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--also", help="a second checkpoint: some cases decode an ensemble")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=300.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    one = Translator.from_dir(args.model, checkpoint="last")
    both = Translator.from_dir(args.model, checkpoint=["last", args.also]) if args.also else None
    src_lines, ref_lines = corpus()
    rng = random.Random(args.seed)
    counts = {"sampled": [0, 0], "other": [0, 0]}  # [sentences, differing]
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        tr = both if both is not None and rng.random() < 0.25 else one
        options, pad_id = random_options(rng), tr.model.cfg.pad_id
        one_per_row = None if options.beam > 1 or options.sampling else rng.choice([None, False])
        engine: BeamEngine[int] = BeamEngine(tr.models, options, one_per_row=one_per_row)
        sentences = []  # (tag, ids, prefix, line index); alpha per group below
        for tag in range(rng.randint(1, 12)):
            i = rng.randrange(len(src_lines))
            ids = tr.encode(src_lines[i])[: 1 if rng.random() < 0.05 else None]
            words = ref_lines[i].split()[: rng.randint(1, 4)]
            prefix = tr.tokenizer.encode_target(" ".join(words)) if rng.random() < 0.3 else []
            sentences.append((tag, ids, prefix, rng.randrange(1000)))
        waiting, alphas, found, removed = list(sentences), {}, {}, set()
        while waiting or len(engine):
            if waiting and (not len(engine) or rng.random() < 0.4):
                k = rng.randint(1, min(4, len(waiting)))
                group, waiting = waiting[:k], waiting[k:]
                alpha = rng.choice([0.6, 1.0, 0.0, 2.0])
                alphas.update((s[0], alpha) for s in group)
                engine.add(
                    pad([s[1] for s in group], pad_id),
                    [s[0] for s in group],
                    prefix=[s[2] for s in group],
                    alpha=alpha,
                    lines=[s[3] for s in group],
                )
            if len(engine) and rng.random() < 0.03:
                gone = rng.choice([u.tag for u in engine.units])
                engine.remove({gone})
                removed.add(gone)
            for tag, hypotheses in engine.step():
                found[tag] = hypotheses[: options.n_best]
        for tag, ids, prefix, line in sentences:
            if tag in removed:
                continue
            alone = options.replace(alpha=alphas[tag])
            src = pad([ids], pad_id)
            if one_per_row is False:  # beam search of one beam, not greedy decoding
                want = beam_search(tr.models, src, alone, prefix=[prefix])[0]
            else:
                want = search(tr.models, src, alone, prefix=[prefix], lines=[line])[0]
            kind = counts["sampled" if options.sampling else "other"]
            kind[0] += 1
            if not same(found.get(tag), want):
                kind[1] += 1
                print(f"differs: {options}, alpha {alphas[tag]}, source {ids}, prefix {prefix}")
                print(f"  in the batch: {[(h.tokens, h.log_prob) for h in found.get(tag, [])]}")
                print(f"  alone:        {[(h.tokens, h.log_prob) for h in want]}")
    for kind, (n, bad) in counts.items():
        print(f"{kind}: {n} sentences, {bad} differ from their result alone")


if __name__ == "__main__":
    main()
