"""The flags the decoding subcommands share (the model or an ensemble, inference settings,
every field of DecodeOptions), and what they make: the Translator and the options."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiayn.errors import AiaynError

if TYPE_CHECKING:  # imported where used, so that `aiayn --help` starts fast
    from aiayn.decode.options import DecodeOptions
    from aiayn.distributed import World
    from aiayn.translator import Translator


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


class Once(argparse.Action):
    """A flag that takes one value and refuses a second: argparse lets the last win, so
    ``--model A --model B`` to a command of one model (as translate's ensemble) would
    silently use B alone, and ``train --out A --out B`` train into B. ``build_parser``
    gives it to every flag of one value, of every command."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:  # fmt: skip
        _first_time(self, namespace, "given twice: this command takes one")
        setattr(namespace, self.dest, values)


def _first_time(action: argparse.Action, namespace: argparse.Namespace, twice: str) -> None:
    """Record that ``action``'s flag was given; ArgumentError saying ``twice`` if it was."""
    given = f"_given_{action.dest}"
    if getattr(namespace, given, False):
        raise argparse.ArgumentError(action, twice)
    setattr(namespace, given, True)


class OnceBool(argparse.BooleanOptionalAction):
    """``--flag`` / ``--no-flag``, refusing a second of either: ``--sampling --no-sampling``
    let the last win without a word."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:  # fmt: skip
        _first_time(self, namespace, "given twice (or with its --no- form): give one")
        super().__call__(parser, namespace, values, option_string)


def note(text: str) -> None:
    """``note: text`` on stderr, once per job: under torchrun, rank 0 alone says it."""
    if os.environ.get("RANK", "0") == "0":
        print(f"note: {text}", file=sys.stderr)


def note_stale_averages(models: str | list[str], checkpoints: str | list[str] | None) -> None:
    """Say on stderr where ``--checkpoint auto`` passes over an averaged checkpoint made
    before training went on (:func:`aiayn.checkpoint.stale_average`)."""
    from aiayn.checkpoint import AVERAGED, LAST, stale_average

    names = [checkpoints] if isinstance(checkpoints, str) else checkpoints or ["auto"]
    if any(name != "auto" for name in names):
        return
    for model_dir in [models] if isinstance(models, str) else models:
        if steps := stale_average(model_dir):
            note(
                f"{model_dir}/{AVERAGED} was made at step {steps[0]}, before its {LAST} "
                f"(step {steps[1]}): training went on after it was averaged, so --checkpoint "
                "auto takes the best or last checkpoint; run `aiayn average` again for a new one"
            )
        elif newer := _newer_than_older_average(Path(model_dir)):
            note(
                f"{model_dir}/{AVERAGED} was made by an older aiayn, which did not record how "
                f"far training had gone, and {newer} is newer than every checkpoint it "
                "averages: if training went on after it was averaged, run `aiayn average` "
                "again (--checkpoint auto still takes it; --checkpoint best does not)"
            )


def _newer_than_older_average(model_dir: Path) -> str | None:
    """The newest epoch or timed checkpoint, if it is newer than every checkpoint an older
    aiayn's average (no ``run_step``) took: ``average`` takes the newest ones, so one saved
    after them means training went on (a later ``checkpoint_last.pt`` alone does not: a
    killed run saves it after its newest epoch checkpoint)."""
    from aiayn.checkpoint import AVERAGED, epoch_checkpoints, saved_step

    average = model_dir / AVERAGED
    if not average.is_file() or saved_step(average, "run_step") is not None:
        return None
    try:
        made_of, kept = saved_step(average), epoch_checkpoints(model_dir)[-1:]
    except AiaynError:  # a broken link: a note is no place to refuse it
        return None
    newest = saved_step(kept[0]) if kept else None
    if made_of is None or newest is None or newest <= made_of:
        return None
    return kept[0].name


def translator_for(args: argparse.Namespace, device: str | None = None) -> Translator:
    """The Translator of ``--model`` (several: an ensemble) and ``--checkpoint``."""
    from aiayn.translator import Translator

    note_stale_averages(args.model, args.checkpoint)
    translator = Translator.from_dir(
        args.model,
        checkpoint=args.checkpoint if args.checkpoint else "auto",
        device=device or args.device,
        quantize=getattr(args, "quantize", False),
        precision=getattr(args, "precision", "fp32"),
    )
    note_unchecked_generation(translator)
    return translator


def process_world(device: str) -> tuple[World, str]:
    """The process group that torchrun's environment describes (joined; a world of one
    without torchrun) and this process's own device. ``auto`` is resolved first: left as
    it is, the group would talk gloo and every process would take the first GPU. (Other
    names are checked where the model is loaded, after the settings they must fit.)"""
    from aiayn.distributed import init_from_env
    from aiayn.model.device import resolve_device

    name = str(resolve_device(device)) if device == "auto" else device
    world = init_from_env(name)
    return world, world.device(name)


def note_unchecked_generation(translator: Translator) -> None:
    """Say on stderr where a model's generation settings are ones ``aiayn import`` refuses
    (a model an older aiayn imported, before it checked them): aiayn decodes it otherwise
    than Hugging Face's ``generate()``."""
    from aiayn.marian.generation import check_generation

    if translator.generation:
        try:
            check_generation(translator.generation, translator.model.cfg, "generation settings")
        except AiaynError as e:
            note(
                f"the model's {e}; it was imported by an older aiayn, which did not check "
                "this, and its translations differ from transformers' generate()"
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
    were given, each replacing the rule it is part of (:meth:`DecodeOptions.given`: e.g.
    --sampling without --beam samples); checked there. A seed without sampling (given, or
    the model's default) would be ignored, and is refused."""
    given = {name: getattr(args, name, None) for name in OPTION_FLAGS}
    options = defaults.given(n_best=n_best, **given)
    if given["seed"] is not None and not options.sampling:  # as the server's 422
        raise AiaynError("--seed seeds sampling, which is off: give --sampling too")
    if options.max_len_a == 0 and options.max_len_b == 0:  # empty lines, log-prob 0
        raise AiaynError(
            "--max-len-a 0 and --max-len-b 0 allow no output token (EOS counts): every "
            "output would be empty"
        )
    if options.sampling and options.n_best > MAX_SAMPLES:  # 100000 ran out of memory, unsaid
        raise AiaynError(
            f"--n-best {options.n_best}: at most {MAX_SAMPLES} samples a line (each is a row "
            "of the batch, with a decoder cache of its own)"
        )
    return options


MAX_SAMPLES = 1024


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
        p.add_argument(
            "--checkpoint",
            default="auto",
            help="auto|averaged|best|last or a .pt file",
        )
    p.add_argument(
        "--beam", type=int, default=None, help="beam size; 1 = greedy, unless sampling (default 4)"
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
        action=argparse.BooleanOptionalAction,
        default=None,
        help="draw each token, beam 1 (--n-best N: N samples); --no-sampling searches "
        "where an imported model's settings sample",
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
