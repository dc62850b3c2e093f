"""`aiayn demo`, `prepare`, `train` and `average`."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from aiayn.cli.common import MODEL_NAMES, MODEL_SUFFIXES
from aiayn.cli.flags import note
from aiayn.errors import AiaynError


def cmd_demo(args: argparse.Namespace) -> int:
    from aiayn.train.demo import MAX_SEED, run_demo

    # Checked before the ~80 s of training, not after it: a bar no accuracy can reach
    # (or NaN, which none passes) made a finished demo exit 1 without a word.
    if not (math.isfinite(args.min_accuracy) and 0 <= args.min_accuracy <= 1):
        raise AiaynError(f"--min-accuracy must be in [0, 1], got {args.min_accuracy}")
    if args.steps < 1:
        raise AiaynError(f"--steps must be at least 1, got {args.steps}")
    if not 0 <= args.seed <= MAX_SEED:
        raise AiaynError(f"--seed must be in [0, 2**63 - 1], got {args.seed}")
    result = run_demo(steps=args.steps, seed=args.seed, progress=not args.no_progress)
    return 0 if result.accuracy >= args.min_accuracy else 1


# prepare's flags for training a tokenizer, with their defaults: --spm-model's is not trained.
TOKENIZER_FLAGS = {"vocab_size": 8000, "spm_model_type": "bpe", "spm_sample": 500_000, "seed": 1}


def cmd_prepare(args: argparse.Namespace) -> int:
    from aiayn.data.prepared import SPECIAL, prepare

    # Named as flags here: the library names its parameters (sample, max_len_words).
    for flag, value, low in (
        ("--workers", args.workers, 1),
        ("--spm-sample", args.spm_sample, 1),
        ("--max-len-words", args.max_len_words, 0),
        ("--vocab-size", args.vocab_size, len(SPECIAL) + 1),
    ):
        if value < low and not (flag == "--vocab-size" and args.spm_model):
            raise AiaynError(f"{flag} must be at least {low}, got {value}")
    if args.spm_model and (
        unused := [k for k, v in TOKENIZER_FLAGS.items() if getattr(args, k) != v]
    ):
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in unused)
        note(f"{flags}: for training a tokenizer; --spm-model's is used as it is")
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
        f"{train['dropped_long']} long dropped), a vocabulary of {manifest['vocab_size']}, "
        f"{manifest['dtype']}, {manifest['seconds']} s -> {args.out}"
    )
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from aiayn.train.model_checks import prepared_notes
    from aiayn.train.recipe import TEXT_FIELDS, Recipe
    from aiayn.train.trainer import Trainer

    _refuse_repeated_keys(args.set or [])
    overrides = [*_replaced_data(args), *_absolute_set(args.set), *_flag_overrides(args)]
    recipe = (
        Recipe.from_yaml(args.config, overrides) if args.config else Recipe().override(overrides)
    )
    for flag in TEXT_FIELDS:
        if not recipe.data and not recipe.dataset and not getattr(recipe, flag):
            raise AiaynError(
                f"recipe field {flag!r} is empty: give --{flag.replace('_', '-')} (or --data, "
                "or a named data set: --set dataset=multi30k)"
            )
    for text in prepared_notes(recipe):  # fields a run of prepared data leaves unused
        note(text)
    resumes: dict[str | None, bool | str] = {None: False, "yes": True, "auto": "auto"}
    resume = resumes[args.resume]
    trainer = Trainer(recipe, args.out, resume=resume, progress=not args.no_progress)
    trainer.train(progress=not args.no_progress)
    return 0


def _replaced_data(args: argparse.Namespace) -> list[str]:
    """The overrides that clear the recipe's own data when the command line names the run's
    data, so that what was given is what trains (the recipe's ``data`` would win over text
    and leave it unread): --data clears the recipe's text and ``dataset``; a text flag
    clears its ``data`` (its ``dataset`` still fills the text fields not given). They come
    before --set, which may set a field again (and Recipe.check refuses a contradiction)."""
    from aiayn.train.recipe import TEXT_FIELDS

    texts = [f for f in TEXT_FIELDS if getattr(args, f)]
    if args.data and texts:  # the recipe would take --data and drop the text unread
        given = ", ".join(f"--{f.replace('_', '-')}" for f in texts)
        raise AiaynError(f"--data and {given} name two data sets: give one or the other")
    if args.data:
        return [f"{field}=" for field in ("dataset", *TEXT_FIELDS)]
    return ["data="] if texts else []


def _flag_overrides(args: argparse.Namespace) -> list[str]:
    """The recipe overrides of --data, the text flags and --init-from (paths made
    absolute); AiaynError when --set sets the same field too (one would be dropped)."""
    from aiayn.train.recipe import TEXT_FIELDS

    overrides = []
    for flag in ("data", *TEXT_FIELDS):
        if getattr(args, flag):
            overrides.append(f"{flag}={Path(getattr(args, flag)).resolve()}")
    if args.init_from:  # MODEL_DIR[:CHECKPOINT]; the directory made absolute
        overrides.append(f"init_from={_absolute_model_spec(args.init_from)}")
    set_keys = {item.split("=", 1)[0] for item in args.set or []}
    for item in overrides:
        key = item.split("=", 1)[0]
        if key in set_keys:
            flag = f"--{key.replace('_', '-')}"
            raise AiaynError(f"{flag} and --set {key}=... both set {key}: give one")
    return overrides


def _refuse_repeated_keys(items: list[str]) -> None:
    """AiaynError naming a key that --set gives twice, in one --set or across several:
    applied in turn, the first setting would be lost without a word (a recipe file that
    gives a key twice is refused too). ``model={...}`` gives the model keys it holds."""
    first: dict[str, str] = {}
    for item in items:
        for key in _set_keys(item):
            if key in first:
                raise AiaynError(
                    f"--set: key {key!r} given twice ({first[key]!r}, then {item!r}): give it once"
                )
            first[key] = item


def _set_keys(item: str) -> list[str]:
    """The recipe keys ``item`` (KEY=VALUE) sets, a model field as ``model.KEY``."""
    import yaml

    key, _, raw = item.partition("=")
    if key == "model":
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:  # Recipe.override names it
            value = None
        if isinstance(value, dict):
            return [f"model.{name}" for name in value]
    return [key]


def _absolute_set(items: list[str] | None) -> list[str]:
    """The --set items, with a relative path in a path field made absolute, as the flags'
    are: resolved against the current directory, where recipe.yaml (in the run directory,
    its paths relative to itself) would read it elsewhere."""
    from aiayn.train.recipe import TEXT_FIELDS

    out = []
    for item in items or []:
        key, is_set, value = item.partition("=")
        if is_set and value and key in ("data", *TEXT_FIELDS) and not Path(value).is_absolute():
            item = f"{key}={Path(value).resolve()}"
        elif is_set and value and key == "init_from":
            item = f"{key}={_absolute_model_spec(value)}"
        out.append(item)
    return out


def _absolute_model_spec(spec: str) -> str:
    """MODEL_DIR[:CHECKPOINT] with MODEL_DIR (or a checkpoint file) made absolute."""
    path = Path(spec)
    if path.exists() or ":" not in spec:
        return str(path.resolve())
    directory, which = spec.rsplit(":", 1)
    return f"{Path(directory).resolve()}:{which}"


def cmd_average(args: argparse.Namespace) -> int:
    from aiayn.checkpoint import (
        AVERAGED,
        BEST,
        KEPT_NAME,
        LAST,
        check_target,
        epoch_checkpoints,
        save_checkpoint,
        saved_step,
    )
    from aiayn.errors import CheckpointError
    from aiayn.train.averaging import average_checkpoints

    model_dir = Path(args.model)
    if not model_dir.is_dir():  # before --out's check, which would blame the output
        what = "not a" if model_dir.exists() else "no such"  # a file: a checkpoint, say
        raise AiaynError(f"{model_dir}: {what} model directory")
    if args.last < 1:
        raise AiaynError(f"--last must be >= 1, got {args.last}")
    out = Path(args.out) if args.out else model_dir / AVERAGED
    check_target(out)  # a folder or device there: refused before the work, never replaced
    if out.exists() and (out.name in (LAST, BEST) or KEPT_NAME.fullmatch(out.name)):
        raise AiaynError(  # weights alone in place of a run's own checkpoint: resume lost
            f"{out}: a training run's own checkpoint, which the average would replace; "
            "choose another file"
        )
    if KEPT_NAME.fullmatch(out.name):  # later averages would take it for one, pruning too
        raise AiaynError(f"{out}: the name of an epoch or timed checkpoint; choose another")
    model_file = out.name in MODEL_NAMES or out.name.endswith(MODEL_SUFFIXES)
    if out.exists() and model_file and out.suffix != ".pt":  # .pt: the checks above
        raise AiaynError(  # a checkpoint in place of the tokenizer, recipe or metrics
            f"{out}: a model's tokenizer, recipe or metrics file, which the average would "
            "replace; choose another file"
        )
    for tries_left in (2, 1, 0):
        paths = _newest_states(epoch_checkpoints(model_dir), args.last)
        if not paths:
            raise AiaynError(
                f"{model_dir}: no checkpoint_epoch*.pt or checkpoint_step*.pt to average"
            )
        try:
            state = average_checkpoints(paths)
            break
        except CheckpointError:
            # One pruned since the listing (a run training there saves and prunes): list
            # them again, rather than name a file the user never gave.
            if not tries_left or all(p.is_file() for p in paths):
                raise
    if len(paths) < args.last:
        note(f"averaging the {len(paths)} checkpoint(s) found (asked {args.last})")
    if (run_step := saved_step(model_dir / LAST)) is not None:  # see stale_average
        state["run_step"] = run_step
    save_checkpoint(state, out)
    print(f"averaged {', '.join(p.name for p in paths)} -> {out}")
    return 0


def _newest_states(paths: list[Path], n: int) -> list[Path]:
    """The newest ``n`` of ``paths`` (oldest first, as :func:`epoch_checkpoints` orders
    them: by step), less a timed checkpoint of the step of a newer one: a run whose time
    limit is a multiple of its save period saves its last update as a timed checkpoint and
    as the epoch's, one state the average counted twice."""
    from aiayn.checkpoint import saved_step

    chosen: list[Path] = []
    steps: dict[int, Path] = {}
    for path in reversed(paths):
        if len(chosen) == n:
            break
        step = saved_step(path)
        if step in steps and path.name.startswith("checkpoint_step"):
            note(f"{path.name} is step {step}, as {steps[step].name}: averaged once")
            continue
        if step is not None:
            steps[step] = path
        chosen.append(path)
    return chosen[::-1]


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo", help="train on the built-in numbers-to-words task (about 80 s on 2 CPU cores)"
    )
    p.add_argument("--steps", type=int, default=800, help="training updates (default 800)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--min-accuracy", type=float, default=0.0, help="exit 1 below this exact-match (0..1)"
    )
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "prepare", help="stream, check and encode parallel text once, for `train --data`"
    )
    for flag in ("train-src", "train-tgt", "valid-src", "valid-tgt"):
        p.add_argument(f"--{flag}", dest=flag.replace("-", "_"), required=True)
    p.add_argument("--out", required=True, help="a new (or empty) directory for the prepared data")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=TOKENIZER_FLAGS["vocab_size"],
        help="joint SentencePiece vocabulary",
    )
    p.add_argument(
        "--spm-model",
        help="use this tokenizer instead of training one: a SentencePiece model, or a model "
        "directory (e.g. an imported Marian model, to fine-tune it with `train --init-from`)",
    )
    p.add_argument(
        "--spm-model-type", default=TOKENIZER_FLAGS["spm_model_type"], choices=["bpe", "unigram"]
    )
    p.add_argument(
        "--spm-sample",
        type=int,
        default=TOKENIZER_FLAGS["spm_sample"],
        help="pairs the tokenizer is trained on",
    )
    p.add_argument(
        "--max-len-words", type=int, default=100, help="drop longer training pairs (0: keep)"
    )
    p.add_argument("--workers", type=int, default=1, help="encoding processes")
    p.add_argument(
        "--seed", type=int, default=TOKENIZER_FLAGS["seed"], help="seed of the tokenizer's sample"
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("train", help="train a translation model on parallel text")
    p.add_argument("--config", help="YAML recipe, e.g. recipes/multi30k.yaml")
    p.add_argument("--out", required=True, help="model directory (checkpoints, logs)")
    p.add_argument("--data", help="a directory from `aiayn prepare` (instead of --train-src...)")
    p.add_argument("--train-src", dest="train_src")
    p.add_argument("--train-tgt", dest="train_tgt")
    p.add_argument("--valid-src", dest="valid_src")
    p.add_argument("--valid-tgt", dest="valid_tgt")
    p.add_argument(
        "--set",
        nargs="*",
        action="extend",  # --set a=1 --set b=2 and --set a=1 b=2 alike
        metavar="KEY=VALUE",
        help="recipe overrides (a key at most once), e.g. max_tokens=3000",
    )
    p.add_argument(
        "--init-from",
        dest="init_from",
        metavar="MODEL_DIR[:CHECKPOINT]",
        help="fine-tune: start from this model's config, weights and tokenizer (e.g. one from "
        "`aiayn import marian`); fresh optimizer and schedule",
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const="yes",
        choices=["yes", "auto"],
        help="continue from checkpoint_last.pt; `--resume auto`: only if there is one (for "
        "torchrun --max-restarts)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "average",
        help="average the newest N epoch and timed (step) checkpoints (Section 6.1)",
    )
    p.add_argument("--model", required=True, help="model directory")
    p.add_argument(
        "--last",
        type=int,
        default=5,
        help="how many of the newest checkpoint_epochNNN.pt and checkpoint_stepNNNNNNN.pt, "
        "by the training step they were saved at (default 5)",
    )
    p.add_argument("--out", help="default: MODEL/checkpoint_averaged.pt")
    p.set_defaults(func=cmd_average)
