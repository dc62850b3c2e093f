"""`aiayn import` and `aiayn export`: models from other libraries in, and out to other
runtimes (one sub-command per format)."""

from __future__ import annotations

import argparse

from aiayn.cli.flags import note_stale_averages
from aiayn.errors import AiaynError


def cmd_import_marian(args: argparse.Namespace) -> int:
    from aiayn.checkpoint import BEST
    from aiayn.marian import import_marian

    out = import_marian(args.folder, args.out)
    print(f"imported {args.folder} -> {out} ({BEST}, tokenizer files, generation_config.json)")
    return 0


def cmd_export_ctranslate2(args: argparse.Namespace) -> int:
    from aiayn.export import ExportExistsError, export_ctranslate2

    note_stale_averages(args.model, args.checkpoint)  # as the decoding commands say it
    try:
        out = export_ctranslate2(
            args.model, args.out, args.checkpoint, args.quantization, args.force
        )
    except ExportExistsError as e:
        raise AiaynError(f"{e}; give --force to replace it") from None
    print(f"exported {args.model} -> {out} (CTranslate2, {args.quantization})")
    return 0


def cmd_export_marian(args: argparse.Namespace) -> int:
    from aiayn.marian.export import ExportExistsError, export_marian

    note_stale_averages(args.model, args.checkpoint)
    try:
        out = export_marian(args.model, args.out, args.checkpoint, args.force)
    except ExportExistsError as e:
        raise AiaynError(f"{e}; give --force to replace it") from None
    print(f"exported {args.model} -> {out} (transformers MarianMTModel)")
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("import", help="convert a pretrained model folder into a model directory")
    formats = p.add_subparsers(dest="format", required=True, metavar="FORMAT")
    p = formats.add_parser(
        "marian", help="a transformers MarianMTModel folder (OPUS-MT), read locally"
    )
    p.add_argument("folder", help="the folder: config.json, weights, source/target.spm, vocab.json")
    p.add_argument("--out", required=True, help="new model directory")
    p.set_defaults(func=cmd_import_marian)

    from aiayn.export import CT2_QUANTIZATIONS

    p = sub.add_parser("export", help="convert a trained model for another inference runtime")
    formats = p.add_subparsers(dest="format", required=True, metavar="FORMAT")
    p = formats.add_parser("ctranslate2", help="a CTranslate2 model folder (needs ctranslate2)")
    p.add_argument("--model", required=True, help="model directory from `aiayn train`")
    p.add_argument("--out", required=True, help="output folder (model.bin, vocabulary, tokenizer)")
    p.add_argument("--checkpoint", default="auto", help="auto|averaged|best|last or a .pt file")
    p.add_argument(
        "--quantization", default="float32", choices=CT2_QUANTIZATIONS, help="weight type"
    )
    p.add_argument("--force", action="store_true", help="replace an earlier export in --out")
    p.set_defaults(func=cmd_export_ctranslate2)

    p = formats.add_parser(
        "marian", help="a transformers MarianMTModel folder (safetensors, config, tokenizer)"
    )
    p.add_argument("--model", required=True, help="model directory (trained or imported)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--checkpoint", default="auto", help="auto|averaged|best|last or a .pt file")
    p.add_argument("--force", action="store_true", help="replace an earlier export in --out")
    p.set_defaults(func=cmd_export_marian)
