"""The downloader against a mirror on the loopback address (never the network): a file
arrives whole and checked; a second call downloads nothing; a checksum mismatch, a 404, a
connection dropped mid-file, a server that stalls and a cache folder that cannot be
written each give one clear DownloadError, leave no half-written file where the finished
one belongs and lose nothing already there; a broken transfer resumes with a Range
request, or starts again when the server cannot send ranges; two processes fetching one
file at once download it once (the second waits), and never write it once it is done."""

from __future__ import annotations

import gzip
import hashlib
import os
import threading
import time

import pytest

from aiayn.data.download import fetch
from aiayn.errors import DownloadError
from mirror_util import Mirror

BODY = bytes(range(256)) * 1000  # 256 kB, several chunks
SHA = hashlib.sha256(BODY).hexdigest()


@pytest.fixture
def mirror():
    with Mirror({"data/a.bin": BODY, "data/b.bin": b"bee\n"}).running() as m:
        yield m


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir())


def test_a_file_arrives_checked_and_a_second_call_downloads_nothing(mirror, tmp_path):
    dest = tmp_path / "cache" / "a.bin"
    assert fetch(mirror.url + "data/a.bin", dest, SHA, show_progress=False) is True
    assert dest.read_bytes() == BODY and leftovers(dest.parent) == ["a.bin"]
    assert fetch(mirror.url + "data/a.bin", dest, SHA, show_progress=False) is False
    assert mirror.downloads("data/a.bin") == 1


def test_a_checksum_mismatch_deletes_the_download(mirror, tmp_path):
    dest = tmp_path / "a.bin"
    with pytest.raises(DownloadError) as e:
        fetch(mirror.url + "data/a.bin", dest, "0" * 64, show_progress=False)
    message = str(e.value)
    assert "data/a.bin" in message and SHA in message and "0" * 64 in message
    assert f"place it at {dest}" in message and "\n" not in message
    assert leftovers(tmp_path) == []


def test_a_404_names_the_url_and_how_to_place_the_file_by_hand(mirror, tmp_path):
    (tmp_path / "kept.bin").write_bytes(b"earlier")  # nothing already there is lost
    with pytest.raises(DownloadError, match=r"data/none\.bin: HTTP 404 .*place it at"):
        fetch(mirror.url + "data/none.bin", tmp_path / "none.bin", show_progress=False)
    assert leftovers(tmp_path) == ["kept.bin"]
    assert (tmp_path / "kept.bin").read_bytes() == b"earlier"


def test_a_dropped_connection_keeps_the_part_and_the_next_call_resumes_it(mirror, tmp_path):
    dest, url = tmp_path / "a.bin", mirror.url + "data/a.bin"
    mirror.drop.add("data/a.bin")
    with pytest.raises(DownloadError, match=r"data/a\.bin: the (transfer broke off|server clo)"):
        fetch(url, dest, SHA, show_progress=False)
    part = tmp_path / "a.bin.part"
    assert not dest.exists() and part.stat().st_size == len(BODY) // 2
    mirror.drop.clear()
    assert fetch(url, dest, SHA, show_progress=False) is True
    assert dest.read_bytes() == BODY and leftovers(tmp_path) == ["a.bin"]
    assert mirror.requests[-1] == ("data/a.bin", f"bytes={len(BODY) // 2}-")  # the rest only


def test_an_unpinned_gzip_cut_short_without_a_length_is_kept_to_resume(mirror, tmp_path):
    """No Content-Length and a close half-way: the response looks complete. A gzip file
    without a checksum is checked whole instead (it was renamed into place and its
    SHA-256 recorded as good); the part is kept and the next call resumes it. A page that
    is no gzip at all (a proxy's) is deleted."""
    body = gzip.compress(os.urandom(200_000))  # incompressible: several chunks
    mirror.files.update({"data/c.tgz": body, "data/page.gz": b"<html>proxy</html>"})
    mirror.no_length.update({"data/c.tgz", "data/page.gz"})
    mirror.drop.add("data/c.tgz")
    dest, url = tmp_path / "c.tgz", mirror.url + "data/c.tgz"
    with pytest.raises(DownloadError, match=r"data/c\.tgz: the download ends before its gzip"):
        fetch(url, dest, show_progress=False)
    part = tmp_path / "c.tgz.part"
    assert not dest.exists() and part.stat().st_size == len(body) // 2
    mirror.drop.clear()
    assert fetch(url, dest, show_progress=False) is True
    assert dest.read_bytes() == body and leftovers(tmp_path) == ["c.tgz"]
    assert mirror.requests[-1] == ("data/c.tgz", f"bytes={len(body) // 2}-")
    with pytest.raises(DownloadError, match=r"data/page\.gz: not gzip data .*was deleted"):
        fetch(mirror.url + "data/page.gz", tmp_path / "page.gz", show_progress=False)
    assert leftovers(tmp_path) == ["c.tgz"]


