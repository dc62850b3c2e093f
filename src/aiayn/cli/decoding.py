"""`aiayn translate` and `evaluate`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from contextlib import ExitStack, closing
from typing import TYPE_CHECKING

from aiayn.cli.common import (
    check_output_file,
    check_output_spares_models,
    named,
    output_stream,
    read_input,
    refuse_two_stdins,
    translate_chunks,
    typed_lines,
    write_stdout,
)
from aiayn.cli.flags import (
    add_decoding_flags,
    add_inference_flags,
    add_search_flags,
    note,
    text_arg,
)
from aiayn.data.corpus import cr_note
from aiayn.errors import AiaynError
from aiayn.metrics.bleu import TOKENIZERS

if TYPE_CHECKING:
    from aiayn.translator import Translation


def cmd_translate(args: argparse.Namespace) -> int:
    check_output_flags(args)
    inputs = {
        "the input": args.input or "-",
        "--prefix-file": args.prefix_file,
        "--closest-to": args.closest_to,
    }
    refuse_two_stdins(inputs, args.device)
    check_output_file(args.output, inputs)
    check_output_spares_models(args.output, args.model, args.checkpoint)
    lines: Iterable[str]
    if typing_at_a_terminal(args):  # each line translated as it is typed
        lines, prefixes, references, chunk = typed_lines(), None, None, 1
    else:
        lines, chunk = read_input(args.input), None
        if cr := sum("\r" in line for line in lines):
            note(cr_note(cr, f"{named(args.input)}: "))
        prefixes = read_prefixes(args, len(lines))
        references = read_closest_to(args, len(lines))
    n_best = 1 if references is not None else args.n_best
    chunks = translate_chunks(args, lines, args.n_best, prefixes, alignment_layer(args), chunk)
    with ExitStack() as stack:
        stack.enter_context(closing(chunks))  # stopped (a reader gone): the ranks stop too
        write = None  # opened by rank 0 alone, at its first chunk: rank 0 writes everything
        for a, outputs in chunks:
            if outputs is None:  # not rank 0
                continue
            if references is not None:
                outputs = [closest(c, ref) for c, ref in zip(outputs, references[a:])]
            write = write or stack.enter_context(output_stream(args.output))
            write(render(outputs, n_best, args))
    return 0


def typing_at_a_terminal(args: argparse.Namespace) -> bool:
    """Whether translate reads stdin from a terminal (a person typing): then each line is
    translated as it is entered, not once the input ends. Not with a file of prefixes or
    references, whose lines must match the input's count."""
    if args.input not in (None, "-") or args.prefix_file or args.closest_to:
        return False
    try:
        return bool(sys.stdin.isatty())
    except (AttributeError, OSError, ValueError):  # closed, or no terminal to ask
        return False


def render(outputs: list[list[Translation]], n_best: int, args: argparse.Namespace) -> str:
    """One line of text, or one JSON object (``--format jsonl``), per input line."""
    if args.format == "jsonl":
        records = (line_record(c, n_best) for c in outputs)
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return "".join(text_line(c, n_best, args.alignment) + "\n" for c in outputs)


def read_closest_to(args: argparse.Namespace, n_lines: int) -> list[str] | None:
    """``--closest-to``: one reference per input line, checked before any decoding."""
    path = args.closest_to
    if path is None:
        return None
    if args.n_best < 2:
        raise AiaynError("choosing the output closest to a reference needs n-best 2 or more")
    references = read_input(path)
    if len(references) != n_lines:
        raise AiaynError(
            f"{named(path)}: {len(references)} reference line(s) for {n_lines} input line(s)"
        )
    return references


def closest(candidates: list[Translation], reference: str) -> list[Translation]:
    """The candidate with the highest sentence BLEU against ``reference`` (the earlier, so
    the better scored, on ties), as a one-element list; Kim & Rush (2016)'s
    "Seq-Inter" distillation targets. No candidates: none."""
    from aiayn.metrics import sentence_bleu

    if not candidates:
        return []
    bleu = [sentence_bleu(t.text, reference).score for t in candidates]
    return [candidates[max(range(len(candidates)), key=lambda i: (bleu[i], -i))]]


def read_prefixes(args: argparse.Namespace, n_lines: int) -> list[str] | None:
    """``--prefix-file``: one prefix per input line (an empty line: none for that line)."""
    path = getattr(args, "prefix_file", None)
    if path is None:
        return None
    if getattr(args, "prefix", None):
        raise AiaynError("give one prefix for every line or a file of prefixes, not both")
    prefixes = read_input(path)
    if not prefixes and n_lines:
        raise AiaynError(f"{named(path)}: the prefix file is empty; give one line per input line")
    if len(prefixes) != n_lines:
        raise AiaynError(
            f"{named(path)}: {len(prefixes)} prefix line(s) for {n_lines} input line(s); give one "
            "line per input line (an empty line forces nothing)"
        )
    return prefixes


