"""How often a seeded sample depends on the batch it is decoded in (float rounding).

    python benchmarks/sampling_batches.py --model DIR [--lines 1000] [--alone 300]

A seed gives each line its own stream of uniform numbers, so no draw reads another line's
numbers. The model's probabilities are another matter: padding and batch size change the
order in which float sums are taken, which moves their last bits, and a draw that falls
within that rounding of the boundary between two tokens takes the other one. Every token
with a probability above 0 puts a boundary in the way, so the cut of top-k or top-p makes
this rarer.

On the first ``--lines`` sentences of Multi30k test2016 (German; the built-in sample when
the data is missing), with one torch thread, this counts the lines whose outputs differ
between length-sorted batches of 64 and requests of 8 lines, and between batches of 64
and each of the first ``--alone`` lines decoded alone: for plain sampling, top-p 0.9 and
top-k 20 (seed 7), and for greedy decoding and beam 4.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aiayn.decode import DecodeOptions
from aiayn.translator import Translator
from serve_load import sentences

SETTINGS = {
    "sampling": DecodeOptions(beam=1, sampling=True, seed=7),
    "sampling, top-p 0.9": DecodeOptions(beam=1, sampling=True, seed=7, top_p=0.9),
    "sampling, top-k 20": DecodeOptions(beam=1, sampling=True, seed=7, top_k=20),
    "greedy": DecodeOptions(beam=1),
    "beam 4": DecodeOptions(beam=4),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--alone", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    translator = Translator.from_dir(args.model)
    lines, source = sentences(args.lines)
    print(f"{len(lines)} lines of {source}\n")
    print("| decoding | batches of 64 vs requests of 8 | batches of 64 vs alone |")
    print("| --- | ---: | ---: |")
    for name, options in SETTINGS.items():
        big = translator.translate(lines, options, batch_size=64)
        eights = [
            out
            for at in range(0, len(lines), 8)
            for out in translator.translate(lines[at : at + 8], options, first_line=at)
        ]
        alone = [
            translator.translate([line], options, first_line=i)[0]
            for i, line in enumerate(lines[: args.alone])
        ]
        by_eight = sum(a != b for a, b in zip(big, eights))
        by_one = sum(a != b for a, b in zip(big, alone))
        print(f"| {name} | {by_eight} of {len(lines)} | {by_one} of {len(alone)} |")


if __name__ == "__main__":
    main()
