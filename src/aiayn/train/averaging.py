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


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Element-wise mean of the model weights of ``paths`` (the paper averages the last 5
    or 20 checkpoints). Returns the newest checkpoint's state with the averaged weights and
    no optimizer state. All checkpoints must share one config, one tokenizer (or all have
    none: bare weights) and the same weights (names and shapes); CheckpointError naming the
    one that does not."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    states = [load_checkpoint(p) for p in paths]
    for path, state in zip(paths, states):
        if state.get("tokenizer") is not None:  # a model to translate with: a readable one
            checkpoint_tokenizer(state, path)
    first = states[0]
    configs = [TransformerConfig.from_dict(s["config"]) for s in states]  # defaults filled in
    for p, state, config in zip(paths[1:], states[1:], configs[1:]):
        if config != configs[0]:
            raise CheckpointError(f"{p}: model config differs from {paths[0]}; cannot average")
        if state.get("tokenizer") != first.get("tokenizer"):  # another one, or none
            raise CheckpointError(
                f"{p} has another tokenizer than {paths[0]}; averaged checkpoints must share "
                "one vocabulary"
            )
        _check_same_weights(first["model"], state["model"], paths[0], p)
    averaged = {}
    for name, tensor in first["model"].items():
        if tensor.is_floating_point():
            averaged[name] = sum(s["model"][name].double() for s in states).div(len(states))
            averaged[name] = averaged[name].to(tensor.dtype)
        else:
            averaged[name] = tensor
    newest = max(states, key=lambda s: s.get("step", 0))
    out = {k: v for k, v in newest.items() if k not in ("optimizer", "schedule", "rng", "format")}
    out["model"] = averaged
    out["averaged_from"] = [str(p) for p in paths]
    return out


def _check_same_weights(
    ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], first: Any, path: Any
) -> None:
    """CheckpointError unless ``theirs`` (of ``path``) has the weights of ``ours`` (of
    ``first``): the same names, each of the same shape."""
    missing, extra = sorted(ours.keys() - theirs.keys()), sorted(theirs.keys() - ours.keys())
    if missing:
        raise CheckpointError(f"{path}: no weight {missing[0]!r} (as {first} has); cannot average")
    if extra:
        raise CheckpointError(f"{path}: weight {extra[0]!r} is not in {first}; cannot average")
    for name, tensor in ours.items():
        if theirs[name].shape != tensor.shape:
            raise CheckpointError(
                f"{path}: weight {name!r} has shape {list(theirs[name].shape)}, but "
                f"{list(tensor.shape)} in {first}; cannot average"
            )