def alignment_layer(args: argparse.Namespace) -> int | None:
    """The decoder layer to align with (``--alignment``), or None: no alignments."""
    from aiayn.decode.alignment import DEFAULT_LAYER

    if not getattr(args, "alignment", False):
        return None
    return DEFAULT_LAYER if args.alignment_layer is None else args.alignment_layer


def check_output_flags(args: argparse.Namespace, shapes_output_file: bool = False) -> None:
    """Refuse, before any work, an output flag that would take no effect: --alignment-layer
    without --alignment, and with ``shapes_output_file`` (evaluate, whose stdout holds the
    scores) --format or --alignment without the -o file they shape; and a --batch-size
    below 1."""
    if args.batch_size < 1:
        raise AiaynError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.alignment_layer is not None and not args.alignment:
        raise AiaynError("--alignment-layer picks the layer of --alignment: give --alignment too")
    if shapes_output_file and not args.output:
        given = [f for f, on in (("--format", args.format), ("--alignment", args.alignment)) if on]
        if given:
            verb = "shape" if len(given) > 1 else "shapes"
            raise AiaynError(
                f"{' and '.join(given)} {verb} the translations written to -o/--output, and "
                "none is given (stdout holds the scores): give -o FILE"
            )


def candidate_record(t: Translation, with_alignment: bool) -> dict[str, object]:
    record = {"text": t.text, "tokens": t.pieces, "score": t.score, "logprob": t.log_prob}
    if with_alignment:
        record["alignment"] = [list(p) for p in t.alignment or []]
    return record


def line_record(candidates: list[Translation], n_best: int) -> dict[str, object]:
    """One input line's JSON object: the best output's fields, and with ``n_best`` > 1 the
    list of every output (best first; samples in the order drawn). An empty input line
    gets an empty text and no scores (null)."""
    with_alignment = any(t.alignment is not None for t in candidates)
    if candidates:
        record = candidate_record(candidates[0], with_alignment)
    else:
        record = {"text": "", "tokens": [], "score": None, "logprob": None}
    if n_best > 1:
        record["n_best"] = [candidate_record(t, with_alignment) for t in candidates]
    return record


def text_line(candidates: list[Translation], n_best: int, with_alignment: bool) -> str:
    """Plain text: the output, or the n-best joined by " ||| ", always ``n_best`` of them
    (padded with empty outputs where a search finished fewer, so the fields stay
    positional, as :func:`~aiayn.translator.n_best_texts`); with alignments each output is
    followed by a tab and its Pharaoh pairs. A blank input line stays an empty line."""
    from aiayn.decode.alignment import pharaoh

    def one(t: Translation) -> str:
        return f"{t.text}\t{pharaoh(t.alignment or [])}" if with_alignment else t.text

    if not candidates:
        return ""
    if n_best == 1:
        return one(candidates[0])
    empty = "\t" if with_alignment else ""  # what an empty output with no pairs prints
    return " ||| ".join([one(t) for t in candidates] + [empty] * (n_best - len(candidates)))


def cmd_evaluate(args: argparse.Namespace) -> int:
    from aiayn.metrics.bleu import unsegmented_share

    check_output_flags(args, shapes_output_file=True)
    ref_flags = [f"--ref #{i}" if i > 1 else "--ref" for i in range(1, len(args.ref) + 1)]
    inputs = {
        "--src": args.src,
        **dict(zip(ref_flags, args.ref)),
        "--prefix-file": args.prefix_file,
    }
    refuse_two_stdins(inputs, args.device)
    check_output_file(args.output, inputs)
    check_output_spares_models(args.output, args.model, args.checkpoint)
    # The references as sacreBLEU reads them (a BOM kept), so the scores equal its own.
    src, refs = read_input(args.src), [read_input(r, keep_bom=True) for r in args.ref]
    src_name = named(args.src)
    for path, ref in zip(args.ref, refs):
        if len(src) != len(ref):
            cr = sum("\r" in line for text in (src, ref) for line in text)
            raise AiaynError(
                f"{src_name} has {len(src)} line(s) but {named(path)} has {len(ref)}{cr_note(cr)}"
            )
    if not src:
        raise AiaynError(f"{src_name} and {named(args.ref[0])}: no lines to score")
    for path, ref in zip(args.ref, refs):
        if ref[0].startswith("\ufeff"):
            note(
                f"{named(path)} starts with a byte order mark, kept as sacreBLEU keeps it: "
                "its first word matches no output (remove it to score that word)"
            )
    prefixes = read_prefixes(args, len(src))
    if args.tokenize == "13a" and unsegmented_share(refs[0]) > 0.5:
        note(
            "the references are mostly Chinese, Japanese or Korean characters, which 13a does "
            "not split into words; --tokenize zh or char scores them as sacreBLEU's -tok zh "
            "or char"
        )
    with ExitStack() as stack:
        hyps: list[str] | None = None  # rank 0 alone gets the outputs
        write = None
        chunks = stack.enter_context(
            closing(translate_chunks(args, src, 1, prefixes, alignment_layer(args)))
        )
        for _, outputs in chunks:
            if outputs is None:
                continue
            if hyps is None:  # the -o file (its old text stays until the scores are made)
                hyps = []
                write = stack.enter_context(output_stream(args.output)) if args.output else None
            hyps += [c[0].text if c else "" for c in outputs]
            if write is not None:
                write(render(outputs, 1, args))
        if hyps is None:  # not rank 0
            return 0
        scores = score_lines(args, hyps, refs)
    write_stdout(scores)
    return 0


