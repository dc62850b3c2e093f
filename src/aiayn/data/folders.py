"""A folder written whole or not at all: built beside its place, then renamed into it."""

from __future__ import annotations

import errno
import glob
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

try:  # POSIX: an output being written is held with an advisory lock (flock)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from aiayn.errors import AiaynError

# What `aiayn train` writes into a model directory besides its checkpoints.
RUN_FILES = ("recipe.yaml", "metrics.jsonl")


def output_folder(out: str | Path) -> Path:
    """``out`` made absolute with its links followed (a link's target is what is written).
    AiaynError naming ``out`` when it is empty or is (or holds) the current directory,
    which cannot be replaced; checked before anything is written or deleted."""
    if str(out) == "":
        raise AiaynError("output folder: the path is empty")
    path = Path(out).resolve()
    cwd = Path.cwd().resolve()
    if path == cwd or path in cwd.parents:
        raise AiaynError(f"{out}: holds the current directory; choose another folder")
    return path


def replaceable_folder(out: str | Path, model_dir: str | Path) -> Path:
    """:func:`output_folder` of ``out``, also refused when it is or holds ``model_dir``, or
    holds a training run (checkpoints, recipe, metrics): replacing it would delete them."""
    path = output_folder(out)
    model_root = Path(model_dir).resolve()
    if path == model_root or path in model_root.parents:
        raise AiaynError(f"{out}: holds the model itself; choose another folder")
    if path.is_dir() and (
        any(path.glob("checkpoint*.pt")) or any((path / name).exists() for name in RUN_FILES)
    ):
        raise AiaynError(f"{out}: holds a training run (checkpoints, recipe); choose another")
    return path


STAGED = ".tmp"  # the suffix of a folder being staged beside its output
MOVED = ".old"  # the suffix of an earlier output a replacing swap moved aside (_swap)
LOCKED = ".lock"  # the suffix of an output's lock file, beside it (see held_output)
# Errors that only a write meets (a full disk or quota, a read-only file system, a file
# too large), so they name the output whatever raised them.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}


@contextmanager
def staged_folder(
    out: str | Path, replace: bool = False, what: str = "", ours: Collection[str] = ()
) -> Iterator[Path]:
    """Yield a new empty folder ``.{name}.*.tmp`` beside ``out`` (beside a link's target),
    renamed to ``out`` when the block ends, with a new folder's permissions. An exception
    in the block removes it and leaves ``out`` as it was.

    An existing ``out`` is replaced when ``replace`` (the caller checked that it is an
    earlier output of its kind; it is moved aside until the new one is in place), unless
    it holds a name that neither the new one nor any output of its kind (``ours``) has (a
    README or .git beside an export: AiaynError naming them, and nothing changes);
    otherwise it must be an empty folder.
    Raises AiaynError naming ``out`` when it is the current directory (see
    :func:`output_folder`) or no folder can be created where it goes, and for an error
    only a write meets (a full disk) inside the block: "``out``: cannot write ``what``".
    """
    target = output_folder(out)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=STAGED, dir=target.parent))
    except OSError as e:
        raise AiaynError(f"{out}: cannot create ({_why(target, e)})") from None
    try:
        yield tmp
        tmp.chmod(0o777 & ~umask())  # mkdtemp's folders are private (0700)
        if not target.exists():
            tmp.rename(target)
        elif not replace:
            target.rmdir()  # fails unless empty: nothing in it is lost
            tmp.rename(target)
        else:
            if kept := sorted(set(os.listdir(target)) - set(os.listdir(tmp)) - set(ours)):
                more = f" and {len(kept) - 3} more" if len(kept) > 3 else ""
                raise AiaynError(
                    f"{out}: holds {', '.join(kept[:3])}{more}, which this output does not "
                    "write and replacing the folder would delete; move them away first"
                )
            _swap(tmp, target)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        # Named as the output, not as the staging folder just deleted: a full disk is one
        # line, whichever writer (ours, ctranslate2's) met it.
        where = os.fsdecode(e.filename) if isinstance(e, OSError) and e.filename else None
        mine = where is None or where.startswith((str(tmp), str(target)))  # not /dev/shm's
        if isinstance(e, OSError) and e.errno in WRITE_ERRNOS and mine:
            named = f"{out}: cannot write {what}".rstrip()
            raise AiaynError(f"{named} ({_why(target, e)})") from None
        if isinstance(e, AiaynError) and str(tmp) in str(e):
            e.args = (str(e).replace(str(tmp), str(out)),)
        raise


@contextmanager
def held_output(out: str | Path, busy: str) -> Iterator[None]:
    """Hold ``out`` for the block, so that no other process writing it runs at the same
    time: :func:`held_lock` on ``.{name}.lock`` beside it (beside a link's target).
    AiaynError(``busy``) at once when another process holds it. AiaynError naming ``out``
    when no folder can be made where it goes (see :func:`staged_folder`)."""
    target = output_folder(out)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AiaynError(f"{out}: cannot create ({_why(target, e)})") from None

    def refuse() -> None:
        raise AiaynError(busy) from None

    with held_lock(target.parent / f".{target.name}{LOCKED}", refuse):
        yield


def busy(out: str | Path) -> str:
    """What :func:`held_output` says of an output folder that another process is writing."""
    return f"{out}: another aiayn process is writing it; let it finish, or choose another folder"


