"""What several subcommands share: reading input, writing output, loading the translator
and decoding lines (split across processes under torchrun), and their common flags."""

from __future__ import annotations

import argparse
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sized
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

from aiayn.errors import AiaynError

if TYPE_CHECKING:  # imported where used, so that `aiayn --help` starts fast
    from aiayn.decode.options import DecodeOptions
    from aiayn.translator import Translation, Translator


def read_input(path: str | None, keep_bom: bool = False) -> list[str]:
    """The lines of file ``path``, or of stdin (None or ``-``), a starting byte order mark
    dropped unless ``keep_bom`` (:func:`~aiayn.data.corpus.iter_lines`); AiaynError naming
    stdin when it is closed (``<&-``: Python then has no sys.stdin) or cannot be read."""
    from aiayn.data.corpus import decode_lines, read_lines

    if path is not None and path != "-":
        return read_lines(path, keep_bom)
    if sys.stdin is None:
        raise AiaynError("stdin: closed; give an input file or pipe the text in")
    try:  # bytes, so invalid UTF-8 is an error as in a file
        data = sys.stdin.buffer.read()
    except OSError as e:  # a folder as stdin (`< /tmp`), a read error
        raise AiaynError(f"stdin: cannot read ({e.strerror or e})") from None
    return decode_lines(data, "<stdin>", keep_bom)


def named(path: str | None) -> str:
    """How a message names input ``path``: stdin for None or ``-``."""
    return "stdin" if path is None or path == "-" else path


def refuse_two_stdins(inputs: dict[str, str | None], device: str) -> None:
    """AiaynError, before any work, when more than one of ``inputs`` (flag or name: path)
    is ``-`` (stdin, which holds one text), or when one is and several processes run
    (torchrun): each would read its own stdin, not the one given."""
    from aiayn.distributed import init_from_env

    readers = [name for name, path in inputs.items() if path == "-"]
    if len(readers) > 1:
        each = "both" if len(readers) == 2 else "all"
        raise AiaynError(
            f"{' and '.join(readers)} {each} read stdin (-), which holds one text: give all "
            "but one as a file"
        )
    if readers and init_from_env(device).size > 1:
        raise AiaynError("several processes read an input file, not stdin: give the file")


def text_arg(value: str) -> str:
    """The argparse type of a text argument (a sentence, a prefix): its value, unless it
    holds bytes that are not UTF-8, which Python keeps as lone surrogates that no
    tokenizer can take; argparse then names the argument."""
    from aiayn.data.tokenizer import unencodable

    if (at := unencodable(value)) is not None:
        code = ord(value[at])
        what = f"byte {code - 0xDC00:#04x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise argparse.ArgumentTypeError(f"not UTF-8 text ({what} at character {at + 1})")
    return value


def check_output_file(output: str | None, inputs: dict[str, str | None]) -> None:
    """AiaynError, before any work, when the ``output`` file cannot be written where it
    is (a folder, or in a folder that does not exist: found only after the decoding
    otherwise) or is one of ``inputs`` (flag or name: path), the same file by any path or
    link: writing it would destroy the input it was made from."""
    if output and os.path.isdir(output):
        raise AiaynError(f"-o {output}: is a folder; give a file to write")
    folder = os.path.dirname(output or "")
    if folder and not os.path.isdir(folder):
        raise AiaynError(f"-o {output}: no folder {folder} to write it in")
    if not output or not os.path.isfile(output):
        return  # a new file, or a pipe or /dev/stdout: nothing read is overwritten
    for name, path in inputs.items():
        if path and path != "-" and os.path.isfile(path) and os.path.samefile(output, path):
            raise AiaynError(
                f"-o {output} is the same file as {name} {path}: writing it would destroy "
                "that input; give another output file"
            )


