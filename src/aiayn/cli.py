"""The `aiayn` command line: each subcommand is a thin layer over the library."""

from __future__ import annotations

import argparse
import sys

from aiayn.config import TransformerConfig


def cmd_demo(args: argparse.Namespace) -> int:
    from aiayn.train.demo import run_demo

    result = run_demo(steps=args.steps, seed=args.seed, progress=not args.no_progress)
    return 0 if result.accuracy >= args.min_accuracy else 1


def cmd_summary(args: argparse.Namespace) -> int:
    from aiayn.inspect import summary
    from aiayn.model.transformer import Transformer

    preset = {"base": TransformerConfig.base, "big": TransformerConfig.big}[args.preset]
    print(summary(Transformer(preset(args.vocab)), depth=args.depth))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn", description="The original Transformer: train, translate, score, inspect."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="train on the built-in numbers-to-words task (~2 min, CPU)")
    p.add_argument("--steps", type=int, default=800, help="training updates (default 800)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--min-accuracy", type=float, default=0.0, help="exit 1 below this exact-match (0..1)"
    )
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("summary", help="print a layer table of a preset model (paper Table 3)")
    p.add_argument("--preset", choices=["base", "big"], default="base")
    p.add_argument("--vocab", type=int, default=37000, help="joint vocabulary size")
    p.add_argument("--depth", type=int, default=3, help="module nesting shown")
    p.set_defaults(func=cmd_summary)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
