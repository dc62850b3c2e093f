"""`aiayn summary`, `attention` and `plot`: looking inside a model and a run."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from aiayn.cli.flags import (
    add_decoding_flags,
    note_stale_averages,
    text_arg,
    translator_for,
)
from aiayn.config import BOS_ID, EOS_ID, PAD_ID, TransformerConfig
from aiayn.errors import AiaynError

if TYPE_CHECKING:
    from aiayn.model.transformer import Transformer

# What `attention --out` writes as one picture (matplotlib's formats); any other path is a
# folder for every kind and layer.
PICTURES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")
# Picture formats it does not write: a folder by that name would surprise.
OTHER_PICTURES = (".gif", ".bmp", ".tif", ".tiff", ".webp", ".eps", ".ps", ".avif", ".heic")


def cmd_summary(args: argparse.Namespace) -> int:
    from aiayn.inspect import summary

    if args.depth < 1:
        raise AiaynError(f"--depth must be at least 1, got {args.depth}")
    if args.model:  # a trained model: its own config and weights
        from aiayn.checkpoint import load_inference, resolve_checkpoint
        from aiayn.decode import DecodeOptions
        from aiayn.decode.options import length_rule

        for flag in ("preset", "vocab"):
            if getattr(args, flag) is not None:
                raise AiaynError(f"--{flag} sets up an untrained preset; it cannot go with --model")
        note_stale_averages(args.model, args.checkpoint)
        path = resolve_checkpoint(args.model, args.checkpoint or "auto")
        model, _, generation = load_inference(path)
        print(summary(model, depth=args.depth))  # its lengths fit the model's positions
        defaults = DecodeOptions.from_generation(generation) if generation else DecodeOptions()
        print(f"output length by default: {length_rule(defaults, model.cfg.max_len, generation)}")
        return 0
    if args.checkpoint is not None:
        raise AiaynError("--checkpoint needs --model (a preset has no checkpoints)")
    vocab = 37000 if args.vocab is None else args.vocab
    if vocab < (least := max(PAD_ID, BOS_ID, EOS_ID) + 1):  # the special ids are in it
        raise AiaynError(f"--vocab must be at least {least} (PAD, BOS and EOS), got {vocab}")
    print(summary(_preset_model(args.preset or "base", vocab), depth=args.depth))
    return 0


def _preset_model(preset: str, vocab: int) -> Transformer:
    """The untrained ``preset`` model of a ``vocab`` joint vocabulary; refused when its
    weights would not fit in this machine's memory (the allocator's error is a traceback,
    or the machine swaps)."""
    import torch

    from aiayn.model.transformer import Transformer

    cfg = {"base": TransformerConfig.base, "big": TransformerConfig.big}[preset](vocab)
    with torch.device("meta"):  # shapes only: nothing allocated
        size = sum(p.numel() * p.element_size() for p in Transformer(cfg).parameters())
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not on every system (Windows)
        memory = None
    if memory and size > memory:
        raise AiaynError(
            f"--vocab {vocab:,}: the {preset} model's weights take {size / 2**30:,.0f} GiB, "
            f"more than this machine's {memory / 2**30:,.0f} GiB of memory"
        )
    return Transformer(cfg)


def cmd_attention(args: argparse.Namespace) -> int:
    from aiayn.cli.common import MODEL_NAMES, MODEL_SUFFIXES, cut_lines, note_cut
    from aiayn.inspect.attention import ATTENTION_KINDS, plot_all, plot_attention, text_heatmap
    from aiayn.inspect.curves import pyplot
    from aiayn.inspect.maps import attention

    picture = (args.out or "").lower().endswith(PICTURES)  # else a folder of PNGs
    if args.out and not picture and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise AiaynError(
            f"--out {args.out}: a file; give a picture ({', '.join(PICTURES)}) or a folder"
        )
    parent = os.path.dirname(args.out or "")  # made if missing; a file there cannot be
    if parent and os.path.exists(parent) and not os.path.isdir(parent):
        raise AiaynError(f"--out {args.out}: {parent} is a file, not a folder to write in")
    real = os.path.realpath(args.out or "")  # a link: the file it would write
    if picture and (real.endswith(MODEL_SUFFIXES) or os.path.basename(real) in MODEL_NAMES):
        raise AiaynError(f"--out {args.out}: a link to {real}, a model's file; give another")
    if args.out and args.out.lower().endswith(OTHER_PICTURES) and not os.path.isdir(args.out):
        raise AiaynError(
            f"--out {args.out}: pictures are {', '.join(PICTURES)}; a folder takes no such suffix"
        )
    if args.out:
        pyplot()  # matplotlib, an optional extra: missing, say so before translating
    translator = translator_for(args)
    note_cut(cut_lines(translator, [args.sentence]), translator.max_source_tokens)
    amap = attention(translator, args.sentence, beam=args.beam, alpha=args.alpha)
    # The output's pieces: the labels less their EOS (an output cut at max_len has none).
    eos = translator.tokenizer.id_to_piece(translator.model.cfg.eos_id)
    target = amap.target[:-1] if amap.target[-1:] == [eos] else amap.target
    pieces = [translator.tokenizer.piece_to_id(p) for p in target]
    layer = -1 if args.layer is None else args.layer  # the last layer unless one is chosen
    # The chosen kind, layer and head as text (checked here, before anything is printed).
    text = text_heatmap(amap, layer, args.kind or "cross", args.head or 0)
    print("translation: " + translator.tokenizer.decode(pieces))
    print(text)
    if not args.out:
        return 0
    if picture:  # one picture: a head, or the grid of a layer
        kind = args.kind or "cross"
        print(f"wrote {plot_attention(amap, args.out, kind, layer, args.head)}")
    else:  # a folder: every layer (or the chosen one) of every kind (or the chosen one)
        kinds = [args.kind] if args.kind else list(ATTENTION_KINDS)
        written = plot_all(amap, args.out, kinds, args.layer, args.head)
        print(f"wrote {len(written)} PNGs to {args.out}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from aiayn.inspect.curves import plot_curves

    written = plot_curves(args.run, args.out)
    if not written:  # records with steps, but no numbers to draw
        run = Path(args.run)
        metrics = run / "metrics.jsonl" if run.is_dir() else run
        raise AiaynError(f"{metrics}: no numeric loss, bleu, lr or tokens_per_s to plot")
    for path in written:
        print(f"wrote {path}")
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("summary", help="print the layer table of a preset or trained model")
    # No defaults for the flags of one kind of model: given with the other kind, they
    # are refused rather than ignored.
    p.add_argument(
        "--preset", choices=["base", "big"], help="an untrained model of the paper (default base)"
    )
    p.add_argument("--vocab", type=int, help="joint vocabulary of the preset (default 37000)")
    p.add_argument("--model", help="a trained model directory instead of a preset")
    p.add_argument(
        "--checkpoint", help="with --model: auto (default)|averaged|best|last or a .pt file"
    )
    p.add_argument("--depth", type=int, default=3, help="module nesting shown, from 1")
    p.set_defaults(func=cmd_summary)

    p = sub.add_parser("attention", help="attention heatmaps of one sentence's translation")
    add_decoding_flags(p)
    p.add_argument("sentence", type=text_arg, help="source sentence")
    p.add_argument(
        "--kind",
        choices=["encoder", "decoder_self", "cross"],
        help="default: cross (a folder: every kind)",
    )
    p.add_argument("--layer", type=int, help="layer, from 1; negative: from the last (default -1)")
    p.add_argument(
        "--head", type=int, default=0, help="one head, from 1 (default: the mean; a PNG: all)"
    )
    p.add_argument(
        "--out", help="a picture (.png, .svg, .pdf, .jpg), or a folder for every kind and layer"
    )
    p.set_defaults(func=cmd_attention)

    p = sub.add_parser("plot", help="draw loss, BLEU, learning rate and tokens/s of a run")
    p.add_argument(
        "--run",
        required=True,
        help="model directory (its metrics.jsonl), or a metrics file or pipe",
    )
    p.add_argument("--out", help="folder for the PNGs (default RUN/plots; from a pipe, ./plots)")
    p.set_defaults(func=cmd_plot)