def write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all (:func:`output_stream`)."""
    with output_stream(path) as write:
        write(text)


@contextmanager
def output_stream(path: str | None) -> Iterator[Callable[[str], object]]:
    """A writer of UTF-8 text for the block, to ``path`` whole or not at all: a regular
    file (or a new one) is written as a temp file in its folder, renamed over it when the
    block ends without an error, so a failed run or write (a full disk) leaves the file as
    it was. Anything else (/dev/stdout, a pipe) is written in place: it cannot be renamed
    over, and holds nothing to lose. ``path`` None: stdout, flushed at each write.

    A write or rename that fails raises AiaynError naming ``path``."""
    if path is None:
        yield write_stdout
        return

    def named(call: Callable[..., object], *args: object) -> object:
        try:
            return call(*args)
        except OSError as e:
            raise AiaynError(f"{path}: cannot write ({e.strerror or e})") from None

    mode = cast("int | None", named(_mode, path))
    if mode is not None and not stat.S_ISREG(mode):
        with cast("TextIO", named(lambda: open(path, "w", encoding="utf-8"))) as f:
            yield lambda text: named(f.write, text)
            named(f.flush)
        return
    target = Path(os.path.realpath(path))  # a link's target: the link stays
    if mode is None:  # a new file: the permissions the umask gives
        from aiayn.data.folders import umask

        mode = 0o666 & ~umask()
    prefix, folder = f".{target.name}.", target.parent
    fd, tmp = cast("tuple[int, str]", named(lambda: tempfile.mkstemp(".tmp", prefix, folder)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield lambda text: named(f.write, text)
            named(f.flush)  # a full disk shows here, named, not in close()
        named(os.chmod, tmp, stat.S_IMODE(mode))
        named(os.replace, tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)  # gone already when renamed


def _mode(path: str) -> int | None:
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout and flush it (under :func:`stdout_named`, as every
    command runs, a failure is an AiaynError naming stdout)."""
    sys.stdout.write(text)
    sys.stdout.flush()


class _NamedStdout:
    """sys.stdout whose failed writes and flushes (a full disk) are an AiaynError naming
    stdout; a reader that left (BrokenPipeError, ``| head``) propagates as it is."""

    def __init__(self, stream: TextIO):
        self.stream, self.failed = stream, False

    def write(self, text: str) -> int:
        return self._named(self.stream.write, text)

    def flush(self) -> None:
        self._named(self.stream.flush)

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, isatty, ...
        return getattr(self.stream, name)

    def _named(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            self.failed = True
            raise AiaynError(f"stdout: cannot write ({e.strerror or e})") from None


@contextmanager
def stdout_named() -> Iterator[None]:
    """For the block, a write to stdout that fails, wherever a command prints, is an
    AiaynError naming stdout, and what was printed is flushed at its end: the failure
    shows now, as one line, not as a traceback or an "Exception ignored" at exit."""
    named = _NamedStdout(sys.stdout)
    sys.stdout = named
    try:
        yield
        named.flush()
    finally:
        if sys.stdout is named:  # not replaced meanwhile (a broken pipe silenced it)
            # After a failure its buffer cannot be written either: silence the exit flush.
            sys.stdout = open(os.devnull, "w") if named.failed else named.stream  # noqa: SIM115


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
    "forced_eos", "cut_at_limit", "sampling", "temperature", "top_k", "top_p", "seed",
    "prefix",
)  # fmt: skip


def decode_options(
    args: argparse.Namespace, defaults: DecodeOptions, n_best: int = 1
) -> DecodeOptions:
    """``defaults`` (a :class:`~aiayn.decode.DecodeOptions`) with the decoding flags that
    were given; checked there. Sampling without a beam flag samples (beam 1); a seed
    without sampling (given, or the model's default) would be ignored, and is refused."""
    given = {name: getattr(args, name, None) for name in OPTION_FLAGS}
    if given["sampling"] and given["beam"] is None:
        given["beam"] = 1
    # The two rules for the length limit exclude each other: the one given replaces the
    # model's default (an imported model's folder may set either).
    for flag, other in (("forced_eos", "cut_at_limit"), ("cut_at_limit", "forced_eos")):
        if given[flag] and given[other] is None:
            given[other] = False
    options = defaults.given(n_best=n_best, **given)
    if given["seed"] is not None and not options.sampling:  # as the server's 422
        raise AiaynError("--seed seeds sampling, which is off: give --sampling too")
    return options