def test_a_server_that_cannot_resume_sends_the_whole_file_again(mirror, tmp_path):
    dest, url = tmp_path / "a.bin", mirror.url + "data/a.bin"
    (tmp_path / "a.bin.part").write_bytes(BODY[:1000])
    mirror.no_range.add("data/a.bin")
    assert fetch(url, dest, SHA, show_progress=False) is True
    assert dest.read_bytes() == BODY  # not the part followed by the whole file
    # a part longer than the file (416): started again too
    (tmp_path / "b.bin.part").write_bytes(b"a stale part, longer than the file")
    assert fetch(mirror.url + "data/b.bin", tmp_path / "b.bin", show_progress=False) is True
    assert (tmp_path / "b.bin").read_bytes() == b"bee\n"


def test_a_whole_part_is_checked_and_kept_not_fetched_again(mirror, tmp_path):
    """A stop after the last byte, before the checksum and the rename (a Ctrl-C while a
    large archive is hashed), leaves the whole file as the part: the server answers its
    range with 416 and the file's size, and the part is checked and kept as it is."""
    dest, url = tmp_path / "a.bin", mirror.url + "data/a.bin"
    (tmp_path / "a.bin.part").write_bytes(BODY)
    assert fetch(url, dest, SHA, show_progress=False) is True
    assert dest.read_bytes() == BODY and leftovers(tmp_path) == ["a.bin"]
    assert mirror.requests == [("data/a.bin", f"bytes={len(BODY)}-")]
    # a part of the right size but other bytes: the checksum deletes it, nothing is kept
    (tmp_path / "c.bin.part").write_bytes(bytes(len(BODY)))
    mirror.files["data/c.bin"] = BODY
    with pytest.raises(DownloadError, match=r"SHA-256 .* the download was deleted"):
        fetch(mirror.url + "data/c.bin", tmp_path / "c.bin", SHA, show_progress=False)
    assert leftovers(tmp_path) == ["a.bin"]


def test_a_server_that_sends_another_range_than_asked_is_not_appended(mirror, tmp_path):
    """A 206 whose Content-Range does not start at the part's end would make a file of the
    part followed by other bytes: taken as whole where no checksum is pinned."""
    dest, url = tmp_path / "a.bin", mirror.url + "data/a.bin"
    (tmp_path / "a.bin.part").write_bytes(BODY[:1000])
    mirror.wrong_range.add("data/a.bin")
    assert fetch(url, dest, None, show_progress=False) is True
    assert dest.read_bytes() == BODY and leftovers(tmp_path) == ["a.bin"]
    assert mirror.requests[-1] == ("data/a.bin", None)  # started again without a Range


def test_a_folder_where_the_file_goes_is_named_before_downloading(mirror, tmp_path):
    (tmp_path / "a.bin").mkdir()
    with pytest.raises(DownloadError, match=r"a\.bin: is in the way of the download"):
        fetch(mirror.url + "data/a.bin", tmp_path / "a.bin", SHA, show_progress=False)
    assert leftovers(tmp_path) == ["a.bin"] and mirror.requests == []


def test_a_stalled_server_times_out(mirror, tmp_path):
    mirror.stall.add("data/a.bin")
    with pytest.raises(DownloadError, match=r"data/a\.bin: .*timed out"):
        fetch(mirror.url + "data/a.bin", tmp_path / "a.bin", SHA, timeout=0.5, show_progress=False)
    assert leftovers(tmp_path) == []


