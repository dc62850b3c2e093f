"""The `aiayn` command line: each subcommand is a thin layer over the library.

Errors the user can fix (bad files, bad recipes, bad checkpoints: every
:class:`~aiayn.errors.AiaynError`, and an OSError about a path itself: a name too long, a
loop of links, no permission) print one line naming the file or field and exit with
status 2. Any other exception is a bug and keeps its traceback.

This module imports nothing heavy: the subcommands (and torch, about a second) are imported
inside :func:`main`, so that a Ctrl-C while they load says "interrupted" as it does later,
not a traceback from deep inside torch's import.
"""

from __future__ import annotations

import argparse
import errno
import io
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from aiayn.cli.common import stdout_named  # light, as aiayn.errors: no torch
from aiayn.errors import AiaynError

EXIT_USER_ERROR = 2
# The commands a SIGTERM or SIGHUP unwinds as Ctrl-C does, so that their half-written
# outputs (temp files, staging folders) are removed on the way out. `train` and `serve`
# keep the default: a killed run is resumed (its leftovers swept then), and the server
# drains its requests on SIGTERM itself.
UNWOUND_ON_TERM = {"translate", "evaluate", "prepare", "average", "data", "export", "import"}
# The commands that share their work among torchrun's processes; under torchrun the others
# would each do all of it, into the same files.
DISTRIBUTED = {"train", "translate", "evaluate"}


class Terminated(BaseException):
    """A SIGTERM or SIGHUP (its number the argument), raised where the command was."""


@contextmanager
def unwound_on_term(wanted: bool) -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise :class:`Terminated` (when ``wanted``,
    and in the main thread: elsewhere signals cannot be caught); the handlers before are
    put back after it."""

    owner = os.getpid()

    def stop(signum: int, frame: object) -> None:
        if os.getpid() != owner:  # a forked worker (prepare's pool): die as it would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated(signum)

    before = {}
    names = ("SIGTERM", "SIGHUP") if wanted else ()
    try:
        for number in (getattr(signal, n) for n in names if hasattr(signal, n)):
            if signal.getsignal(number) is signal.SIG_DFL:  # not one `nohup` ignores
                before[number] = signal.signal(number, stop)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def package_version() -> str:
    """The installed package's version (pyproject.toml reads it from aiayn.__version__)."""
    from importlib.metadata import PackageNotFoundError, version  # ~30 ms: when asked

    try:
        return version("aiayn")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    from aiayn.cli import converting, datasets, decoding, inspecting, serving, training

    parser = argparse.ArgumentParser(
        prog="aiayn", description="The original Transformer: train, translate, score, inspect."
    )
    parser.add_argument("--version", action="version", version=f"aiayn {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (training, datasets, decoding, inspecting, serving, converting):
        group.add_parsers(sub)
    _once_each(parser)
    return parser


def _once_each(parser: argparse.ArgumentParser) -> None:
    """Every flag of one value, in every command, refuses a second (:class:`~aiayn.cli.
    flags.Once`): argparse takes the last, so ``translate -o a -o b`` wrote b alone."""
    from aiayn.cli.flags import Once, OnceBool

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                _once_each(command)
        # A flag storing one value (a positional is one by its place; nargs "+" is a list).
        elif (
            type(action) is argparse._StoreAction
            and action.option_strings
            and (action.nargs in (None, "?"))
        ):
            action.__class__ = Once  # type: ignore[assignment]
        elif type(action) is argparse.BooleanOptionalAction:
            action.__class__ = OnceBool


def main(argv: list[str] | None = None) -> int:
    closed_streams()
    try:
        return run(argv)
    except KeyboardInterrupt:  # also while the imports load, before any command ran
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated as e:
        print("terminated", file=sys.stderr)
        return 128 + e.args[0]


class _ClosedStdout:
    """sys.stdout that the shell closed (``>&-``): writing to it is one error naming it."""

    def write(self, text: str) -> int:
        raise AiaynError("stdout: closed, so there is nowhere to write the output")

    def flush(self) -> None:
        pass


def closed_streams() -> None:
    """A stream the shell closed is None in Python. Then print(file=sys.stderr) falls back
    to stdout, mixing notes and errors into the output, and a write to stdout is an
    AttributeError: notes and errors go nowhere, and output to stdout is an error.

    A path of bytes that are not UTF-8 (Python keeps them as lone surrogates) printed on a
    stdout that is strict about them (a UTF-8 desktop locale) raised after the work was
    done ("averaged ... -> PATH"): stdout escapes them, as stderr does."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the whole process
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
    elif isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.errors == "strict":
        sys.stdout.reconfigure(errors="backslashreplace")


def run(argv: list[str] | None) -> int:
    """:func:`main` but for Ctrl-C and the signals, which it turns into one line."""
    from aiayn.distributed import shutdown  # imports torch

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _refuse_empty_paths(parser, args)
        processes = os.environ.get("WORLD_SIZE", "1")
        if args.command not in DISTRIBUTED and processes.isdigit() and int(processes) > 1:
            raise AiaynError(
                f"runs in one process, and torchrun started {processes}: run it without "
                f"torchrun (only {', '.join(sorted(DISTRIBUTED))} share their work)"
            )
        with stdout_named(), unwound_on_term(args.command in UNWOUND_ON_TERM):
            code = args.func(args)
        shutdown(synchronize=True)  # every rank is done: leave together
        return code
    except BrokenPipeError:  # `aiayn translate ... | head`: the reader left, not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silences the flush at exit
        # translate's and evaluate's other ranks stopped too (translate_chunks): leave together
        shutdown(synchronize=args.command in ("translate", "evaluate"))
        return 0
    except AiaynError as e:  # names the file or field; anything else is a bug: traceback
        print(f"aiayn {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as e:  # Path.is_dir() and the like raise these on Python 3.11
        if e.filename is None or e.errno not in PATH_ERRORS:
            raise
        print(f"aiayn {args.command}: error: {e.filename}: {e.strerror}", file=sys.stderr)
        return EXIT_USER_ERROR
    finally:
        shutdown()  # leaves a torchrun process group, if one was joined


# What is wrong with a path given, not with aiayn: where a check of the path raises one of
# these (a name over 255 bytes, a loop of links), the user's path is named in one line.
PATH_ERRORS = {errno.ENAMETOOLONG, errno.ELOOP, errno.EACCES, errno.EPERM, errno.ENOTDIR}


# The flags that name a file, folder or URL: given as "" (a script's unset variable:
# `--model "$MODEL"`), some would read as not given and quietly do something else.
PATH_FLAGS = {
    "model", "checkpoint", "out", "output", "data", "run", "src", "ref", "mirror",
    "spm_model", "init_from", "config", "prefix_file", "closest_to", "input", "folder",
    "train_src", "train_tgt", "valid_src", "valid_tgt",
}  # fmt: skip


def _refuse_empty_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """AiaynError for a path flag or argument of the command run (``aiayn data get`` too)
    given as ""."""
    actions, found = list(parser._actions), []
    while actions:  # the chosen subcommand's actions, and those of its chosen subcommand
        action = actions.pop()
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            actions += chosen._actions if chosen is not None else []
        elif action.dest in PATH_FLAGS:
            found.append(action)
    for action in found:
        value = getattr(args, action.dest, None)
        if "" in (value if isinstance(value, list) else [value]):
            flag = max(action.option_strings, key=len, default=action.dest)  # or positional
            raise AiaynError(f"{flag}: the path is empty (an unset variable in a script?)")
