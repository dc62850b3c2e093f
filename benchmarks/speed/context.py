"""What one run is: its sizes (``Plan``) and its settings (``RunContext``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .common import BATCH_SIZE

PHASES = ("train", "translate", "growth", "memory")


@dataclass
class Plan:
    """How much of everything to run; ``--quick`` shrinks it to a smoke run."""

    max_tokens: int  # training batch budget (padded tokens per side)
    warmup_steps: int  # per peer, untimed
    rounds: int  # interleaved rounds, each peer runs ``steps_per_round`` timed steps per round
    steps_per_round: int
    profile_steps: int
    n_sentences: int  # test2016 sentences translated (0 = all)
    growth_lengths: tuple[int, ...]
    growth_batch: int
    growth_repeats: int  # fewer where one run takes long (see bench_growth)
    memory_sentences: int  # test sentences translated in each translation memory child
    train_pairs: int  # training pairs encoded (0 = all); only the batches used matter
    model_overrides: dict  # applied to the recipe's model when no checkpoint is given


FULL = Plan(
    max_tokens=3300,  # the recipe's
    warmup_steps=3,
    rounds=5,
    steps_per_round=4,
    profile_steps=3,
    n_sentences=0,
    growth_lengths=(10, 25, 50, 100, 200),
    growth_batch=8,
    growth_repeats=3,
    memory_sentences=2 * BATCH_SIZE,
    train_pairs=0,
    model_overrides={},
)
QUICK = Plan(
    max_tokens=600,
    warmup_steps=1,
    rounds=3,
    steps_per_round=1,
    profile_steps=1,
    n_sentences=100,
    growth_lengths=(10, 25, 50, 100),
    growth_batch=4,
    growth_repeats=1,
    memory_sentences=BATCH_SIZE,
    train_pairs=4000,
    model_overrides={"d_model": 128, "n_heads": 4, "n_layers": 2, "d_ff": 512},
)


def _no_log(msg: str) -> None:
    pass


@dataclass
class RunContext:
    """Everything a phase needs to know about the run, instead of the command line."""

    plan: Plan
    out: Path  # speed.json, speed.md, plot, profiles
    work: Path  # exported models, tokenizer, sample data
    device: torch.device
    threads: int = 2  # torch / CTranslate2 threads
    bf16: bool = False  # --precision bf16: autocast in training, bf16 weights in translation
    direction: str = "de-en"
    checkpoint: Path | None = None  # --checkpoint (trained model), else an untrained one
    quick: bool = False
    train_model: str = "recipe"  # "recipe", or Table 3 "base" / "big" for the training phase
    no_cudnn_attention: bool = False
    phases: tuple[str, ...] = PHASES
    log: Callable[[str], None] = field(default=_no_log, repr=False)

    @property
    def precision(self) -> str:
        """Weights for translation: bf16 under --precision bf16 (as ``aiayn translate
        --precision bf16``), for ours and Marian alike."""
        return "bf16" if self.bf16 else "fp32"

    def autocast(self):
        """bf16 autocast for training (as the trainer's precision=bf16) under --precision bf16."""
        return autocast(self.device, self.bf16)


def autocast(device: torch.device, bf16: bool):
    if bf16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
