"""A recipe's model fields against the model they make, fine-tune or resume: what a run
would otherwise ignore or contradict, refused before anything is written."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import resolve_checkpoint, split_model_spec
from aiayn.config import TransformerConfig
from aiayn.data.shards import PreparedData, read_manifest
from aiayn.data.tokenizer import Tokenizer
from aiayn.distributed import World
from aiayn.errors import AiaynError, ConfigError, RecipeError
from aiayn.train.recipe import (
    FINE_TUNE_FIELDS,
    PREPARED_FIXED,
    RESUME_FIXED,
    TEXT_FIELDS,
    Recipe,
)
from aiayn.train.recipe_values import SET_BY_TOKENIZER
from aiayn.train.validation import check_valid_lengths


def fine_tune_config(recipe: Recipe, source: TransformerConfig, origin: str) -> TransformerConfig:
    """The config of a run that starts from a model whose config is ``source`` (read from
    ``origin``): the source's, with the recipe's :data:`FINE_TUNE_FIELDS`. Any other model
    field the recipe sets must equal the source's: RecipeError naming it otherwise."""
    data = source.to_dict()
    for key in sorted(recipe.given_model_fields):
        value = recipe.model[key]
        if key not in data:
            raise RecipeError(f"recipe field model.{key}: not a model field")
        learned = key == "max_len" and source.learned_positions  # a table of trained weights
        if key in FINE_TUNE_FIELDS and not learned:
            data[key] = value
        elif value != data[key]:
            raise RecipeError(
                f"recipe field model.{key}={value!r} contradicts the model being fine-tuned "
                f"({origin} has {key}={data[key]!r}); leave it out of the recipe"
            )
    return TransformerConfig.from_dict(data)


def check_new_model(
    recipe: Recipe, init: dict | None = None, device: torch.device | None = None
) -> None:
    """Refuse, before a new run writes anything, model fields that cannot make a model:
    those of ``recipe.model`` (with the recipe's ``vocab_size`` standing in for the
    tokenizer's, made later), or with ``init`` (the state of the model it starts from) what
    :func:`fine_tune_config` refuses; and a model too large to train in all the memory of
    ``device`` (:func:`check_fits`). RecipeError naming the field, and the recipe file
    (or override) that set it."""
    if init is not None:
        start = TransformerConfig.from_dict(init["config"])  # not the recipe's: unwrapped
    else:
        vocab = max(recipe.vocab_size, 8)  # a too small one is prepare's to name
        stand_in = dict(src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=0, bos_id=1, eos_id=2)
        if given := sorted(recipe.given_model_fields & SET_BY_TOKENIZER.keys()):
            raise RecipeError(
                f"recipe field model.{given[0]}: the tokenizer sets it "
                f"({SET_BY_TOKENIZER[given[0]]}); leave it out"
            )
    try:
        if init is not None:
            cfg = fine_tune_config(recipe, start, init["path"])
        else:
            cfg = TransformerConfig.from_dict({**recipe.model, **stand_in})
    except ConfigError as e:  # named as the recipe names it: model.d_model, not the class
        message = f"recipe field {e}".replace("TransformerConfig.", "model.", 1)
        raise RecipeError(_set_where(recipe, str(e)) + message) from None
    if device is not None:
        check_fits(cfg, device)


def _set_where(recipe: Recipe, error: str) -> str:
    """``"FILE: "`` (or ``"override 'KEY=VALUE': "``) where the recipe set the model field
    that the model's ``error`` names (for n_heads not dividing d_model, either of them),
    or "" where the recipe's defaults or code set it."""
    found = re.match(r"TransformerConfig\.(\w+):", error)
    keys = [found[1], *(["d_model"] if found[1] == "n_heads" else [])] if found else []
    for key in keys:
        if (where := recipe.source_of(f"model.{key}")) not in (None, "recipe"):
            return f"{where}: "
    return ""


