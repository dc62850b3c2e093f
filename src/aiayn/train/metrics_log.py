"""The training run's log: metrics.jsonl, one JSON object per line, and TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path


class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl, and mirrors scalars to
    TensorBoard when the ``tensorboard`` package is installed."""

    def __init__(self, out_dir: Path, tensorboard: bool = True, enabled: bool = True):
        self.enabled = enabled  # False on every rank but 0 of a distributed run: no file
        if not enabled:
            return
        self.file = (out_dir / "metrics.jsonl").open("a", encoding="utf-8")
        self.flushed_train = False
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError:  # optional dependency
                self.tb = None

    def write(self, kind: str, step: int, **values: float | str) -> None:
        """One line of ``kind`` at ``step``; the numbers among ``values`` also go to
        TensorBoard (strings are for what JSON cannot hold, such as a NaN loss)."""
        if not self.enabled:
            return
        self.file.write(json.dumps({"kind": kind, "step": step, **values}) + "\n")
        # Current for `tail -f` without a flush per update: the first update shows at once.
        if kind != "train" or not self.flushed_train:
            self.file.flush()
            self.flushed_train = self.flushed_train or kind == "train"
        if self.tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self.tb.add_scalar(f"{kind}/{key}", value, step)

    def flush(self) -> None:
        """Put every line written so far on disk (before a checkpoint: a run resumed from
        it after a kill then has the log of every step up to it)."""
        if self.enabled:
            self.file.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self.file.close()
        if self.tb is not None:
            self.tb.close()
