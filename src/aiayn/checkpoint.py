"""Checkpoints: atomic save, load with clear errors, and averaging (Section 6.1)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

FORMAT = "aiayn-checkpoint-1"


TMP_SUFFIX = ".tmp"  # save_checkpoint's temp files: ".<name>.<random>.tmp"


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, corrupt or does not fit; names the file."""


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` to ``path`` atomically: a temp file in the same folder, flushed to
    disk, then renamed over the old one. A crash mid-save leaves the old file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def remove_stale_temp_files(directory: str | Path) -> None:
    """Delete temp files that a save cut short (a kill mid-save) left in ``directory``;
    the checkpoints themselves are untouched."""
    for stale in Path(directory).glob(f".*.pt.*{TMP_SUFFIX}"):
        stale.unlink(missing_ok=True)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Raises CheckpointError (never a bare torch/pickle traceback) when the file is missing,
    truncated, corrupt, or not an aiayn checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        # Random or truncated bytes can fail anywhere inside torch's (un)pickler with almost
        # any exception type (UnpicklingError, EOFError, ValueError, KeyError, ...).
        raise CheckpointError(
            f"{path}: cannot read checkpoint, the file is truncated or corrupt ({type(e).__name__})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an aiayn checkpoint (no '{FORMAT}' marker)")
    for key in ("model", "config"):
        if key not in state:
            raise CheckpointError(f"{path}: checkpoint has no '{key}' entry")
    return state


def check_vocab(state: dict[str, Any], vocab_size: int, path: str | Path, what: str) -> None:
    """CheckpointError unless the checkpoint's model was built for ``vocab_size`` tokens."""
    cfg = state["config"]
    sizes = {cfg["src_vocab_size"], cfg["tgt_vocab_size"]}
    if sizes != {vocab_size}:
        raise CheckpointError(
            f"{path}: checkpoint was trained with vocabulary size {sorted(sizes)}, "
            f"but {what} has {vocab_size} tokens; use the tokenizer it was trained with"
        )


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Element-wise mean of the model weights of ``paths`` (the paper averages the last 5
    or 20 checkpoints). Returns the newest checkpoint's state with the averaged weights and
    no optimizer state; all checkpoints must share one config."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    states = [load_checkpoint(p) for p in paths]
    first = states[0]
    for p, s in zip(paths[1:], states[1:]):
        if s["config"] != first["config"]:
            raise CheckpointError(f"{p}: model config differs from {paths[0]}; cannot average")
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
