"""The `aiayn` command line: each subcommand is a thin layer over the library.

Errors the user can fix (bad files, bad recipes, bad checkpoints: every
:class:`~aiayn.errors.AiaynError`) print one line naming the file or field and exit with
status 2. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from aiayn.config import TransformerConfig
from aiayn.errors import AiaynError

EXIT_USER_ERROR = 2


def cmd_demo(args: argparse.Namespace) -> int:
    from aiayn.train.demo import run_demo

    result = run_demo(steps=args.steps, seed=args.seed, progress=not args.no_progress)
    return 0 if result.accuracy >= args.min_accuracy else 1


def cmd_summary(args: argparse.Namespace) -> int:
    from aiayn.inspect import summary

    if args.model:  # a trained model: its own config and weights
        from aiayn.checkpoint import load_model, resolve_checkpoint

        model, _ = load_model(resolve_checkpoint(args.model, args.checkpoint))
    else:
        from aiayn.model.transformer import Transformer

        preset = {"base": TransformerConfig.base, "big": TransformerConfig.big}[args.preset]
        model = Transformer(preset(args.vocab))
    print(summary(model, depth=args.depth))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from aiayn.train.recipe import Recipe
    from aiayn.train.trainer import Trainer

    overrides = list(args.set or [])
    for flag in ("data", "train_src", "train_tgt", "valid_src", "valid_tgt"):
        if getattr(args, flag):
            overrides.append(f"{flag}={Path(getattr(args, flag)).resolve()}")
    recipe = (
        Recipe.from_yaml(args.config, overrides) if args.config else Recipe().override(overrides)
    )
    for flag in ("train_src", "train_tgt", "valid_src", "valid_tgt"):
        if not recipe.data and not getattr(recipe, flag):
            raise AiaynError(
                f"recipe field {flag!r} is empty: give --{flag.replace('_', '-')} (or --data)"
            )
    trainer = Trainer(recipe, args.out, resume=args.resume)
    trainer.train(progress=not args.no_progress)
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from aiayn.data.prepared import prepare

    manifest = prepare(
        (args.train_src, args.train_tgt),
        (args.valid_src, args.valid_tgt),
        args.out,
        vocab_size=args.vocab_size,
        spm_model=args.spm_model,
        model_type=args.spm_model_type,
        max_len_words=args.max_len_words or None,
        workers=args.workers,
        sample=args.spm_sample,
        seed=args.seed,
        show_progress=not args.no_progress,
    )
    train = manifest["splits"]["train"]
    print(
        f"{train['pairs']} training pairs ({train['dropped_empty']} empty and "
        f"{train['dropped_long']} long dropped), {manifest['vocab_size']} tokens, "
        f"{manifest['dtype']}, {manifest['seconds']} s -> {args.out}"
    )
    return 0


def _read_input(path: str | None) -> list[str]:
    from aiayn.data.corpus import decode_lines, read_lines

    if path is None or path == "-":  # bytes, so invalid UTF-8 is an error as in a file
        return decode_lines(sys.stdin.buffer.read(), "<stdin>")
    return read_lines(path)


def _write_text(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise AiaynError(f"{path}: cannot write ({e.strerror or e})") from None


def _translator(args: argparse.Namespace, device: str | None = None):
    from aiayn.translator import Translator

    return Translator.from_dir(
        args.model,
        checkpoint=args.checkpoint,
        device=device or args.device,
        quantize=getattr(args, "quantize", False),
        precision=getattr(args, "precision", "fp32"),
    )


def _translate_lines(args: argparse.Namespace, lines: list[str], n_best: int = 1):
    """``n_best`` translations per line. Under torchrun every process decodes its share of
    the lines and rank 0 gets them all, in input order (the other ranks get None)."""
    from aiayn.distributed import init_from_env
    from aiayn.progress import progress

    world = init_from_env(args.device)
    translator = _translator(args, world.device(args.device))
    share = world.shard(len(lines))
    mine = lines[share.start : share.stop]
    quiet = args.quiet or not world.is_main
    with progress(total=len(mine), desc="translate", unit="sent", disable=quiet) as bar:
        outputs = translator.translate(
            mine, beam=args.beam, alpha=args.alpha, n_best=n_best, on_batch=bar.update
        )
    return world.gather(outputs)


def cmd_translate(args: argparse.Namespace) -> int:
    from aiayn.distributed import init_from_env

    if (args.input is None or args.input == "-") and init_from_env(args.device).size > 1:
        raise AiaynError("several processes read an input file, not stdin: give the file")
    lines = _read_input(args.input)
    outputs = _translate_lines(args, lines, args.n_best)
    if outputs is None:  # not rank 0: rank 0 writes everything
        return 0
    if args.n_best == 1:
        text = "".join(candidates[0] + "\n" for candidates in outputs)
    else:  # still one line per input line: the n-best joined by " ||| "
        text = "".join(" ||| ".join(c) + "\n" if any(c) else "\n" for c in outputs)
    if args.output:
        _write_text(args.output, text)
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
    outputs = _translate_lines(args, src)
    if outputs is None:  # not rank 0
        return 0
    hyps = [h[0] for h in outputs]
    if args.output:
        _write_text(args.output, "".join(h + "\n" for h in hyps))
    bleu = corpus_bleu(hyps, ref)
    print(f"{bleu}  [{bleu.signature}]")
    chrf = sacrebleu.corpus_chrf(hyps, [ref])
    print(f"{chrf}  (sacrebleu)")
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    from aiayn.checkpoint import AVERAGED, average_checkpoints, epoch_checkpoints, save_checkpoint

    model_dir = Path(args.model)
    if args.last < 1:
        raise AiaynError(f"--last must be >= 1, got {args.last}")
    paths = epoch_checkpoints(model_dir)[-args.last :]
    if len(paths) < args.last:
        print(f"note: averaging the {len(paths)} epoch checkpoints found (asked {args.last})")
    out = Path(args.out) if args.out else model_dir / AVERAGED
    save_checkpoint(average_checkpoints(paths), out)
    print(f"averaged {', '.join(p.name for p in paths)} -> {out}")
    return 0


def cmd_attention(args: argparse.Namespace) -> int:
    from aiayn.inspect.attention import ATTENTION_KINDS, plot_all, plot_attention, text_heatmap

    translator = _translator(args)
    amap = translator.attention(args.sentence, beam=args.beam, alpha=args.alpha)
    pieces = [translator.tokenizer.piece_to_id(p) for p in amap.target[:-1]]
    print("translation: " + translator.tokenizer.decode(pieces))
    layer = -1 if args.layer is None else args.layer  # the last layer unless one is chosen
    print(text_heatmap(amap, layer=layer if args.kind in (None, "cross") else -1))
    if not args.out:
        return 0
    if args.out.lower().endswith(".png"):  # one picture: a head, or the grid of a layer
        kind = args.kind or "cross"
        print(f"wrote {plot_attention(amap, args.out, kind, layer, args.head)}")
    else:  # a folder: every layer (or the chosen one) of every kind (or the chosen one)
        kinds = [args.kind] if args.kind else list(ATTENTION_KINDS)
        written = plot_all(amap, args.out, kinds, args.layer, args.head)
        print(f"wrote {len(written)} PNGs to {args.out}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from aiayn.inspect.curves import plot_curves

    for path in plot_curves(args.run, args.out):
        print(f"wrote {path}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from aiayn.serve import ServeConfig, serve
    except ImportError as e:
        raise AiaynError(
            f"serving needs the serve extra: pip install 'aiayn[serve]' ({e})"
        ) from None
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise AiaynError(f"the environment variable {args.api_key_env} holds no API key")
    cfg = ServeConfig(
        max_batch_tokens=args.max_batch_tokens,
        batch_wait_ms=args.batch_wait_ms,
        max_queue=args.max_queue,
        max_sentences=args.max_sentences,
        api_key=api_key,
    )
    if args.threads is not None and args.threads < 1:
        raise AiaynError(f"threads must be >= 1, got {args.threads}")
    translator = _translator(args)  # loaded once, before the port opens
    serve(translator, cfg, args.host, args.port, args.threads)
    return 0


def cmd_export_ctranslate2(args: argparse.Namespace) -> int:
    from aiayn.export import ExportExistsError, export_ctranslate2

    try:
        out = export_ctranslate2(
            args.model, args.out, args.checkpoint, args.quantization, args.force
        )
    except ExportExistsError as e:
        raise AiaynError(f"{e}; give --force to replace it") from None
    print(f"exported {args.model} -> {out} (CTranslate2, {args.quantization})")
    return 0


def add_export_parser(sub) -> None:
    """`aiayn export FORMAT ...`: one sub-command per target runtime."""
    from aiayn.export import CT2_QUANTIZATIONS

    p = sub.add_parser("export", help="convert a trained model for another inference runtime")
    formats = p.add_subparsers(dest="format", required=True, metavar="FORMAT")
    p = formats.add_parser("ctranslate2", help="a CTranslate2 model folder (needs ctranslate2)")
    p.add_argument("--model", required=True, help="model directory from `aiayn train`")
    p.add_argument("--out", required=True, help="output folder (model.bin, vocabulary, spm.model)")
    p.add_argument("--checkpoint", default="auto", help="auto|averaged|best|last or a .pt file")
    p.add_argument(
        "--quantization", default="float32", choices=CT2_QUANTIZATIONS, help="weight type"
    )
    p.add_argument("--force", action="store_true", help="replace an earlier export in --out")
    p.set_defaults(func=cmd_export_ctranslate2)


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


def add_demo_and_summary_parsers(sub) -> None:
    p = sub.add_parser("demo", help="train on the built-in numbers-to-words task (~2 min, CPU)")
    p.add_argument("--steps", type=int, default=800, help="training updates (default 800)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--min-accuracy", type=float, default=0.0, help="exit 1 below this exact-match (0..1)"
    )
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("summary", help="print the layer table of a preset or trained model")
    p.add_argument("--preset", choices=["base", "big"], default="base")
    p.add_argument("--vocab", type=int, default=37000, help="joint vocabulary size")
    p.add_argument("--model", help="a trained model directory instead of a preset")
    p.add_argument("--checkpoint", default="auto", help="with --model: auto|averaged|best|last")
    p.add_argument("--depth", type=int, default=3, help="module nesting shown")
    p.set_defaults(func=cmd_summary)

    p = sub.add_parser("plot", help="draw loss, BLEU, learning rate and tokens/s of a run")
    p.add_argument("--run", required=True, help="model directory (its metrics.jsonl)")
    p.add_argument("--out", help="folder for the PNGs (default RUN/plots)")
    p.set_defaults(func=cmd_plot)


def add_prepare_parser(sub) -> None:
    p = sub.add_parser(
        "prepare", help="stream, check and encode parallel text once, for `train --data`"
    )
    for flag in ("train-src", "train-tgt", "valid-src", "valid-tgt"):
        p.add_argument(f"--{flag}", dest=flag.replace("-", "_"), required=True)
    p.add_argument("--out", required=True, help="new directory for the prepared data")
    p.add_argument("--vocab-size", type=int, default=8000, help="joint SentencePiece vocabulary")
    p.add_argument("--spm-model", help="use this SentencePiece model instead of training one")
    p.add_argument("--spm-model-type", default="bpe", choices=["bpe", "unigram"])
    p.add_argument(
        "--spm-sample", type=int, default=500_000, help="pairs the tokenizer is trained on"
    )
    p.add_argument(
        "--max-len-words", type=int, default=100, help="drop longer training pairs (0: keep)"
    )
    p.add_argument("--workers", type=int, default=1, help="encoding processes")
    p.add_argument("--seed", type=int, default=1, help="seed of the tokenizer's sample")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_prepare)


def add_training_parsers(sub) -> None:
    add_prepare_parser(sub)
    p = sub.add_parser("train", help="train a translation model on parallel text")
    p.add_argument("--config", help="YAML recipe, e.g. recipes/multi30k.yaml")
    p.add_argument("--out", required=True, help="model directory (checkpoints, logs)")
    p.add_argument("--data", help="a directory from `aiayn prepare` (instead of --train-src...)")
    p.add_argument("--train-src", dest="train_src")
    p.add_argument("--train-tgt", dest="train_tgt")
    p.add_argument("--valid-src", dest="valid_src")
    p.add_argument("--valid-tgt", dest="valid_tgt")
    p.add_argument(
        "--set", nargs="*", metavar="KEY=VALUE", help="recipe overrides, e.g. max_tokens=3000"
    )
    p.add_argument("--resume", action="store_true", help="continue from checkpoint_last.pt")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("average", help="average the last N epoch checkpoints (Section 6.1)")
    p.add_argument("--model", required=True, help="model directory")
    p.add_argument("--last", type=int, default=5)
    p.add_argument("--out", help="default: MODEL/checkpoint_averaged.pt")
    p.set_defaults(func=cmd_average)


def add_decoding_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model directory from `aiayn train`")
    p.add_argument("--checkpoint", default="auto", help="auto|averaged|best|last or a .pt file")
    p.add_argument("--beam", type=int, default=4, help="beam size; 1 = greedy (default 4)")
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty (default 0.6)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_decoding_parsers(sub) -> None:
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

    p = sub.add_parser("attention", help="attention heatmaps of one sentence's translation")
    add_decoding_flags(p)
    p.add_argument("sentence", help="source sentence")
    p.add_argument(
        "--kind", choices=["encoder", "decoder_self", "cross"], help="default: cross for a PNG"
    )
    p.add_argument("--layer", type=int, help="layer, from 1; -1 is the last (default)")
    p.add_argument("--head", type=int, default=0, help="one head, from 1 (default: all)")
    p.add_argument("--out", help="a .png file, or a folder for every kind and layer")
    p.set_defaults(func=cmd_attention)

    p = sub.add_parser("serve", help="an HTTP translation server with batching and a web page")
    p.add_argument("--model", required=True, help="model directory from `aiayn train`")
    p.add_argument("--checkpoint", default="auto", help="auto|averaged|best|last or a .pt file")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    add_inference_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch-tokens", type=int, default=4096, help="padded source tokens")
    p.add_argument("--batch-wait-ms", type=float, default=5.0, help="wait for more requests")
    p.add_argument("--max-queue", type=int, default=1024, help="sentences waiting; more: 429")
    p.add_argument("--max-sentences", type=int, default=64, help="per request")
    p.add_argument("--api-key-env", help="require the API key held in this variable")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.set_defaults(func=cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn", description="The original Transformer: train, translate, score, inspect."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_demo_and_summary_parsers(sub)
    add_training_parsers(sub)
    add_decoding_parsers(sub)
    add_export_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from aiayn.distributed import shutdown

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `aiayn translate ... | head`: the reader left, not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silences the flush at exit
        return 0
    except AiaynError as e:  # names the file or field; anything else is a bug: traceback
        print(f"aiayn {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    finally:
        shutdown()  # leaves a torchrun process group, if one was joined


if __name__ == "__main__":
    sys.exit(main())
