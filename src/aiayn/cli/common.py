"""What several subcommands share: reading input, writing output and decoding lines
(split across processes under torchrun); their common flags are :mod:`aiayn.cli.flags`'s."""

from __future__ import annotations

import argparse
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Generator, Iterable, Iterator, Sized
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

from aiayn.cli.flags import decode_options, note, process_world, translator_for
from aiayn.errors import AiaynError

if TYPE_CHECKING:  # imported where used, so that `aiayn --help` starts fast
    from aiayn.translator import Translation, Translator


def read_input(path: str | None, keep_bom: bool = False) -> list[str]:
    """The lines of file ``path``, or of stdin (None or ``-``), a starting byte order mark
    dropped unless ``keep_bom`` (:func:`~aiayn.data.corpus.iter_lines`); AiaynError naming
    stdin when it is closed (``<&-``: Python then has no sys.stdin) or cannot be read."""
    from aiayn.data.corpus import decode_bytes, read_lines

    if path is not None and path != "-":
        return read_lines(path, keep_bom)
    if sys.stdin is None:
        raise AiaynError("stdin: closed; give an input file or pipe the text in")
    chunks: list[bytes] = []
    try:  # bytes, so invalid UTF-8 is an error as in a file
        while chunk := sys.stdin.buffer.read(1 << 20):
            chunks.append(chunk)
            if b"\0" in chunk and not chunks[0].startswith(b"\x1f\x8b"):  # not gzip
                break  # text with a NUL byte is refused below: no need to read on (/dev/zero)
        data = b"".join(chunks)
    except OSError as e:  # a folder as stdin (`< /tmp`), a read error
        raise AiaynError(f"stdin: cannot read ({e.strerror or e})") from None
    return decode_bytes(data, "<stdin>", keep_bom)  # gzip recognised as in a file


def named(path: str | None) -> str:
    """How a message names input ``path``: stdin for None or ``-``."""
    return "stdin" if path is None or path == "-" else path


def refuse_two_stdins(inputs: dict[str, str | None], device: str) -> None:
    """AiaynError, before any work, when more than one of ``inputs`` (flag or name: path)
    is ``-`` (stdin, which holds one text), or when one is stdin or a pipe and several
    processes run (torchrun): each would read its own stdin, not the one given, or a share
    of the pipe's lines."""
    readers = [name for name, path in inputs.items() if path == "-"]
    if len(readers) > 1:
        each = "both" if len(readers) == 2 else "all"
        raise AiaynError(
            f"{' and '.join(readers)} {each} read stdin (-), which holds one text: give all "
            "but one as a file"
        )
    readers += [name for name, path in inputs.items() if path and path != "-" and _pipe(path)]
    if readers and process_world(device)[0].size > 1:
        raise AiaynError(
            f"{readers[0]}: several processes read each input, which must be a file, not "
            "stdin or a pipe: give the file"
        )


