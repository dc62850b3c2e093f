"""`aiayn translate` and `evaluate`."""

from __future__ import annotations

import argparse
import sys

from aiayn.cli.common import (
    add_decoding_flags,
    add_inference_flags,
    read_input,
    translate_lines,
    write_text,
)
from aiayn.errors import AiaynError


def cmd_translate(args: argparse.Namespace) -> int:
    from aiayn.distributed import init_from_env

    if (args.input is None or args.input == "-") and init_from_env(args.device).size > 1:
        raise AiaynError("several processes read an input file, not stdin: give the file")
    lines = read_input(args.input)
    outputs = translate_lines(args, lines, args.n_best)
    if outputs is None:  # not rank 0: rank 0 writes everything
        return 0
    if args.n_best == 1:
        text = "".join(candidates[0] + "\n" for candidates in outputs)
    else:  # still one line per input line: the n-best joined by " ||| "
        text = "".join(" ||| ".join(c) + "\n" if any(c) else "\n" for c in outputs)
    if args.output:
        write_text(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    import sacrebleu

    from aiayn.data.corpus import read_lines
    from aiayn.metrics import corpus_bleu

    src, ref = read_lines(args.src), read_lines(args.ref)
    if len(src) != len(ref):
        raise AiaynError(f"{args.src} has {len(src)} lines but {args.ref} has {len(ref)}")
    outputs = translate_lines(args, src)
    if outputs is None:  # not rank 0
        return 0
    hyps = [h[0] for h in outputs]
    if args.output:
        write_text(args.output, "".join(h + "\n" for h in hyps))
    bleu = corpus_bleu(hyps, ref)
    print(f"{bleu}  [{bleu.signature}]")
    chrf = sacrebleu.corpus_chrf(hyps, [ref])
    print(f"{chrf}  (sacrebleu)")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("translate", help="translate a file or stdin, one line per line")
    add_decoding_flags(p)
    add_inference_flags(p)
    p.add_argument("input", nargs="?", help="input file (plain or .gz); default stdin")
    p.add_argument("-o", "--output", help="output file; default stdout")
    p.add_argument("--n-best", type=int, default=1, help="candidates per line, ' ||| '-joined")
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("evaluate", help="translate --src and print BLEU against --ref")
    add_decoding_flags(p)
    add_inference_flags(p)
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("-o", "--output", help="also write the translations here")
    p.set_defaults(func=cmd_evaluate)