# What training holds per parameter before any activation: fp32 weights, their gradients
# and Adam's two moments, 4 bytes each.
TRAINING_BYTES = 16


def parameter_estimate(cfg: TransformerConfig) -> int:
    """About how many parameters a Transformer of ``cfg`` has (Section 3: attention's four
    projections, the FFN's two, a LayerNorm around each sub-layer, the embeddings and the
    output projection; within a few per cent of :meth:`Transformer.num_parameters`),
    counted without building one."""
    d, f = cfg.d_model, cfg.d_ff
    attention, ffn, norm = 4 * d * d + 4 * d, 2 * d * f + f + d, 2 * d
    encoder = cfg.encoder_layers * (attention + ffn + 2 * norm)
    decoder = cfg.decoder_layers * (2 * attention + ffn + 3 * norm)
    shared = cfg.share_embeddings and cfg.src_vocab_size == cfg.tgt_vocab_size
    embeddings = d * (cfg.src_vocab_size + (0 if shared else cfg.tgt_vocab_size))
    projection = 0 if cfg.tie_output else d * cfg.tgt_vocab_size
    positions = 2 * d * cfg.max_len if cfg.learned_positions else 0
    return encoder + decoder + embeddings + projection + positions


def device_memory(device: torch.device) -> int | None:
    """All the memory of ``device`` in bytes (a GPU's, or the machine's for a CPU), or
    None where it cannot be told."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[1])
        if device.type == "cpu":
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError, RuntimeError):  # no sysconf, no driver
        return None
    return None


def check_fits(cfg: TransformerConfig, device: torch.device) -> None:
    """RecipeError unless ``cfg``'s model, its gradients and Adam's moments fit in all the
    memory of ``device``: a mistyped size (``n_layers=100000``) otherwise filled the
    machine's memory for minutes before the process was killed."""
    total, parameters = device_memory(device), parameter_estimate(cfg)
    need = parameters * TRAINING_BYTES
    if total is None or need <= total:
        return
    sizes = ", ".join(
        f"model.{k}={getattr(cfg, k)}" for k in ("d_model", "d_ff", "n_layers", "n_heads")
    )
    layers = f"{cfg.encoder_layers}+{cfg.decoder_layers} layers"
    raise RecipeError(
        f"the model ({sizes}; {layers}) has about {parameters / 1e6:,.0f}M "
        f"parameters: training needs about {need / 2**30:,.1f} GiB for its weights, "
        f"gradients and Adam's moments alone, more than all the {total / 2**30:,.1f} GiB of "
        f"memory of {device}"
    )


def check_resume(recipe: Recipe, state: dict, origin: str, start: bool = True) -> None:
    """Refuse what resuming from ``state`` (read from ``origin``) would silently ignore: a
    model field the recipe sets to other than the checkpoint's (a resumed run keeps its
    model), another model to start from (``init_from``), one of :data:`RESUME_FIXED` or
    :data:`PREPARED_FIXED` other than the checkpoint's recipe had, or in the middle of an
    epoch another ``max_tokens`` or ``seed`` (pairs would be skipped or seen twice)."""
    config = state["config"]
    for key in sorted(recipe.given_model_fields):
        value = recipe.model[key]
        if key not in config:
            raise RecipeError(f"recipe field model.{key}: not a model field")
        if value != config[key]:
            raise RecipeError(
                f"recipe field model.{key}={value!r} differs from the run being resumed "
                f"({origin} has {key}={config[key]!r}): a resumed run keeps its model"
            )
    saved = state.get("recipe") or {}
    started = saved.get("init_from") or ""
    # ``start``: rank 0 alone compares its init_from, which the run recorded; the other
    # ranks may name that model by another path (their machine's).
    other = start and recipe.init_from and recipe.init_from != started
    if other and not _started_from(recipe, state):
        was = f"started from {started}" if started else "started from scratch"
        raise RecipeError(
            f"recipe field init_from={recipe.init_from} differs from the run being resumed "
            f"({origin} {was}): a resumed run goes on from its own weights; train into a new "
            "directory to start from that model"
        )
    plan = ("max_tokens", "seed") if state.get("batch_in_epoch") else ()  # the epoch's plan
    # A run of a prepared directory or a model's tokenizer never used PREPARED_FIXED.
    prepared = () if saved.get("data") or saved.get("init_from") else PREPARED_FIXED
    for key in (*plan, *RESUME_FIXED, *prepared):
        value = list(recipe.adam_betas) if key == "adam_betas" else getattr(recipe, key)
        if key in saved and value != saved[key]:
            if key in plan:
                why = (
                    " in the middle of an epoch, whose position indexes the batch plan they "
                    "make: resume with the run's own, and change it once an epoch has ended"
                )
            elif key in PREPARED_FIXED:
                why = ": its data and tokenizer were prepared with the run's own"
            else:
                why = ": its optimizer state keeps the run's own"
            raise RecipeError(
                f"recipe field {key}={value!r} differs from the run being resumed ({origin} "
                f"has {saved[key]!r}){why}"
            )


