"""The training run's log: metrics.jsonl, one JSON object per line, and TensorBoard."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from aiayn.errors import TrainingError

T = TypeVar("T")


class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl, and mirrors scalars to
    TensorBoard when the ``tensorboard`` package is installed.

    A resumed run passes ``keep``, the size the log had when its checkpoint was saved
    (:meth:`size`), the checkpoint's ``step``, and whether it is ``pending`` (saved before
    that step's validation): the lines written after that save (by a run killed before its
    next one) are cut off, and TensorBoard drops the points that the resumed run logs again
    (see :func:`purge_step`); ``keep`` :data:`UP_TO_STEP` (a checkpoint of an older aiayn,
    which did not record the size) cuts at the first line of a later step. A write that
    fails (a full disk) is a TrainingError naming the file."""

    def __init__(
        self,
        out_dir: Path,
        tensorboard: bool = True,
        enabled: bool = True,
        keep: int | None = None,
        step: int = 0,
        pending: bool = False,
    ):
        self.enabled = enabled  # False on every rank but 0 of a distributed run: no file
        if not enabled:
            return
        self.path = out_dir / "metrics.jsonl"
        self.file = self._guard(lambda: self.path.open("a", encoding="utf-8"))
        if keep == UP_TO_STEP:
            keep = self._guard(lambda: size_up_to(self.path, step))
        if keep is not None and self.file.tell() > keep:
            self._guard(lambda: self.file.truncate(keep))
        self.flushed_train = False
        self.tb = None
        self.tb_dir = out_dir / "tensorboard"
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # optional dependency
                return
            purge = {"purge_step": purge_step(step, pending)} if keep is not None else {}
            _quiet_tensorboard_threads()
            self.tb = self._tb_guard(lambda: SummaryWriter(str(self.tb_dir), **purge))
            if keep is not None and pending:
                self._log_again(step, keep)

    def _guard(self, work: Callable[[], T]) -> T:
        try:
            return work()
        except OSError as e:
            raise TrainingError(f"{self.path}: cannot write ({e.strerror or e})") from None

    def _tb_guard(self, work: Callable[[], T]) -> T:
        """``work()``; TrainingError naming the TensorBoard folder if it fails: its writer
        thread's error (a full disk, a folder that cannot be written) comes back at the
        next call, of any type."""
        try:
            return work()
        except Exception as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else e
            raise TrainingError(f"{self.tb_dir}: cannot write ({why})") from None

    def write(self, kind: str, step: int, **values: float | str) -> None:
        """One line of ``kind`` at ``step``; the numbers among ``values`` also go to
        TensorBoard. A number that is not finite is written as a string ("nan"), as JSON
        has no NaN or infinity."""
        if not self.enabled:
            return
        text = {
            k: str(v) if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in values.items()
        }
        self._guard(
            lambda: self.file.write(json.dumps({"kind": kind, "step": step, **text}) + "\n")
        )
        # Current for `tail -f` without a flush per update: the first update shows at once.
        if kind != "train" or not self.flushed_train:
            self._guard(self.file.flush)
            self.flushed_train = self.flushed_train or kind == "train"
        if self.tb is not None:
            scalars = {k: v for k, v in values.items() if isinstance(v, (int, float))}
            self._tb_guard(lambda: self._add_scalars(kind, step, scalars))

    def _add_scalars(self, kind: str, step: int, scalars: dict[str, float]) -> None:
        assert self.tb is not None
        for key, value in scalars.items():
            self.tb.add_scalar(f"{kind}/{key}", value, step)

    def _log_again(self, step: int, size: int) -> None:
        """Give TensorBoard again the points of ``step`` other than its validation, read
        from the end of the log's first ``size`` bytes (up to the checkpoint): purged from
        ``step`` on, TensorBoard drops them too, and the resumed run does not log them
        again (its update is done)."""
        with self._guard(lambda: self.path.open("rb")) as f:
            start = max(0, size - (1 << 16))  # a step's lines end the log: the last ones
            self._guard(lambda: f.seek(start))
            lines = self._guard(lambda: f.read(size - start)).splitlines()
        points: list[tuple[str, dict[str, float]]] = []
        for line in lines[1:] if start else lines:  # the first may be cut: not read
            try:
                record = json.loads(line)
            except ValueError:
                continue
            kind = record.get("kind") if isinstance(record, dict) else None
            if isinstance(kind, str) and kind != "valid" and record.get("step") == step:
                numbers = {k: v for k, v in record.items() if isinstance(v, (int, float))}
                points.append((kind, {k: v for k, v in numbers.items() if k != "step"}))

        def add() -> None:
            for kind, numbers in points:
                self._add_scalars(kind, step, numbers)

        self._tb_guard(add)

    def size(self) -> int:
        """Put every line written so far on disk and return the log's size in bytes
        (before a checkpoint: a run resumed from it after a kill then has the log of
        every step up to it, and no more: see ``keep``)."""
        if not self.enabled:
            return 0
        self._guard(self.file.flush)
        return self.file.tell()

    def close(self) -> None:
        if not self.enabled:
            return
        self._guard(self.file.close)  # flushes: a full disk fails here too
        if self.tb is not None:
            self._tb_guard(self.tb.close)


def _quiet_tensorboard_threads() -> None:
    """Leave unprinted the traceback of TensorBoard's writer thread when a write fails (a
    full disk): the same error comes back at the writer's next call in the training
    thread, which names the folder in one line (:meth:`MetricsLog._tb_guard`)."""
    previous = threading.excepthook
    if getattr(previous, "quiet_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__name__ != "_AsyncWriterThread":
            previous(args)

    hook.quiet_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


# ``keep`` for a checkpoint that did not record the log's size (older aiayn).
UP_TO_STEP = -1


def size_up_to(path: Path, step: int) -> int:
    """The bytes of the log at ``path`` before its first line of a step after ``step``
    (its whole size if none): what a checkpoint of ``step`` that did not record the size
    would have recorded, lines that are not JSON records kept."""
    offset = 0
    with path.open("rb") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            later = record.get("step") if isinstance(record, dict) else None
            if isinstance(later, int) and later > step:
                return offset
            offset += len(line)
    return offset


def purge_step(step: int, pending: bool) -> int:
    """The first step whose TensorBoard points a run resumed from a checkpoint of ``step``
    drops: the next one, since it logs the later updates again; ``step`` itself when the
    checkpoint is ``pending``, since it logs that step's validation again too."""
    return step if pending else step + 1