# Lines decoded (and written) at a time: memory stays bounded for an input of any length
# (about 1.2 KB a line of outputs), output appears as it is made, and batches are sorted
# by length within each chunk, which pads about as little as sorting the whole input.
CHUNK_LINES = 10_000


def translate_chunks(
    args: argparse.Namespace,
    lines: Iterable[str],
    n_best: int = 1,
    prefixes: list[str] | None = None,
    alignment_layer: int | None = None,
    chunk_lines: int | None = None,
) -> Iterator[tuple[int, list[list[Translation]] | None]]:
    """``(start, outputs)`` for each chunk of ``chunk_lines`` (default :data:`CHUNK_LINES`)
    of ``lines`` (a list, or an iterator read a chunk at a time), from line ``start``:
    ``n_best`` :class:`~aiayn.translator.Translation` objects per line (one chunk, empty,
    for no lines). Under torchrun every process decodes its share of each chunk and rank
    0 gets them all, in input order (the other ranks get None); line indices stay those of
    the whole input, so samples depend neither on the number of processes nor on chunks."""
    from aiayn.distributed import init_from_env
    from aiayn.progress import progress

    world = init_from_env(args.device)
    translator = translator_for(args, world.device(args.device))
    options = decode_options(args, translator.defaults, n_best)
    if prefixes is not None:
        check_prefixes(translator, prefixes, getattr(args, "prefix_file", None) or "prefixes")
    size = chunk_lines or CHUNK_LINES
    total = None  # this process's lines, when known
    if isinstance(lines, Sized):
        sizes = [min(size, len(lines) - a) for a in range(0, len(lines), size)]
        total = sum(len(world.shard(n)) for n in sizes)
    quiet = args.quiet or not world.is_main or total is None
    source, start = iter(lines), 0
    with progress(total=total, desc="translate", unit="sent", disable=quiet) as bar:
        while True:
            chunk = list(islice(source, size))
            if start and not chunk:
                return
            share = world.shard(len(chunk))
            first, last = start + share.start, start + share.stop
            outputs = translator.translations(
                chunk[share.start : share.stop],
                options,
                prefixes=prefixes[first:last] if prefixes is not None else None,
                first_line=first,
                batch_size=args.batch_size,
                on_batch=bar.update,
                scores=getattr(args, "format", "text") == "jsonl",  # text prints none
            )
            if alignment_layer is not None:
                from aiayn.inspect.maps import add_alignments

                sources = [translator.encode(line) for line in chunk[share.start : share.stop]]
                add_alignments(translator, sources, outputs, alignment_layer, args.batch_size)
            yield start, world.gather(outputs)
            if not chunk:  # the one chunk of an empty input
                return
            start += len(chunk)


def typed_lines() -> Iterator[str]:
    """The lines typed on a terminal (stdin), each as soon as Enter is pressed, decoded as
    :func:`read_input` decodes stdin; the first prompt goes to stderr."""
    from aiayn.data.corpus import BOM, decode_line

    print("Type a sentence and press Enter (Ctrl-D to end).", file=sys.stderr)
    for number, raw in enumerate(iter(sys.stdin.buffer.readline, b""), start=1):
        line = raw.removesuffix(b"\n")
        yield decode_line(line.removeprefix(BOM) if number == 1 else line, "<stdin>", number)


def check_prefixes(translator: Translator, prefixes: list[str], name: str) -> None:
    """AiaynError naming ``name`` (the prefix file) and the line of the first prefix the
    model cannot force (too long for its positions, or with a character its vocabulary
    lacks), before any line is decoded; the decoder's own check would name neither."""
    from aiayn.decode.core import forced_ids
    from aiayn.translator import prefix_ids

    for number, text in enumerate(prefixes, start=1):
        if text:
            try:
                forced_ids([prefix_ids(translator.tokenizer, text)], translator.model.cfg, 1)
            except AiaynError as e:
                raise AiaynError(f"{name}, line {number}: {e}") from None


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
    g.add_argument(
        "--cut-at-limit",
        action="store_true",
        default=None,
        help="beam search ends an output that reaches its length limit there, without EOS, "
        "as greedy does (generate() without forced_eos_token_id, CTranslate2; default: EOS "
        "takes the last slot)",
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
