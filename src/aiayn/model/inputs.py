"""Checks of what callers hand the model, each a :class:`~aiayn.errors.ModelInputError`
naming the argument, instead of a shape or dtype error from inside torch."""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.errors import ModelInputError


def check_ids(
    name: str,
    ids: Tensor,
    vocab_size: int,
    max_len: int,
    values: bool = True,
    device: torch.device | None = None,
) -> None:
    """Raise ModelInputError naming ``name`` unless ids is a LongTensor [B, T] of valid ids,
    on ``device`` when one is given (a comparison: no synchronisation). ``values=False``
    checks the shape and dtype only, not the ids' range, which costs a device
    synchronisation on a GPU."""
    if not isinstance(ids, Tensor):
        raise ModelInputError(
            f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}"
        )
    if device is not None and ids.device != device:  # torch's own error names neither
        raise ModelInputError(
            f"{name} is on device {ids.device} but the model is on {device}; move one of them"
        )
    if ids.dtype != torch.long:
        raise ModelInputError(f"{name} must be torch.long (int64) token ids, got dtype {ids.dtype}")
    if ids.dim() != 2:
        raise ModelInputError(f"{name} must have shape [batch, length], got {tuple(ids.shape)}")
    if ids.size(1) > max_len:
        raise ModelInputError(f"{name} has length {ids.size(1)}, longer than max_len={max_len}")
    # Under torch.compile the range check would break the graph (a data-dependent branch);
    # compiled training reads ids that `aiayn prepare` already checked.
    if values and ids.numel() and not torch.compiler.is_compiling():
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ModelInputError(
                f"{name} holds id {bad}, outside the vocabulary [0, {vocab_size})"
            )


def check_memory(
    memory: object,
    d_model: int,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """ModelInputError unless ``memory`` is an encoder output ``[batch, src_len, d_model]``
    on ``device`` and of ``dtype`` (the weights'), when given: comparisons, no
    synchronisation. Under autocast its dtype may differ from the weights' and is not
    checked."""
    if not isinstance(memory, Tensor) or memory.dim() != 3 or memory.size(2) != d_model:
        got = tuple(memory.shape) if isinstance(memory, Tensor) else type(memory).__name__
        raise ModelInputError(
            f"memory must be the encoder output [batch, src_len, d_model={d_model}], got {got}"
        )
    if not memory.is_floating_point():
        raise ModelInputError(f"memory must be the encoder output (floats), got {memory.dtype}")
    if device is not None and memory.device != device:
        raise ModelInputError(
            f"memory is on device {memory.device} but the model is on {device}; move one of them"
        )
    if (
        dtype is not None
        and memory.dtype != dtype
        and not torch.is_autocast_enabled(memory.device.type)
    ):
        raise ModelInputError(
            f"memory has dtype {memory.dtype} but the model's weights are {dtype}; "
            "cast one of them (or run under torch.autocast)"
        )


def check_group(group: object) -> None:
    """ModelInputError unless ``group`` (target rows per source row) is an integer >= 1."""
    if not isinstance(group, int) or isinstance(group, bool) or group < 1:
        raise ModelInputError(
            f"group must be an integer >= 1 (target rows per source row), got {group!r}"
        )