def test_a_stall_mid_file_keeps_every_byte_that_arrived_and_says_how_many(mirror, tmp_path):
    """read(CHUNK) waited for a whole chunk: at the timeout it dropped what it had gathered
    (65536 of 128000 bytes kept, and a file smaller than a chunk kept nothing) yet said
    "after 0 bytes ... the part is kept" of a part it had deleted."""
    dest, url = tmp_path / "a.bin", mirror.url + "data/a.bin"
    mirror.hold.add("data/a.bin")  # half of the file, then silence
    with pytest.raises(DownloadError) as e:
        fetch(url, dest, SHA, timeout=0.5, show_progress=False)
    half, part = len(BODY) // 2, tmp_path / "a.bin.part"
    assert f"broke off after {half} bytes (timed out); the part is kept in {part}" in str(e.value)
    assert part.read_bytes() == BODY[:half]
    mirror.hold.clear()
    assert fetch(url, dest, SHA, show_progress=False) is True
    assert dest.read_bytes() == BODY and mirror.requests[-1] == ("data/a.bin", f"bytes={half}-")
    mirror.files["data/one.bin"] = b"1"  # half of it is nothing: the headers, then silence
    mirror.hold.add("data/one.bin")
    with pytest.raises(DownloadError) as e:
        fetch(mirror.url + "data/one.bin", tmp_path / "one.bin", timeout=0.5, show_progress=False)
    assert "broke off after 0 bytes (timed out). Offline" in str(e.value), str(e.value)
    assert leftovers(tmp_path) == ["a.bin"]  # no empty part, and none claimed


def test_an_empty_file_is_refused_without_a_checksum_too(mirror, tmp_path):
    """With no checksum pinned (recorded on first use), a server's empty 200 was renamed
    into place as the finished file: gzip reads an empty file as empty data."""
    for name in ("empty.gz", "empty.tar"):
        mirror.files[f"data/{name}"] = b""
        with pytest.raises(DownloadError, match=f"data/{name}: the server sent an empty file"):
            fetch(mirror.url + f"data/{name}", tmp_path / name, None, show_progress=False)
    assert leftovers(tmp_path) == []
    nothing = hashlib.sha256(b"").hexdigest()  # pinned: the checksum says what it is
    assert fetch(mirror.url + "data/empty.gz", tmp_path / "e.gz", nothing, show_progress=False)
    assert (tmp_path / "e.gz").read_bytes() == b""


