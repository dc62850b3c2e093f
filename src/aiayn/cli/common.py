"""What several subcommands share: reading input, writing output, loading the translator
and decoding lines (split across processes under torchrun), and their common flags."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aiayn.errors import AiaynError


def read_input(path: str | None) -> list[str]:
    from aiayn.data.corpus import decode_lines, read_lines

    if path is None or path == "-":  # bytes, so invalid UTF-8 is an error as in a file
        return decode_lines(sys.stdin.buffer.read(), "<stdin>")
    return read_lines(path)


def write_text(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise AiaynError(f"{path}: cannot write ({e.strerror or e})") from None


def translator_for(args: argparse.Namespace, device: str | None = None):
    from aiayn.translator import Translator

    return Translator.from_dir(
        args.model,
        checkpoint=args.checkpoint,
        device=device or args.device,
        quantize=getattr(args, "quantize", False),
        precision=getattr(args, "precision", "fp32"),
    )


def translate_lines(args: argparse.Namespace, lines: list[str], n_best: int = 1):
    """``n_best`` translations per line. Under torchrun every process decodes its share of
    the lines and rank 0 gets them all, in input order (the other ranks get None)."""
    from aiayn.distributed import init_from_env
    from aiayn.progress import progress

    world = init_from_env(args.device)
    translator = translator_for(args, world.device(args.device))
    share = world.shard(len(lines))
    mine = lines[share.start : share.stop]
    quiet = args.quiet or not world.is_main
    with progress(total=len(mine), desc="translate", unit="sent", disable=quiet) as bar:
        outputs = translator.translate(
            mine, beam=args.beam, alpha=args.alpha, n_best=n_best, on_batch=bar.update
        )
    return world.gather(outputs)


def add_inference_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quantize", action="store_true", help="int8 dynamic quantization (CPU only; faster)"
    )
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="weights for decoding: bf16 is faster on GPUs and on CPUs with AVX512-BF16/AMX",
    )


def add_decoding_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model directory from `aiayn train`")
    p.add_argument("--checkpoint", default="auto", help="auto|averaged|best|last or a .pt file")
    p.add_argument("--beam", type=int, default=4, help="beam size; 1 = greedy (default 4)")
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty (default 0.6)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