def score_lines(args: argparse.Namespace, hyps: list[str], refs: list[list[str]]) -> str:
    """The BLEU and chrF lines that `evaluate` prints, of ``hyps`` against ``refs`` (one
    stream per reference file, as sacreBLEU takes them)."""
    import sacrebleu

    from aiayn.metrics import corpus_bleu

    bleu = corpus_bleu(hyps, refs, lowercase=args.lowercase, tokenize=args.tokenize)
    metric = sacrebleu.metrics.CHRF(lowercase=args.lowercase)
    chrf = metric.corpus_score(hyps, refs)  # its signature says case:lc where lowercased
    return f"{bleu}  [{bleu.signature}]\n{chrf}  [{metric.get_signature()}]\n"


def add_output_flags(p: argparse.ArgumentParser) -> None:
    from aiayn.decode.alignment import DEFAULT_LAYER

    p.add_argument(
        "--format",
        choices=["text", "jsonl"],
        help="text (default) or one JSON object per line: text, tokens, score, logprob",
    )
    p.add_argument(
        "--alignment",
        action="store_true",
        help="word alignments (Pharaoh i-j) from encoder-decoder attention",
    )
    p.add_argument(
        "--alignment-layer",
        type=int,
        help=f"decoder layer for --alignment, from 1; negative: from the last "
        f"(default {DEFAULT_LAYER})",
    )
    p.add_argument("--prefix", type=text_arg, help="text every output starts with (forced)")
    p.add_argument("--prefix-file", help="one forced prefix per input line")
    p.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="sentences decoded together (sorted by length; default 64; with --sampling, "
        "samples, in whole lines): more is faster on a GPU, fewer holds less memory",
    )


def stdout_or_file(value: str) -> str | None:
    """translate's -o: "-" is stdout, as "-" is stdin for every input."""
    return None if value == "-" else value


def file_not_stdout(value: str) -> str:
    """evaluate's -o: stdout carries the score, so "-" (stdout) is refused, not a file "-"."""
    if value == "-":
        raise argparse.ArgumentTypeError("- (stdout) holds the score; give a file")
    return value


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("translate", help="translate a file or stdin, one line per line")
    add_decoding_flags(p, ensemble=True)
    add_search_flags(p)
    add_inference_flags(p)
    add_output_flags(p)
    p.add_argument("input", nargs="?", help="input file; default stdin (either plain or gzip)")
    p.add_argument("-o", "--output", type=stdout_or_file, help="output file; default (or -) stdout")
    p.add_argument(
        "--n-best",
        type=int,
        default=1,
        help="outputs per line (' ||| '-joined; samples: at most 1024)",
    )
    p.add_argument(
        "--closest-to",
        metavar="REF",
        help="of the n-best, output only the one closest to REF's line (sentence BLEU): "
        "sequence-level distillation targets (Kim & Rush 2016, Seq-Inter)",
    )
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("evaluate", help="translate --src and print BLEU against --ref")
    add_decoding_flags(p, ensemble=True)
    add_search_flags(p)
    add_inference_flags(p)
    add_output_flags(p)
    p.add_argument(
        "--src", required=True, help="source file, or - for stdin (either plain or gzip)"
    )
    p.add_argument(
        "--ref",
        required=True,
        nargs="+",
        action="extend",  # --ref A B and --ref A --ref B alike
        help="reference file, or several for multi-reference BLEU and chrF (as sacreBLEU "
        "takes them); - for stdin (one input at most)",
    )
    p.add_argument(
        "--tokenize",
        choices=list(TOKENIZERS),
        default="13a",
        help="BLEU's tokenization, as sacreBLEU's -tok: 13a (default, WMT's), intl, zh "
        "(Chinese), char (Japanese, Korean), none",
    )
    p.add_argument(
        "--lowercase",
        action="store_true",
        help="case-insensitive BLEU and chrF, as sacreBLEU's -lc and --chrf-lowercase (for "
        "lowercased references)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=file_not_stdout,
        help="also write the translations to this file (as --format, --alignment)",
    )
    p.set_defaults(func=cmd_evaluate)
