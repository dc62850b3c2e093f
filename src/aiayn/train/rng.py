"""The random streams a training run draws from: torch's (initialisation, dropout on the
CPU), CUDA's where there is CUDA, and Python's. They are process-global, so a run keeps
its own copy while anything else may draw from them: a checkpoint saves it and a resume
restores it, and a trainer puts it back before it trains (see :class:`Trainer`)."""

from __future__ import annotations

import random

import torch


def rng_state(cuda: bool) -> dict:
    """The global streams now, as a checkpoint's ``rng`` holds them: ``torch`` and
    ``python``, and with ``cuda`` (a run on a GPU) ``cuda``, every device's. A run on the
    CPU asks for none: reading them would start CUDA (a context on GPU 0) in every rank of
    a CPU run on a machine with GPUs."""
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if cuda and torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def set_rng_state(rng: dict) -> None:
    """Set the global streams to ``rng`` (from :func:`rng_state`, or a checkpoint's read
    onto any device); its CUDA states are set only where CUDA is available."""
    torch.set_rng_state(rng["torch"].cpu())  # generator states live on the CPU
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        # A checkpoint saved where there were more GPUs: the devices here take theirs.
        for device, state in enumerate(rng["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state.cpu(), device)