def wait_saying(message: str, log: Callable[[str], None] | None) -> Callable[[], None]:
    """An ``on_busy`` for :func:`held_lock` that waits for the holder, saying ``message``
    through ``log`` the first time."""
    said = False

    def wait() -> None:
        nonlocal said
        if log is not None and not said:
            log(message)
        said = True

    return wait


@contextmanager
def held_lock(lock: Path, on_busy: Callable[[], None]) -> Iterator[None]:
    """Hold an flock on the file ``lock`` for the block: made if missing and removed when
    the block ends, however it ends. When another process holds it, ``on_busy()`` is
    called: it raises to give up, or returns to wait until the holder lets go. One a killed
    holder left is taken (its lock died with it). Where the file system offers no flock, or
    the lock file cannot be made, the block runs unheld (writing the output then names the
    real problem)."""
    fd = _take(lock, on_busy) if fcntl is not None else None
    try:
        yield
    finally:
        if fd is not None:
            lock.unlink(missing_ok=True)  # before closing: no one else holds this file now
            os.close(fd)


def _take(lock: Path, on_busy: Callable[[], None]) -> int | None:
    """An open descriptor holding the flock on the file ``lock`` (None where there can be
    none), taken at once or, when ``on_busy()`` returns rather than raises, once another
    process holding it lets go."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                on_busy()
                fcntl.flock(fd, fcntl.LOCK_EX)  # waits; an interrupt ends the wait
            except BaseException:
                os.close(fd)
                raise
        except OSError:  # a file system without flock (ENOLCK, EOPNOTSUPP)
            os.close(fd)
            return None
        # Its holder removes the file before letting go (above); if that happened between
        # our open and our flock (or while we waited), ours is a lock on a file no one else
        # will open: again.
        try:
            named, held = os.stat(lock), os.fstat(fd)
            if (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def staged_leftovers(out: str | Path, suffix: str = STAGED) -> list[Path]:
    """The folders :func:`staged_folder` made for ``out`` that are still there: left by a
    process that was killed, or in use by one running (unless the caller holds ``out``:
    :func:`held_output`, which every writer that stages it takes). Only ``out``'s own names
    (``.{name}.`` and mkdtemp's 8 characters), not those of another output whose name
    starts with this one (``data.v2`` beside ``data``). ``suffix`` :data:`MOVED`: the
    earlier outputs that a replacing swap moved aside."""
    out = Path(out)
    own = re.compile(rf"\.{re.escape(out.name)}\.[a-z0-9_]{{8}}{re.escape(suffix)}")
    return [
        p for p in out.parent.glob(f".{glob.escape(out.name)}.*{suffix}") if own.fullmatch(p.name)
    ]


def clear_leftovers(out: str | Path) -> None:
    """For a writer holding ``out`` (:func:`held_output`): what killed writers left beside
    it. An earlier ``out`` that a replacing swap had moved aside is put back where ``out``
    is gone (a kill between the swap's two renames then loses no output); staged folders
    and the other moved-aside ones are deleted."""
    target = output_folder(out)
    aside = sorted(staged_leftovers(target, MOVED), key=lambda p: p.stat().st_mtime_ns)
    if aside and not os.path.lexists(target):
        aside.pop().rename(target)
    for leftover in staged_leftovers(target) + aside:
        shutil.rmtree(leftover, ignore_errors=True)


def _swap(new: Path, target: Path) -> None:
    """Put ``new`` in the place of the folder ``target``; the old one is deleted only once
    the new one is in place, and put back if that fails."""
    old = new.with_suffix(MOVED)
    target.rename(old)
    try:
        new.rename(target)
    except BaseException:
        old.rename(target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _why(target: Path, error: OSError) -> str:
    """Why a folder cannot be created at ``target``: a file in the way, or the OS's reason."""
    if isinstance(error, (FileExistsError, NotADirectoryError)):
        for parent in target.parents:
            if parent.exists() and not parent.is_dir():
                return f"{parent} is not a directory"
    return str(error.strerror or error)


def check_writable(folder: str | Path, name: str | None = None) -> None:
    """AiaynError unless a file can be made in ``folder`` (it is made and removed): a
    read-only folder shows before the work that would be saved there, not after it. The
    error names ``name`` (what would be written there), else the folder."""
    try:
        fd, probe = tempfile.mkstemp(".tmp", ".aiayn-probe.", folder)
    except OSError as e:
        where = f"{name}: cannot write in {folder}" if name else f"{folder}: cannot write in it"
        raise AiaynError(f"{where} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


def replace_file(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` (a link's target) whole or not at all: ``write`` fills a temp file in
    its folder, which then replaces it with the old file's permissions, so a full disk or
    a failed ``write`` leaves the old file as it was. An OSError is raised as it comes."""
    target = Path(os.path.realpath(path))
    fd, tmp = tempfile.mkstemp(".tmp", f".{target.name}.", target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, file_mode(target))
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)  # gone already when renamed


def file_mode(path: str | Path) -> int:
    """The permission bits for a file written over ``path`` (as a temp file renamed over
    it, which mkstemp makes private): the old file's, else what the umask gives a new one."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return new_file_mode()


def new_file_mode() -> int:
    """The permission bits a new file gets (open() gives them; mkstemp and safetensors
    make theirs private)."""
    return 0o666 & ~umask()


def umask() -> int:
    """This process's umask (what new files and folders are stripped of): from /proc where
    Linux shows it, else set and set back, the only way to read it, which for a moment
    gives another thread's new file (a training run's logs, say) 022 instead."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
