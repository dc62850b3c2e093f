"""Downloading one file into a cache: checked, atomic and resumable.

What :func:`fetch` guarantees, whatever the network does:

- a file at ``dest`` is always whole and, when a SHA-256 is known, verified: bytes arrive
  in ``dest.part`` and are renamed to ``dest`` only after the checksum matched (without
  one, a gzip file only once its stream is whole: a server that sends no length and
  closes early would otherwise leave a cut file that looks done);
- a broken transfer (a dropped connection, a timeout) keeps ``dest.part``, and the next
  call asks the server for the rest (an HTTP Range request) or starts again when the
  server cannot resume;
- a file already at ``dest`` is not downloaded again, and never written again: one
  process at a time downloads it (an flock beside it, where the file system has flock);
  another waits, then finds it done;
- a failure leaves no empty ``dest.part`` behind (only bytes worth resuming are kept);
- every failure is one :class:`~aiayn.errors.DownloadError` naming the URL and the file,
  and saying how to place the file by hand.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import math
import os
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from aiayn.data.folders import LOCKED, held_lock, wait_saying
from aiayn.errors import DownloadError
from aiayn.progress import progress

CHUNK = 1 << 16
TIMEOUT_S = 60.0  # seconds without a byte from the server before a transfer is given up
MAX_TIMEOUT_S = 86400.0  # a day: past it the socket layer overflows, and no one waits longer
SCHEMES = ("http", "https", "ftp", "file")  # what urllib can fetch


def check_timeout(timeout: float, name: str = "timeout") -> float:
    """``timeout`` as a float when it is a number of seconds in (0, MAX_TIMEOUT_S];
    DownloadError naming ``name`` otherwise (0 would make every connection fail at once,
    NaN, infinities and huge values fail inside the socket layer)."""
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise DownloadError(
            f"{name} {timeout!r}: must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}"
        )
    return seconds


def check_url(url: str, name: str = "URL") -> str:
    """``url`` when urllib can fetch it (a scheme of SCHEMES, a host for the network
    ones); DownloadError naming ``name`` and the URL otherwise."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as e:  # "Invalid IPv6 URL", a bad port
        raise DownloadError(f"{name} {url!r}: not a URL ({e})") from None
    if parts.scheme not in SCHEMES:
        raise DownloadError(
            f"{name} {url!r}: not a URL of {', '.join(SCHEMES)} (e.g. https://host/path or "
            "file:///folder)"
        )
    if parts.scheme != "file" and not parts.hostname:
        raise DownloadError(f"{name} {url!r}: no host")
    try:
        parts.port  # noqa: B018 - raises on a port that is no number or out of range
    except ValueError as e:
        raise DownloadError(f"{name} {url!r}: not a URL ({e})") from None
    return url


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(
    url: str,
    dest: str | Path,
    sha256: str | None = None,
    timeout: float = TIMEOUT_S,
    show_progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> bool:
    """Make ``dest`` a whole copy of ``url`` (checked against ``sha256`` when given);
    returns True when bytes were downloaded, False when ``dest`` was already there.
    DownloadError on any failure, with ``dest`` untouched and a partial ``dest.part`` kept
    for the next call to resume.

    One process at a time downloads ``dest``: it holds an flock on ``.{name}.lock`` beside
    it (see :func:`~aiayn.data.folders.held_lock`). Another one waits (saying so through
    ``log``) and then finds the file done, or the part to resume when the first failed."""
    dest = Path(dest)
    timeout = check_timeout(timeout)
    check_url(url)
    if dest.is_file():
        return False
    _check_not_in_the_way(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DownloadError(
            f"{dest.parent}: cannot create the cache folder ({e.strerror}); choose another "
            "one (the AIAYN_DATA environment variable)"
        ) from None
    wait = wait_saying(f"{dest}: another process is downloading it; waiting for it to finish", log)
    with held_lock(dest.parent / f".{dest.name}{LOCKED}", wait):
        if dest.is_file():  # the process we waited for downloaded it
            return False
        _check_not_in_the_way(dest)
        _download(url, dest, sha256, timeout, show_progress)
    return True


def _check_not_in_the_way(dest: Path) -> None:
    if dest.exists() or dest.is_symlink():  # a folder or a broken link: no file goes there
        raise DownloadError(f"{dest}: is in the way of the download (not a file); remove it")


def _download(url: str, dest: Path, sha256: str | None, timeout: float, show: bool) -> None:
    """:func:`fetch`'s work, by the process that holds ``dest``."""
    part = dest.with_name(dest.name + ".part")
    try:  # opened before connecting: a folder it cannot write fails first
        out = open(part, "ab")  # noqa: SIM115 - closed by the `with out` below
    except OSError as e:
        if part.is_file():  # the part itself is the problem, not the folder
            raise DownloadError(f"{part}: cannot be written ({e.strerror}); remove it") from None
        if part.exists() or part.is_symlink():  # a folder (or a link to one, or nowhere)
            raise DownloadError(
                f"{part}: is in the way of the download (not a file); remove it"
            ) from None
        raise DownloadError(
            f"{dest.parent}: the cache folder cannot be written ({e.strerror}); make it "
            "writable or choose another one (the AIAYN_DATA environment variable)"
        ) from None
    try:
        with out:
            _transfer(url, out, timeout, show, dest)
    except BaseException:  # any failure, an interrupt too
        with contextlib.suppress(OSError):
            if part.stat().st_size == 0:  # nothing to resume: leave no empty part behind
                part.unlink()
        raise
    if sha256 is None and part.stat().st_size == 0:  # no data file is empty: it passed
        part.unlink()
        raise DownloadError(f"{url}: the server sent an empty file. {_by_hand(url, dest)}")
    if sha256 is None and dest.name.endswith((".gz", ".tgz")):
        _check_gzip(part, url, dest)
    if sha256 is not None:
        got = sha256_of(part)
        if got != sha256:
            part.unlink()
            raise DownloadError(
                f"{url}: SHA-256 {got} is not the expected {sha256} (file {dest.name}; the "
                f"download was deleted). {_by_hand(url, dest)}"
            )
    os.replace(part, dest)  # atomic: dest is whole or absent


def _transfer(url: str, out: BinaryIO, timeout: float, show_progress: bool, dest: Path) -> None:
    """Append the rest of ``url`` to ``out`` (``dest.part``, opened for appending), or all
    of it, from the start, when the server cannot send the range asked for."""
    part = Path(out.name)
    have = out.tell()
    request = urllib.request.Request(url, headers={"User-Agent": "aiayn"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:
            if _full_size(e) == have:  # whole: stopped before its check and rename
                return
            # the part is no prefix the server knows: start again
            out.seek(0)
            out.truncate()
            return _transfer(url, out, timeout, show_progress, dest)
        # urllib's own reasons can span lines ("... would lead to an infinite loop.\nThe
        # last 30x error message was:\nFound" for a redirect loop): the first says it.
        reason = (str(e.reason).strip().splitlines() or [""])[0].rstrip(".")
        raise DownloadError(f"{url}: HTTP {e.code} {reason}. {_by_hand(url, dest)}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
        reason = _reason(e)
        raise DownloadError(f"{url}: cannot connect ({reason}). {_by_hand(url, dest)}") from None
    with response:
        if have and response.status == 206 and _range_start(response) != have:
            # Another range than the one asked for (a broken server or proxy): its bytes
            # do not continue the part. Start again from the first byte.
            out.seek(0)
            out.truncate()
            return _transfer(url, out, timeout, show_progress, dest)
        if have and response.status != 206:  # the server sends the whole file again
            out.seek(0)
            out.truncate()
            have = 0
        length = _content_length(response)
        total = have + length if length is not None else None
        received = have
        try:
            with progress(
                total=total,
                initial=have,
                desc=dest.name,
                unit="B",
                unit_scale=True,
                disable=not show_progress,
            ) as bar:
                # read1: what has arrived, at most CHUNK. read(CHUNK) waited for a whole
                # chunk (the bar stood still on a slow link) and a timeout dropped the
                # bytes it had gathered.
                while block := response.read1(CHUNK):
                    out.write(block)
                    received += len(block)
                    bar.update(len(block))
        except (OSError, http.client.HTTPException) as e:
            raise DownloadError(
                f"{url}: the transfer broke off after {received} bytes ({_reason(e)})"
                f"{_resumes(received, part)}. {_by_hand(url, dest)}"
            ) from None
        finally:
            out.flush()
            os.fsync(out.fileno())
    if total is not None and received != total:
        raise DownloadError(
            f"{url}: the server closed the connection after {received} of {total} bytes"
            f"{_resumes(received, part)}. {_by_hand(url, dest)}"
        )


def _resumes(received: int, part: Path) -> str:
    """What becomes of ``part`` after a failure with ``received`` bytes in it: an empty
    one is deleted (see :func:`_download`), so only a non-empty one is said to be kept."""
    return f"; the part is kept in {part} and the next call resumes it" if received else ""


def _check_gzip(part: Path, url: str, dest: Path) -> None:
    """DownloadError unless ``part`` holds a whole gzip stream: cut short, it is kept to
    resume; not gzip at all (a proxy's or captive portal's page), it is deleted."""
    try:
        with gzip.open(part) as stream:
            while stream.read(CHUNK):
                pass
    except EOFError:
        raise DownloadError(
            f"{url}: the download ends before its gzip stream does (the server sent no "
            f"length and closed early); the part is kept in {part} and the next call "
            f"resumes it. {_by_hand(url, dest)}"
        ) from None
    except (gzip.BadGzipFile, zlib.error) as e:
        part.unlink()
        raise DownloadError(
            f"{url}: not gzip data ({e}; a proxy's page?); the download was deleted. "
            f"{_by_hand(url, dest)}"
        ) from None


def _content_length(response: http.client.HTTPResponse) -> int | None:
    """The length of the body the server declared, taken as http.client takes it (which
    then reads that many bytes): None without one, and for one that is no number of bytes
    ("abc", "-5"; http.client then reads to the close)."""
    try:
        length = int(response.headers.get("Content-Length") or "")
    except ValueError:
        return None
    return length if length >= 0 else None


def _range_start(response: http.client.HTTPResponse) -> int | None:
    """The first byte a 206 response holds, from its Content-Range; None without one."""
    match = re.fullmatch(r"\s*bytes\s+(\d+)-.*", response.headers.get("Content-Range") or "")
    return int(match[1]) if match else None


def _full_size(e: urllib.error.HTTPError) -> int | None:
    """The file's size that a 416 gives in its Content-Range (``bytes */SIZE``), if any."""
    match = re.fullmatch(r"\s*bytes\s+\*/(\d+)\s*", e.headers.get("Content-Range") or "")
    return int(match[1]) if match else None


def _reason(e: BaseException) -> str:
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(e, urllib.error.URLError) and not isinstance(e.reason, str):
        return _reason(e.reason) if isinstance(e.reason, BaseException) else str(e.reason)
    return str(e) or type(e).__name__


def _by_hand(url: str, dest: Path) -> str:
    return f"Offline, download {url} elsewhere and place it at {dest}"
