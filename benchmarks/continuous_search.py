"""Continuous beam search in-process, without HTTP: the ceiling of `aiayn serve`.

    python benchmarks/continuous_search.py --model /work/models/de-en

Takes the first ``--requests`` sentences of Multi30k test2016 (German; the built-in
sample when the data is missing) and, with one torch thread:

1. translates them offline with ``Translator.hypotheses`` (length-sorted batches of
   64), before each run below and after the last (the machine is shared: each run is
   compared with the mean of the offline runs around it);
2. runs them through one ``BeamEngine`` with ``C`` sentences in flight: each
   sentence that is done frees its place for the next one (a server whose C clients
   answer instantly), and the waiting ones join together once they number ``--join-ratio``
   x those running, as in the server (``ServeConfig.join_ratio``), for C in
   ``--concurrency``; reports the time spent joining (encoder pass and cache copy);
3. times one decoding step with n sentences running, for n in 1, 8, 16, 32, 64 (the cost
   per sentence-step, and the part every step pays whatever its size).

Checks that every continuous result equals the offline one, and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from aiayn.data.batching import pad
from aiayn.translator import Translator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import sentences


def closed_loop(translator, ids: list[list[int]], concurrency: int, beam: int, ratio: float):
    """Sentences/s, mean sentences per step, seconds spent joining and the outputs (best
    ids per sentence)."""
    search = translator.continuous_search(translator.defaults.replace(beam=beam))
    pad_id, out = translator.model.cfg.pad_id, {}
    nxt, steps, running, joining = 0, 0, 0, 0.0
    start = time.perf_counter()
    while len(out) < len(ids):
        free = min(concurrency - len(search), len(ids) - nxt)
        if free > 0 and (free >= ratio * len(search) or nxt + free == len(ids)):
            t = time.perf_counter()
            search.add(pad(ids[nxt : nxt + free], pad_id), list(range(nxt, nxt + free)))
            joining += time.perf_counter() - t
            nxt += free
        running += len(search)
        steps += 1
        for tag, hyps in search.step():
            out[tag] = hyps[0].tokens
    seconds = time.perf_counter() - start
    return len(ids) / seconds, running / steps, joining, [out[i] for i in range(len(ids))]


def step_ms(translator: Translator, ids: list[list[int]], n: int, beam: int) -> float:
    """Median time of a decoding step with ``n`` sentences running (none may end)."""
    options = translator.defaults.replace(beam=beam, max_len_a=0.0, max_len_b=200)
    search = translator.continuous_search(options)
    search.add(pad(ids[:n], translator.model.cfg.pad_id), list(range(n)))
    for _ in range(3):
        search.step()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        search.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--join-ratio", type=float, default=0.25)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines, data = sentences(args.requests)
    translator = Translator.from_dir(args.model)
    ids = [translator.encode(line) for line in lines]
    ids = [s for s in ids if s]  # a blank line never enters a search
    options = translator.defaults.replace(beam=args.beam)
    translator.hypotheses(ids[:16], options)  # warm-up

    def offline() -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        out = [c[0].tokens for c in translator.hypotheses(ids, options)]
        return len(ids) / (time.perf_counter() - start), out

    before, want = offline()
    print(f"{len(ids)} sentences ({data}), beam {args.beam}, 1 thread")
    print(
        "| sentences in flight | sentences/s | offline (sorted batches of 64) before, after "
        "| / offline | mean running | joining | equal to offline |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for c in args.concurrency:
        rate, running, joining, got = closed_loop(translator, ids, c, args.beam, args.join_ratio)
        after, _ = offline()
        same = sum(g == w for g, w in zip(got, want))
        print(
            f"| {c} | {rate:.1f} | {before:.1f}, {after:.1f} | {rate / ((before + after) / 2):.0%} "
            f"| {running:.1f} | {joining * rate / len(ids):.0%} | {same}/{len(ids)} |"
        )
        before = after
    print("\n| sentences running | ms per step | ms per sentence-step |")
    print("| ---: | ---: | ---: |")
    for n in (1, 8, 16, 32, 64):
        ms = step_ms(translator, ids, min(n, len(ids)), args.beam)
        print(f"| {n} | {ms:.1f} | {ms / n:.2f} |")


if __name__ == "__main__":
    main()
