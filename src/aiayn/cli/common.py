"""What several subcommands share: reading input, writing output, loading the translator
and decoding lines (split across processes under torchrun), and their common flags."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from aiayn.errors import AiaynError

if TYPE_CHECKING:  # imported where used, so that `aiayn --help` starts fast
    from aiayn.decode.options import DecodeOptions
    from aiayn.translator import Translation, Translator


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


def translator_for(args: argparse.Namespace, device: str | None = None) -> Translator:
    """The Translator of ``--model`` (several: an ensemble) and ``--checkpoint``."""
    from aiayn.translator import Translator

    return Translator.from_dir(
        args.model,
        checkpoint=args.checkpoint if args.checkpoint else "auto",
        device=device or args.device,
        quantize=getattr(args, "quantize", False),
        precision=getattr(args, "precision", "fp32"),
    )


# The flags that set DecodeOptions fields of the same name; unset (None) ones keep the
# model's defaults (the paper's, or an imported model's generation settings).
OPTION_FLAGS = (
    "beam", "alpha", "max_len_a", "max_len_b", "length_penalty", "early_stopping",
    "forced_eos", "sampling", "temperature", "top_k", "top_p", "seed", "prefix",
)  # fmt: skip


def decode_options(
    args: argparse.Namespace, defaults: DecodeOptions, n_best: int = 1
) -> DecodeOptions:
    """``defaults`` (a :class:`~aiayn.decode.DecodeOptions`) with the decoding flags that
    were given; checked there. Sampling without a beam flag samples (beam 1)."""
    given = {name: getattr(args, name, None) for name in OPTION_FLAGS}
    if given["sampling"] and given["beam"] is None:
        given["beam"] = 1
    return defaults.given(n_best=n_best, **given)


def translate_lines(
    args: argparse.Namespace,
    lines: list[str],
    n_best: int = 1,
    prefixes: list[str] | None = None,
    alignment_layer: int | None = None,
) -> list[list[Translation]] | None:
    """``n_best`` :class:`~aiayn.translator.Translation` objects per line. Under torchrun
    every process decodes its share of the lines and rank 0 gets them all, in input order
    (the other ranks get None); line indices stay those of the whole input, so samples do
    not depend on the number of processes."""
    from aiayn.distributed import init_from_env
    from aiayn.progress import progress

    world = init_from_env(args.device)
    translator = translator_for(args, world.device(args.device))
    options = decode_options(args, translator.defaults, n_best)
    share = world.shard(len(lines))
    mine = lines[share.start : share.stop]
    quiet = args.quiet or not world.is_main
    with progress(total=len(mine), desc="translate", unit="sent", disable=quiet) as bar:
        outputs = translator.translations(
            mine,
            options,
            prefixes=prefixes[share.start : share.stop] if prefixes is not None else None,
            first_line=share.start,
            on_batch=bar.update,
            scores=getattr(args, "format", "text") == "jsonl",  # text output prints none
        )
    if alignment_layer is not None:
        from aiayn.inspect.maps import add_alignments

        add_alignments(
            translator, [translator.encode(line) for line in mine], outputs, alignment_layer
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


def add_ensemble_flags(p: argparse.ArgumentParser) -> None:
    """--model and --checkpoint, each repeatable: one model or an ensemble."""
    p.add_argument(
        "--model",
        required=True,
        action="append",
        help="model directory from `aiayn train`; repeat it for an ensemble",
    )
    p.add_argument(
        "--checkpoint",
        action="append",
        help="auto|averaged|best|last or a .pt file (default auto); repeat it for an "
        "ensemble of one directory's checkpoints, or give one per --model",
    )


def add_decoding_flags(p: argparse.ArgumentParser, ensemble: bool = False) -> None:
    if ensemble:
        add_ensemble_flags(p)
    else:
        p.add_argument("--model", required=True, help="model directory from `aiayn train`")
        p.add_argument("--checkpoint", default="auto", help="auto|averaged|best|last or a .pt file")
    p.add_argument(
        "--beam", type=int, default=None, help="beam size; 1 = greedy (default 4; 1 sampling)"
    )
    p.add_argument("--alpha", type=float, default=None, help="length penalty (default 0.6)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_search_flags(p: argparse.ArgumentParser) -> None:
    """Length rule, penalty formula, stopping, sampling: the rest of DecodeOptions. Every
    default is None: the model's own (the paper's settings, or an imported model's
    generation_config.json)."""
    g = p.add_argument_group("search (defaults: the paper's, or an imported model's own)")
    g.add_argument("--max-len-a", type=float, help="output tokens <= a * source + b (a=1)")
    g.add_argument("--max-len-b", type=int, help="(b=50)")
    g.add_argument(
        "--length-penalty",
        choices=["gnmt", "hf"],
        help="gnmt: ((5+|Y|)/6)^alpha (the paper's); hf: |Y|^alpha (Hugging Face's)",
    )
    g.add_argument(
        "--early-stopping",
        type=_early_stopping,
        help="never (exact; default), false (generate()'s default heuristic) or true",
    )
    g.add_argument(
        "--forced-eos",
        action="store_true",
        default=None,
        help="an output that reaches its length limit ends with EOS scored 0 (generate()'s "
        "forced_eos_token_id)",
    )
    g = p.add_argument_group("sampling")
    g.add_argument(
        "--sampling",
        action="store_true",
        default=None,
        help="draw each token (--n-best N: N samples)",
    )
    g.add_argument("--temperature", type=float, help="(default 1.0)")
    g.add_argument("--top-k", type=int, help="only the k most likely (default 0: all)")
    g.add_argument("--top-p", type=float, help="nucleus mass (default 1.0: all)")
    g.add_argument("--seed", type=int, help="the same seed gives each line the same samples")


def _early_stopping(text: str) -> bool | str:
    values: dict[str, bool | str] = {"never": "never", "true": True, "false": False}
    value = values.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected never, true or false")
    return value