def test_a_cache_folder_that_cannot_be_written(mirror, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    with pytest.raises(DownloadError, match=r"not-a-folder/multi30k: cannot create the cache"):
        fetch(mirror.url + "data/b.bin", blocker / "multi30k" / "b.bin", show_progress=False)
    assert blocker.read_text() == "a file where the cache folder should be"
    if os.geteuid() != 0:  # root writes through a read-only folder's mode bits
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        with pytest.raises(DownloadError, match=r"read-only: the cache folder cannot be written"):
            fetch(mirror.url + "data/b.bin", folder / "b.bin", show_progress=False)


@pytest.mark.parametrize("timeout", [-1.0, 0.0, float("nan"), float("inf"), 1e300])
def test_a_timeout_that_is_no_sane_number_of_seconds_is_refused_before_connecting(
    mirror, tmp_path, timeout
):
    with pytest.raises(DownloadError, match=r"timeout .*: must be a number of seconds above 0"):
        fetch(mirror.url + "data/b.bin", tmp_path / "b.bin", timeout=timeout, show_progress=False)
    assert leftovers(tmp_path) == [] and mirror.requests == []


@pytest.mark.parametrize(
    ("url", "reason"),
    [("/tmp/nomirror/b.bin", "not a URL of http"), ("http://[bad/b.bin", "Invalid IPv6 URL")],
)
def test_a_url_urllib_cannot_fetch_is_refused(tmp_path, url, reason):
    with pytest.raises(DownloadError, match=reason):
        fetch(url, tmp_path / "b.bin", show_progress=False)
    assert leftovers(tmp_path) == []


def test_any_failure_leaves_no_empty_part(mirror, tmp_path, monkeypatch):
    """Not only a DownloadError: an interrupt (or a bug) before the first byte too."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("urllib.request.urlopen", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fetch(mirror.url + "data/b.bin", tmp_path / "b.bin", show_progress=False)
    assert leftovers(tmp_path) == []


def until(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def in_thread(results, name, *args, **kwargs):
    def run():
        try:
            results[name] = fetch(*args, show_progress=False, **kwargs)
        except Exception as e:  # the test looks at it
            results[name] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_two_fetches_of_one_file_at_once_download_it_once_and_never_write_it_after(
    mirror, tmp_path
):
    """Two `aiayn train` runs of `dataset: multi30k` starting at once: both appended to
    one a.bin.part; the first renamed it when checked, and the second went on appending to
    the renamed, checked file (then failed with a traceback). Now the second waits for the
    first (an flock beside the file), then finds the file done."""
    dest, url, results = tmp_path / "a.bin", mirror.url + "data/a.bin", {}
    mirror.hold.add("data/a.bin")  # the first transfer stops half-way until resumed
    first = in_thread(results, "first", url, dest, SHA, timeout=10)
    part = tmp_path / "a.bin.part"
    until(lambda: part.exists() and part.stat().st_size > 0)
    second = in_thread(results, "second", url, dest, SHA, timeout=10)
    time.sleep(0.3)  # time for a second transfer to start, if one could
    mirror.resumed.set()
    first.join(20)
    second.join(20)
    assert results == {"first": True, "second": False}
    assert dest.read_bytes() == BODY and leftovers(tmp_path) == ["a.bin"]  # no lock file
    assert mirror.requests == [("data/a.bin", None)]


def test_the_fetch_that_waits_says_so_and_resumes_what_the_first_left(mirror, tmp_path):
    dest, url, results, said = tmp_path / "a.bin", mirror.url + "data/a.bin", {}, []
    mirror.hold.add("data/a.bin")
    first = in_thread(results, "first", url, dest, SHA, timeout=10)
    part = tmp_path / "a.bin.part"
    until(lambda: part.exists() and part.stat().st_size > 0)
    second = in_thread(results, "second", url, dest, SHA, timeout=10, log=said.append)
    until(lambda: said)
    assert said == [f"{dest}: another process is downloading it; waiting for it to finish"]
    mirror.hold.clear()
    mirror.abandon = True  # the first transfer breaks off half-way
    mirror.resumed.set()
    first.join(20)
    second.join(20)
    assert isinstance(results["first"], DownloadError) and results["second"] is True
    assert dest.read_bytes() == BODY and leftovers(tmp_path) == ["a.bin"]
    assert mirror.requests[-1] == ("data/a.bin", f"bytes={len(BODY) // 2}-")  # resumed


@pytest.mark.parametrize("length", ["abc", "-5", ""])
def test_a_length_that_is_no_number_of_bytes_is_taken_as_none(mirror, tmp_path, length):
    """http.client reads such a body to the close; it crashed (ValueError on "abc") or
    was reported cut short however whole it was ("-5"), so that every retry restarted."""
    dest = tmp_path / "a.bin"
    mirror.length["data/a.bin"] = length
    assert fetch(mirror.url + "data/a.bin", dest, SHA, show_progress=False) is True
    assert dest.read_bytes() == BODY and leftovers(tmp_path) == ["a.bin"]


def test_a_redirect_loop_is_one_line(mirror, tmp_path):
    mirror.loop.add("data/a.bin")
    with pytest.raises(DownloadError) as e:
        fetch(mirror.url + "data/a.bin", tmp_path / "a.bin", SHA, show_progress=False)
    message = str(e.value)
    assert "\n" not in message, message  # was: urllib's three lines
    assert message.startswith(mirror.url + "data/a.bin: HTTP 302 ")
    assert "infinite loop. Offline, download" in message
    assert leftovers(tmp_path) == []


def test_a_folder_where_the_part_goes_is_named_not_the_cache_folder(mirror, tmp_path):
    (tmp_path / "a.bin.part").mkdir()
    with pytest.raises(DownloadError) as e:
        fetch(mirror.url + "data/a.bin", tmp_path / "a.bin", SHA, show_progress=False)
    assert str(e.value) == (
        f"{tmp_path / 'a.bin.part'}: is in the way of the download (not a file); remove it"
    )
    assert leftovers(tmp_path) == ["a.bin.part"] and mirror.requests == []
