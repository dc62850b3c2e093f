"""The device a model runs on, from its name: refused in one line when this machine does
not have it, before anything is loaded (re-exported by :mod:`aiayn.checkpoint`, whose
loaders use it)."""

from __future__ import annotations

import torch

from aiayn.errors import AiaynError


def named_device(name: str | torch.device) -> torch.device | None:
    """The device ``name`` names by its form alone, asking this machine nothing (a recipe
    written on a GPU machine is read on others): None for ``auto``; AiaynError for a name
    that is no device aiayn runs on."""
    if str(name) == "auto":
        return None
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise AiaynError(f"device {name!r}: not a device name (cpu, cuda, cuda:N, auto)") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise AiaynError(f"device {name}: aiayn runs on cpu or cuda")
    # cpu:0 is the CPU; torch would take cpu:1 and fail at loading
    if device.type == "cpu" and device.index:
        raise AiaynError(f"device {name}: the CPU has no index; use cpu")
    return device


def resolve_device(name: str | torch.device) -> torch.device:
    """``auto`` (a GPU if torch sees one, else the CPU), ``cpu`` (or ``cpu:0``), ``cuda``,
    ``cuda:N`` or ``mps``; AiaynError for a device this machine does not have, before
    anything is loaded."""
    device = named_device(name)
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise AiaynError(f"device {name}: this machine has no CUDA GPU that torch can use")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise AiaynError(f"device {name}: only {torch.cuda.device_count()} GPU(s) here")
    elif device.type == "cpu":
        return torch.device("cpu")
    elif not torch.backends.mps.is_available():  # mps
        raise AiaynError(f"device {name}: this machine has no MPS device that torch can use")
    return device