def _started_from(recipe: Recipe, state: dict) -> bool:
    """Whether ``recipe.init_from`` names the checkpoint file the run of ``state`` started
    from (its ``origin`` records it), in another spelling: DIR, DIR:best, DIR/checkpoint_best.pt."""
    origin = (state.get("origin") or {}).get("init_from")
    if not isinstance(origin, str):
        return False
    try:
        named = resolve_checkpoint(*split_model_spec(recipe.init_from))
        return named.resolve() == Path(origin).resolve() or os.path.samefile(named, origin)
    except (AiaynError, OSError):  # names no checkpoint (any more): not the same one
        return False


def prepared_notes(recipe: Recipe) -> list[str]:
    """What a run of prepared data (``recipe.data``) leaves unused: each field of
    :data:`PREPARED_FIXED` that the recipe sets (in its file, by an override, or in code to
    other than its default) to other than what the data was prepared with, as one line
    naming the field, where it was set, its value and the data's. Empty without ``data``,
    and where the manifest cannot be read (the run refuses it, naming why). Notes, not
    refusals: recipes set these fields for raw text, and one recipe serves both."""
    try:
        manifest = read_manifest(Path(recipe.data)) if recipe.data else None
    except AiaynError:
        manifest = None
    if manifest is None:
        return []
    made = manifest.get("tokenizer")  # what prepare trained; {"from": ...} for one given
    made = made if isinstance(made, dict) else {}
    # The values that agree with the data: the vocabulary asked for and the one made (fewer,
    # where the text holds fewer tokens); no model type for a tokenizer given to prepare.
    agree: dict[str, list[Any]] = {
        "vocab_size": [made.get("vocab_size"), manifest["vocab_size"]],
        "spm_model_type": [made.get("model_type")] if "model_type" in made else [],
        "max_len_words": [manifest["max_len_words"] or 0],  # null: no limit, as 0 is
    }
    notes, default = [], Recipe()
    for key in PREPARED_FIXED:
        value, where = getattr(recipe, key), recipe.source_of(key)
        if (where is None and value == getattr(default, key)) or not agree[key]:
            continue  # not set, or nothing to compare it with
        if value not in agree[key]:
            has = agree[key][-1]
            shown = f"{has} (no limit)" if key == "max_len_words" and not has else repr(has)
            origin = f"{where}: " if where not in (None, "recipe") else ""
            notes.append(
                f"{origin}recipe field {key}={value!r} is unused: the prepared data in "
                f"{recipe.data} was made with {shown}; prepare the text again to change it"
            )
    return notes