def _pipe(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:  # said when it is read
        return False


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
    if output and (_mode(output) is None or os.path.isfile(output)):  # not a pipe, a device
        _check_writable(output)
    _check_not_an_input(output, inputs)


def _check_not_an_input(output: str | None, inputs: dict[str, str | None]) -> None:
    """AiaynError when ``output`` is one of ``inputs`` (flag or name: path), by any link."""
    if not output or not os.path.isfile(output):
        return  # a new file, or a pipe or /dev/stdout: nothing read is overwritten
    for name, path in inputs.items():
        if path and path != "-" and os.path.isfile(path) and os.path.samefile(output, path):
            raise AiaynError(
                f"-o {output} is the same file as {name} {path}: writing it would destroy "
                "that input; give another output file"
            )


def _check_writable(output: str) -> None:
    """AiaynError unless :func:`output_stream` can make its temp file beside the file
    ``output`` writes (a link's target): a read-only folder, or a dangling link into a
    folder that does not exist, would show only after all the work."""
    from aiayn.data.folders import check_writable  # here: aiayn.data imports torch (slow)

    folder = os.path.dirname(os.path.realpath(output))
    if not os.path.isdir(folder):
        raise AiaynError(f"-o {output}: a link into {folder}, which does not exist")
    check_writable(folder, f"-o {output}")


# What makes up a model directory (docs/run-directory.md): checkpoints, the recipe, the
# metrics, and the tokenizer's files (spm.model; an imported model's *.spm and *.json).
MODEL_SUFFIXES = (".pt", ".spm", ".model", ".json")
MODEL_NAMES = ("recipe.yaml", "metrics.jsonl")


def check_output_spares_models(
    output: str | None, models: list[str], checkpoints: list[str] | None
) -> None:
    """AiaynError, before any work, when the ``output`` file is a checkpoint given by path
    or one of the files of a model directory (``models``), there already or not yet (a
    checkpoint_averaged.pt there is what the next run loads): writing it would destroy the
    model that decodes. Any other file in a model directory may be written."""
    from aiayn.checkpoint import CHECKPOINT_NAMES, resolve_checkpoint

    if not output:
        return
    if os.path.isfile(output):
        paths = [c for c in checkpoints or [] if c not in CHECKPOINT_NAMES and c != "auto"]
        for path in {str(resolve_checkpoint(m, c)) for m in models for c in paths}:
            _check_not_an_input(output, {"--checkpoint": path})
    real = os.path.realpath(output)  # a link is judged by the file it writes
    name, folder = os.path.basename(real), os.path.dirname(real)
    if not (name.endswith(MODEL_SUFFIXES) or name in MODEL_NAMES) or not os.path.isdir(folder):
        return
    for model in models:
        if os.path.isdir(model) and os.path.samefile(folder, model):
            raise AiaynError(
                f"-o {output} is a file of the model directory {model} (its checkpoints, "
                "recipe, metrics and tokenizer files): writing it would destroy the model; "
                "give another output file"
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
        f = cast("TextIO", named(lambda: open(path, "w", encoding="utf-8")))  # noqa: SIM115
        with f, _unflushed_on_error(f):
            yield lambda text: named(f.write, text)
            named(f.flush)
        return
    from aiayn.data.folders import new_file_mode  # here: aiayn.data imports torch (slow)

    target = Path(os.path.realpath(path))  # a link's target: the link stays
    prefix, folder = f".{target.name}.", target.parent
    fd, tmp = cast("tuple[int, str]", named(lambda: tempfile.mkstemp(".tmp", prefix, folder)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f, _unflushed_on_error(f):
            yield lambda text: named(f.write, text)
            named(f.flush)  # a full disk shows here, named, not in close()
        # The old file's permissions (stat above), else what the umask gives a new one.
        named(os.chmod, tmp, stat.S_IMODE(mode) if mode is not None else new_file_mode())
        named(os.replace, tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)  # gone already when renamed


@contextmanager
def _unflushed_on_error(f: TextIO) -> Iterator[None]:
    """After an error in the block, ``f``'s descriptor is closed without a flush: close()
    would write the bytes that failed again, and its OSError (a traceback) would replace
    the error that names the file."""
    try:
        yield
    except BaseException:
        raw = getattr(getattr(f, "buffer", None), "raw", None)  # a file object's descriptor
        if raw is not None:
            raw.close()  # f.close() is then a no-op
        raise


def _mode(path: str) -> int | None:
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout whole, or raise AiaynError naming stdout (a reader that
    left, BrokenPipeError, propagates as it is). Python's buffered stdout lost the rest of
    a short write on a full disk without an error (4,096 of 7,364 bytes, exit 0): where
    stdout has a descriptor, the UTF-8 bytes go to it directly, each short write resumed."""
    sys.stdout.flush()  # what print() left in the buffer goes first
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no descriptor: a capture, a StringIO
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    data = memoryview(text.encode("utf-8"))
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BrokenPipeError:
            raise
        except OSError as e:
            raise AiaynError(f"stdout: cannot write ({e.strerror or e})") from None


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


# Lines decoded (and written) at a time: the decoding's memory stays bounded for an input
# of any length (about 1.2 KB a line of outputs; the input itself is read whole first),
# output appears as it is made, and batches are sorted by length within each chunk, which
# pads about as little as sorting the whole input.
CHUNK_LINES = 10_000


def translate_chunks(
    args: argparse.Namespace,
    lines: Iterable[str],
    n_best: int = 1,
    prefixes: list[str] | None = None,
    alignment_layer: int | None = None,
    chunk_lines: int | None = None,
) -> Generator[tuple[int, list[list[Translation]] | None], None, None]:
    """``(start, outputs)`` for each chunk of ``chunk_lines`` (default :data:`CHUNK_LINES`)
    of ``lines`` (a list, or an iterator read a chunk at a time), from line ``start``:
    ``n_best`` :class:`~aiayn.translator.Translation` objects per line (one chunk, empty,
    for no lines). Under torchrun every process decodes its share of each chunk and rank
    0 gets them all, in input order (the other ranks get None); line indices stay those of
    the whole input, so samples depend neither on the number of processes nor on chunks."""
    from aiayn.progress import progress

    world, device = process_world(args.device)
    translator = translator_for(args, device)
    options = decode_options(args, translator.defaults, n_best)
    if prefixes is not None:
        check_prefixes(translator, prefixes, getattr(args, "prefix_file", None) or "prefixes")
    size = chunk_lines or CHUNK_LINES
    total = None  # this process's lines, when known
    if isinstance(lines, Sized):
        sizes = [min(size, len(lines) - a) for a in range(0, len(lines), size)]
        total = sum(len(world.shard(n)) for n in sizes)
    quiet = args.quiet or not world.is_main or total is None
    source, start, cut = iter(lines), 0, []
    with progress(total=total, desc="translate", unit="sent", disable=quiet) as bar:
        while True:
            chunk = list(islice(source, size))
            if start and not chunk:
                break
            if world.is_main:  # said once the bar is done (at once when there is none)
                cut += [start + i for i in cut_lines(translator, chunk)]
                if cut and quiet:
                    cut = note_cut(cut, translator.max_source_tokens)
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
            try:
                yield start, world.gather(outputs)
            except GeneratorExit:  # rank 0 stopped writing (`| head` left): so do the others
                if chunk and world.size > 1 and world.is_main:  # none past an empty input's
                    world.broadcast(False)
                raise
            # Whether rank 0 goes on: a rank that decoded on alone would wait for it forever.
            if not chunk or not world.broadcast(True):  # no chunk: an empty input's
                break
            start += len(chunk)
    note_cut(cut, translator.max_source_tokens)


def cut_lines(translator: Translator, lines: list[str]) -> list[int]:
    """The indices of ``lines`` of more source tokens than the model has positions: each
    is translated from its first ones only (:meth:`~aiayn.translator.Translator.encode`)."""
    ids = translator.tokenizer.encode_batch([line if line.strip() else "" for line in lines])
    return [i for i, row in enumerate(ids) if len(row) > translator.max_source_tokens]


def note_cut(lines: list[int], positions: int) -> list[int]:
    """Say which input ``lines`` (0-based) were cut to the model's ``positions``; returns
    an empty list, the lines still to tell of."""
    if lines:
        shown = ", ".join(str(i + 1) for i in lines[:5]) + (" ..." if lines[5:] else "")
        note(
            f"{len(lines)} input line(s) longer than the model's {positions} source positions "
            f"were translated from their first {positions} tokens only (line {shown})"
        )
    return []


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
