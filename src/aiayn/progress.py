"""Progress for long work: a tqdm bar on a terminal, occasional plain lines elsewhere.

Written to a file or a CI log, a tqdm bar becomes thousands of carriage-return updates on
one "line". When the stream is not a terminal, :class:`PlainProgress` prints one ordinary
line every ``interval`` seconds and one when the work ends.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sized
from typing import Any, TextIO

from tqdm import tqdm

PLAIN_INTERVAL_S = 30.0


class PlainProgress:
    """The part of tqdm's interface aiayn uses (iterate, update, set_postfix, close, with),
    printing ``desc: n/total unit (p%), elapsed, postfix`` lines instead of a bar."""

    def __init__(
        self,
        iterable: Iterable | None = None,
        total: int | None = None,
        desc: str = "",
        unit: str = "it",
        initial: int = 0,
        file: TextIO | None = None,
        interval: float = PLAIN_INTERVAL_S,
    ):
        if total is None:
            total = _length(iterable)
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.n, self.file, self.interval = initial, file or sys.stderr, interval
        self.postfix = ""
        self.start = self.last = time.monotonic()
        self.closed = False

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("a PlainProgress made without an iterable is not iterable")
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self._print(now)

    def set_postfix(self, **values: Any) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._print(time.monotonic())

    def _print(self, now: float) -> None:
        count = f"{self.n}/{self.total}" if self.total else str(self.n)
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        text = f"{self.desc}: {count} {self.unit}{share}, {now - self.start:.0f} s"
        print(text + (f", {self.postfix}" if self.postfix else ""), file=self.file, flush=True)


def _length(iterable: object) -> int | None:
    # An object, not an Iterable: mypy finds no type that is both Iterable and Sized.
    return len(iterable) if isinstance(iterable, Sized) else None


def progress(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    initial: int = 0,
    disable: bool = False,
    file: TextIO | None = None,
    unit_scale: bool = False,
) -> tqdm | PlainProgress:
    """A progress bar for ``iterable`` (or ``total`` steps, advanced by ``update``): tqdm
    when ``file`` (default stderr) is a terminal, :class:`PlainProgress` otherwise, silent
    with ``disable``."""
    stream = file or sys.stderr
    if disable or _is_terminal(stream):
        return tqdm(
            iterable,
            total=total,
            desc=desc,
            unit=unit,
            initial=initial,
            disable=disable,
            file=stream,
            dynamic_ncols=True,
            unit_scale=unit_scale,  # kB, MB, ... for bytes
        )
    return PlainProgress(iterable, total, desc, unit, initial, stream)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False