def run_config(
    recipe: Recipe, tokenizer: Tokenizer, state: dict | None, init: dict | None
) -> TransformerConfig:
    """A run's model config: the checkpoint's ``state`` when resuming; the starting model's
    (``init``) with the recipe's fine-tuning fields; else the recipe's, with the
    tokenizer's vocabulary sizes and special ids."""
    if state is not None:
        return TransformerConfig.from_dict(state["config"])
    if init is not None:
        source = TransformerConfig.from_dict(init["config"])
        return fine_tune_config(recipe, source, init["path"])
    t = tokenizer
    sizes = dict(src_vocab_size=t.src_vocab_size, tgt_vocab_size=t.tgt_vocab_size)
    ids = dict(pad_id=t.pad_id, bos_id=t.bos_id, eos_id=t.eos_id)
    return TransformerConfig.from_dict({**recipe.model, **sizes, **ids})


def check_data_fits(
    data: PreparedData, cfg: TransformerConfig, recipe: Recipe, log: Callable[[str], None]
) -> None:
    """RecipeError unless a run of ``recipe`` can train ``cfg`` on ``data`` and validate
    it: some training pair fits its positions (those that do not are skipped, and said),
    the validation loss has pairs to score (:func:`check_valid_lengths`), and validation's
    beam is no wider than the target vocabulary (found after an epoch's training, before)."""
    usable, pairs = len(data.train.usable(cfg.max_len)), len(data.train)
    if not usable:  # every epoch would pass without an update
        raise RecipeError(
            f"train: all {pairs} pairs are longer than model.max_len={cfg.max_len} "
            "tokens: nothing to train on (raise model.max_len)"
        )
    if usable < pairs:
        log(f"train: {pairs - usable} pairs longer than {cfg.max_len} tokens skipped")
    check_valid_lengths(data, cfg.max_len, log)
    if recipe.valid_beam > cfg.tgt_vocab_size:
        raise RecipeError(
            f"recipe field valid_beam: {recipe.valid_beam} is larger than the target "
            f"vocabulary ({cfg.tgt_vocab_size} tokens)"
        )


# Recipe fields that may differ between the processes of one job: where each machine finds
# its files (rank 0 prepares the data the others read) and what each uses to run.
PER_PROCESS = ("data", *TEXT_FIELDS, "init_from", "threads", "device")


def job_fields(recipe: Recipe) -> dict[str, object]:
    """The fields every process of a job must share, by name (``model.d_model``): the
    recipe's but :data:`PER_PROCESS`."""
    every = recipe.to_dict()
    fields = {k: v for k, v in every.items() if k not in PER_PROCESS}
    # Where the files are may differ, not whether there are any: a rank with init_from,
    # data or a text file where rank 0 has none (a dataset fills it) ran other collectives.
    given = {f"{k} (given)": bool(every[k]) for k in ("data", "init_from", *TEXT_FIELDS)}
    model = fields.pop("model")
    return {**fields, **given, **{f"model.{k}": v for k, v in model.items()}}


def check_same_recipe(recipe: Recipe, world: World) -> None:
    """RecipeError on every rank unless every process of the job runs rank 0's recipe
    (the fields of :data:`PER_PROCESS` aside): a rank with another ``max_tokens`` hung
    until the collective timeout, another ``model.d_model`` died in DDP with a traceback,
    another ``lr_scale`` trained a model no recipe describes, without a word."""
    if world.size == 1:
        return
    mine = job_fields(recipe)
    found = world.gather([mine])
    differs = None
    for rank, theirs in enumerate(found or []):
        keys = sorted(k for k in mine if theirs.get(k) != mine[k])
        if keys:
            differs = (rank, keys[0], theirs.get(keys[0]), mine[keys[0]])
            break
    differs = world.broadcast(differs)
    if differs is not None:
        rank, key, theirs, ours = differs
        raise RecipeError(
            f"recipe field {key}: rank {rank} has {theirs!r} where rank 0 has {ours!r}; every "
            "process of a job must run one recipe"
        )
