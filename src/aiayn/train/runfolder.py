"""What a run directory holds: whether a new run may take an existing folder, and whether a
resumed run is given the text its data was prepared from.

A new run writes its recipe, tokenizer, logs and data into its directory, and deletes the
logs of a run it replaces. So an existing folder is taken only when what it holds under
those names is what an earlier run that saved no checkpoint left (see
:func:`check_new_run_folder`): prepared data given as the output by mistake, or a
project's own logs, are refused before anything in it is written over or deleted.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from aiayn.checkpoint import BEST, KEPT_NAME, LAST, TMP_SUFFIX
from aiayn.data.folders import LOCKED, staged_leftovers
from aiayn.data.marian_tokenizer import (
    SOURCE_SPM,
    TARGET_SPM,
    TARGET_VOCAB,
    TOKENIZER_CONFIG,
    VOCAB,
)
from aiayn.data.shards import MANIFEST, PreparedData, read_manifest, sha256_file
from aiayn.data.tokenizer import SPM_FILE
from aiayn.errors import AiaynError, RecipeError
from aiayn.train.recipe import TEXT_FIELDS, Recipe

RECIPE, METRICS, TENSORBOARD, DATA = "recipe.yaml", "metrics.jsonl", "tensorboard", "data"
# What a run writes besides its recipe, checkpoints and data (True: a folder). These are a
# run's only beside a recipe.yaml that a run wrote, which it writes before any of them.
LOGS = {METRICS: False, TENSORBOARD: True, "plots": True}  # plots: `aiayn plot`'s
TOKENIZER_FILES = (SPM_FILE, SOURCE_SPM, TARGET_SPM, VOCAB, TARGET_VOCAB, TOKENIZER_CONFIG)
MOVE_AWAY = "train into a new or empty directory, or move them away first"


def check_new_run_folder(out_dir: Path) -> None:
    """AiaynError naming ``out_dir`` and what it holds unless a new run may write into it
    (checkpoints are refused before: see RunDirectory): it is missing, or what it holds
    under the names a run writes is what a run writes there (its recipe, tokenizer
    files, metrics.jsonl, tensorboard/ of event files, plots/, data/ of prepared data, and
    the lock and staging folder of that data while it is prepared), the logs only beside
    a recipe.yaml a run wrote: an earlier run that saved no checkpoint, which the new run
    replaces, logs included. Files under other names (a log the user tees, a README) are
    neither written over nor deleted, and stay."""
    if not out_dir.is_dir():
        return
    if (out_dir / MANIFEST).exists():
        raise AiaynError(
            f"{out_dir}: holds prepared data ({MANIFEST}), not a training run; a run into it "
            "would write over its files: train into another directory"
        )
    kinds = {RECIPE: False, DATA: True, **LOGS, **dict.fromkeys(TOKENIZER_FILES, False)}
    hidden = {f".{DATA}{LOCKED}", *(p.name for p in staged_leftovers(out_dir / DATA))}
    foreign, logs = [], []
    for entry in sorted(out_dir.iterdir()):
        name = entry.name
        if name in hidden:
            continue
        if name not in kinds:
            continue  # a run neither writes nor deletes it (a tee'd log, a README): kept
        if entry.is_dir() != kinds[name] or entry.is_symlink():
            foreign.append(name)
        elif name == TENSORBOARD:  # event files only: a run's writer puts nothing else
            odd = [p for p in entry.iterdir() if not _event_file(p)]
            foreign += [f"{name}/{p.name}" for p in sorted(odd)]
        elif name == DATA and any(entry.iterdir()) and not (entry / MANIFEST).is_file():
            foreign.append(name)  # a run's data/ is renamed into place whole, manifest and all
        elif name == METRICS and not _run_log(entry):
            foreign.append(name)
        if name != RECIPE and name != DATA:
            logs.append(name)
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise AiaynError(
            f"{out_dir}: holds files that are not a training run's ({shown}); {MOVE_AWAY}"
        )
    recipe = out_dir / RECIPE
    if recipe.exists() and not _run_recipe(recipe):
        raise AiaynError(
            f"{recipe}: not the recipe.yaml of a training run (a run writes every field); a "
            "new run would write over it: train into a new or empty directory, or move it "
            "away first"
        )
    if logs and not recipe.exists():
        shown = ", ".join(logs[:3]) + (", ..." if len(logs) > 3 else "")
        raise AiaynError(
            f"{out_dir}: holds {shown} but no {RECIPE}: not what a training run leaves; {MOVE_AWAY}"
        )


def remove_stale_temp_files(out_dir: Path) -> None:
    """Delete the temp files of the run's own saves cut short (a kill) in ``out_dir``:
    not checkpoints, nor the save of another command in progress there (`average`'s)."""
    for stale in out_dir.glob(f".*.pt.*{TMP_SUFFIX}"):
        name = stale.name[1:].rsplit(".", 2)[0]  # .checkpoint_last.pt.k2x9_q1a.tmp
        if name in (LAST, BEST) or KEPT_NAME.fullmatch(name):
            stale.unlink(missing_ok=True)


def check_replaced_data(r: Recipe, out_dir: Path, directory: Path) -> None:
    """AiaynError unless the prepared ``directory`` (a new run's ``data/``, about to be
    prepared again from ``r``'s text) is an earlier run's: beside a recipe.yaml a run
    wrote, or prepared from the very files ``r`` names (the same paths and sizes; a run
    that stopped before writing its recipe)."""
    if _run_recipe(out_dir / RECIPE):
        return
    inputs = read_manifest(directory)["inputs"]
    for field in TEXT_FIELDS:
        given = Path(getattr(r, field)).resolve()
        was = inputs[field]
        if str(given) != was["path"] or not given.is_file() or given.stat().st_size != was["bytes"]:
            raise AiaynError(
                f"{directory}: prepared data of other text ({was['path']}) and no {RECIPE} "
                f"of a run beside it, so not an earlier run's own; {MOVE_AWAY}"
            )


def _event_file(path: Path) -> bool:
    return path.is_file() and path.name.startswith("events.out.tfevents.")


def _run_log(path: Path) -> bool:
    """Whether ``path`` is empty or starts with a line of a run's metrics.jsonl."""
    with path.open("rb") as f:
        first = f.readline(1 << 16)
    if not first.strip():
        return not path.stat().st_size
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and "kind" in record and "step" in record


def _run_recipe(path: Path) -> bool:
    """Whether ``path`` is a recipe.yaml as a run writes it: a mapping of every field."""
    if not path.is_file():
        return False
    try:
        data = yaml.safe_load(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and set(Recipe().to_dict()) <= set(data)


def same_text(r: Recipe, directory: Path) -> None:
    """RecipeError when a text file ``r`` names is not the one ``directory`` (a resumed
    run's data) was prepared from: the run would go on with its own data and leave the
    named file unread. A file at another path with the same size and sha256 (a moved
    corpus) is the same; at its path, one of another size was edited since (its size
    only is compared there: hashing a large corpus at every resume would be slow)."""
    inputs = read_manifest(directory)["inputs"]
    for field in TEXT_FIELDS:
        given, was = Path(getattr(r, field)).resolve(), inputs[field]
        same_size = given.is_file() and given.stat().st_size == was["bytes"]
        there = str(given) == was["path"]
        if same_size and (there or sha256_file(given) == was["sha256"]):
            continue
        if there:
            what = f"was changed since the run being resumed was prepared from it (in {directory})"
        else:
            what = (
                "is not the file the run being resumed was prepared from "
                f"({was['path']}, in {directory})"
            )
        raise RecipeError(
            f"recipe field {field}={getattr(r, field)} {what}: a resumed run goes on with its "
            "own data; give the same files, or train into a new directory"
        )


# The checkpoint key of :func:`data_print`: a resumed run checks its data against it.
DATA_PRINT = "data_print"


def data_print(data: PreparedData) -> str:
    """What tells prepared data apart: its tokenizer, token counts and texts' sha256 (not
    its path: a copy elsewhere is the same data)."""
    m = data.manifest
    texts = {k: v.get("sha256") for k, v in (m.get("inputs") or {}).items()}
    return json.dumps([m.get("spm_sha256"), m["dtype"], m["splits"], texts], sort_keys=True)


def check_resumed_data(data: PreparedData, state: dict | None) -> None:
    """RecipeError when a resumed run (from ``state``) is given other data than it trained
    on (see :func:`data_print`; checkpoints before the print have none to compare)."""
    if state is not None and state.get(DATA_PRINT) not in (None, data_print(data)):
        raise RecipeError(
            f"{data.directory}: not the data the run being resumed trained on (another "
            "training or validation text, or token count): a resumed run goes on with its "
            "own data, whose batch plan its position indexes and whose validation its best "
            "checkpoint is chosen by; give the same data, or train into a new directory"
        )
