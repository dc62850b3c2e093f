"""Checkpoint averaging (Section 6.1): the element-wise mean of the weights of a run's
last checkpoints, refused with a clear error for checkpoints that are not of one model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import checkpoint_tokenizer, load_checkpoint
from aiayn.config import TransformerConfig
from aiayn.errors import CheckpointError
from aiayn.model.layers import current_names
from aiayn.model.transformer import Transformer


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Element-wise mean of the model weights of ``paths`` (the paper averages the last 5
    or 20 checkpoints). Returns the newest checkpoint's state with the averaged weights and
    no optimizer state. All checkpoints must share one config, one tokenizer (or all have
    none: bare weights) and the same weights (names and shapes); CheckpointError naming the
    one that does not."""
    if isinstance(paths, (str, Path)):  # its characters would be taken for paths
        raise CheckpointError(f"paths: a list of checkpoint paths, not one path ({paths})")
    if not paths:
        raise CheckpointError("no checkpoints to average")
    # One checkpoint at a time beside a float64 running sum: a base model's checkpoint with
    # its Adam state takes about 0.8 GB, so the paper's 20 at once would hold 16 GB.
    first = _load(paths[0])
    weights, tokenizer, newest = first["model"], first.get("tokenizer"), _metadata(first)
    config = TransformerConfig.from_dict(first["config"])  # defaults filled in
    with torch.device("meta"):  # the model's weight names and dtypes, in no memory
        floats = {k for k, t in Transformer(config).state_dict().items() if t.is_floating_point()}
    for name in floats & weights.keys():  # an integer weight would be averaged, then cast
        if not weights[name].is_floating_point():
            kind = str(weights[name].dtype).removeprefix("torch.")
            raise CheckpointError(f"{paths[0]}: weight {name!r} holds {kind} values, not floats")
    total = {k: t.double() for k, t in weights.items() if t.is_floating_point()}
    del first  # its optimizer state
    for p in paths[1:]:
        state = _load(p)
        if TransformerConfig.from_dict(state["config"]) != config:
            raise CheckpointError(f"{p}: model config differs from {paths[0]}; cannot average")
        if state.get("tokenizer") != tokenizer:  # another one, or none
            raise CheckpointError(
                f"{p} has another tokenizer than {paths[0]}; averaged checkpoints must share "
                "one vocabulary"
            )
        _check_same_weights(weights, state["model"], paths[0], p)
        for name, running in total.items():
            running.add_(state["model"][name])
        if state.get("step", 0) > newest.get("step", 0):
            newest = _metadata(state)
        del state
    averaged = {
        name: total[name].div_(len(paths)).to(t.dtype) if name in total else t
        for name, t in weights.items()
    }
    return {**newest, "model": averaged, "averaged_from": [str(p) for p in paths]}


def _load(path: str | Path) -> dict[str, Any]:
    """The checkpoint at ``path``, its tokenizer readable where it has one (a model to
    translate with)."""
    state = load_checkpoint(path)
    if state.get("tokenizer") is not None:
        checkpoint_tokenizer(state, path)
    step = state.get("step", 0)  # the newest checkpoint's metadata is the average's
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{path}: checkpoint entry 'step' is {step!r}, not a step count")
    # A run resumed across an upgrade holds checkpoints of both namings.
    return {**state, "model": current_names(state["model"])}


def _metadata(state: dict[str, Any]) -> dict[str, Any]:
    """What an averaged checkpoint keeps of ``state``: all but its weights and the
    training state that averaging makes meaningless (optimizer, schedule, random
    generators)."""
    dropped = ("model", "optimizer", "schedule", "rng", "format")
    return {k: v for k, v in state.items() if k not in dropped}


def _check_same_weights(
    ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], first: Any, path: Any
) -> None:
    """CheckpointError unless ``theirs`` (of ``path``) has the weights of ``ours`` (of
    ``first``): the same names, each of the same shape and dtype."""
    missing, extra = sorted(ours.keys() - theirs.keys()), sorted(theirs.keys() - ours.keys())
    if missing:
        raise CheckpointError(f"{path}: no weight {missing[0]!r} (as {first} has); cannot average")
    if extra:
        raise CheckpointError(f"{path}: weight {extra[0]!r} is not in {first}; cannot average")
    for name, tensor in ours.items():
        for what, mine, other in (
            ("shape", list(tensor.shape), list(theirs[name].shape)),
            ("dtype", tensor.dtype, theirs[name].dtype),
        ):
            if other != mine:
                raise CheckpointError(
                    f"{path}: weight {name!r} has {what} {other}, but {mine} in {first}; "
                    "cannot average"
                )
