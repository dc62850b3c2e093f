"""A folder written whole or not at all: built beside its place, then renamed into it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aiayn.errors import AiaynError


@contextmanager
def staged_folder(out: Path, replace: bool = False) -> Iterator[Path]:
    """Yield a new empty folder ``.{name}.*.tmp`` beside ``out``, renamed to ``out`` when
    the block ends. An exception in the block removes it and leaves ``out`` as it was.

    An existing ``out`` is removed first when ``replace`` (the caller checked that it may
    go); otherwise it must be an empty folder. Raises AiaynError naming ``out`` when no
    folder can be created where it goes.
    """
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    except OSError as e:
        raise AiaynError(f"{out}: cannot create ({e.strerror or e})") from None
    try:
        yield tmp
        if out.exists():
            if replace:
                shutil.rmtree(out)
            else:
                out.rmdir()  # fails unless empty: nothing in it is lost
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
