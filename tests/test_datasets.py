"""`aiayn data get` / `data list` and recipes that name their data, against a mirror on
the loopback address: Multi30k (the real files when ../shared/data/multi30k is there, with
the checksums pinned in the code; else small files the test makes, with their checksums
put in place of the pinned ones), then `aiayn train --config recipes/multi30k.yaml` from
the cache with no path given, or fetching what the cache lacks; WMT14 en-de from small
archives of statmt.org's layout: extracted into aligned plain text, checksums pinned or
recorded on first use."""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import gzip
import hashlib
import io
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest

from aiayn.checkpoint import LAST, load_checkpoint
from aiayn.cli import main
from aiayn.data import datasets, wmt
from aiayn.data.corpus import read_lines
from aiayn.errors import DownloadError
from cli_util import one_line_error
from mirror_util import Mirror
from sample_data import PAIRS, multi30k_dir

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.multi30k  # also run with the data hidden (.ci/run)
TINY = [
    "model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64",
    "vocab_size=300", "max_steps=2", "time_limit_minutes=0", "save_every_minutes=0",
    "threads=1", "warmup=2", "max_tokens=2000",
]  # fmt: skip


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("AIAYN_DATA", str(folder))
    return folder


def gz(lines: list[str]) -> bytes:
    return gzip.compress("".join(f"{line}\n" for line in lines).encode(), mtime=0)


@pytest.fixture
def multi30k(monkeypatch) -> dict[str, bytes]:
    """Upstream path -> bytes of the Multi30k files the mirror serves: the real de and en
    train/val/test2016 files when they are here (checked against the pinned checksums),
    else every file of Task 1 made from the built-in pairs, whose checksums replace the
    pinned ones for the test."""
    data, upstream = multi30k_dir(), datasets.MULTI30K_SPLITS
    if data is not None:
        return {
            f"data/task1/raw/{upstream[split]}.{lang}.gz": (
                data / f"{split}.{lang}.gz"
            ).read_bytes()
            for split in ("train", "val", "test2016")
            for lang in ("de", "en")
        }
    made, sources = {}, []
    for source in datasets.DATASETS["multi30k"].sources:
        side = {"en": 1}.get(source.lang, 0)  # cs and fr: German text, marked
        lines = [p[side] if source.lang in ("de", "en") else f"{p[side]} ({source.lang})"
                 for p in PAIRS]  # fmt: skip
        split = {"train": slice(0, 50), "val": slice(50, 60)}.get(source.split, slice(60, 70))
        made[source.path] = gz(lines[split])
        sha = hashlib.sha256(made[source.path]).hexdigest()
        sources.append(dataclasses.replace(source, sha256=sha))
    patched = dataclasses.replace(datasets.DATASETS["multi30k"], sources=tuple(sources))
    monkeypatch.setitem(datasets.DATASETS, "multi30k", patched)
    return made


def test_get_fills_the_cache_and_train_starts_from_it(multi30k, cache, tmp_path, capsys):
    with Mirror(multi30k).running() as mirror:
        argv = ["data", "get", "multi30k", "--pair", "de-en", "--mirror", mirror.url]
        argv += ["--split", "train", "--split", "val", "--split", "test2016", "--no-progress"]
        assert main(argv) == 0
        assert "6 file(s) downloaded" in capsys.readouterr().out
        folder = cache / "multi30k"
        upstream = datasets.MULTI30K_SPLITS
        for split in ("train", "val", "test2016"):  # byte for byte, under the local names
            for lang in ("de", "en"):
                body = multi30k[f"data/task1/raw/{upstream[split]}.{lang}.gz"]
                assert (folder / f"{split}.{lang}.gz").read_bytes() == body
        assert not list(folder.glob("*.part"))
        assert main([*argv]) == 0  # a second call downloads nothing
        assert "0 file(s) downloaded, 6 already there" in capsys.readouterr().out
        assert len(mirror.requests) == 6
        assert main(["data", "list"]) == 0
        listing = capsys.readouterr().out
        assert f"cache: {cache}" in listing and "multi30k     6 of " in listing
    # the mirror is gone: the recipe reads the cache, and names no path
    out = tmp_path / "run"
    argv = ["train", "--config", str(ROOT / "recipes" / "multi30k.yaml"), "--out", str(out)]
    assert main([*argv, "--no-progress", "--set", *TINY]) == 0
    assert load_checkpoint(out / LAST)["step"] == 2
    saved = (out / "recipe.yaml").read_text()
    assert f"train_src: {cache / 'multi30k' / 'train.de.gz'}" in saved


def test_a_recipe_fetches_what_the_cache_lacks(multi30k, cache, tmp_path, monkeypatch):
    with Mirror(multi30k).running() as mirror:
        monkeypatch.setenv("AIAYN_MIRROR", mirror.url)
        out = tmp_path / "run"
        argv = ["train", "--config", str(ROOT / "recipes" / "multi30k.yaml"), "--out", str(out)]
        assert main([*argv, "--no-progress", "--set", *TINY, "dataset=multi30k/en-de"]) == 0
        fetched = {Path(p).name for p, _ in mirror.requests}
    # Only what training reads: a test set in the recipe's data set was fetched too, so
    # training offline from a cache of train and val failed on the test set's download.
    assert fetched == {f"{s}.{lang}.gz" for s in ("train", "val") for lang in ("de", "en")}
    state = load_checkpoint(out / LAST)
    assert state["step"] == 2
    en = read_lines(cache / "multi30k" / "train.en.gz")
    assert (out / "recipe.yaml").read_text().count("multi30k/en-de") == 1
    assert len(en) in (50, 29000)


def test_offline_the_error_is_one_line_and_names_the_file(cache, capsys):
    argv = ["data", "get", "multi30k", "--pair", "de-en", "--split", "val", "--no-progress"]
    assert main([*argv, "--mirror", "http://127.0.0.1:9/", "--timeout", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "http://127.0.0.1:9/data/task1/raw/val.de.gz: cannot connect" in err
    assert f"place it at {cache / 'multi30k' / 'val.de.gz'}" in err
    assert not (cache / "multi30k" / "val.de.gz").exists()


def test_unknown_names_pairs_and_splits_are_refused(cache):
    with pytest.raises(DownloadError, match="data set 'wmt15': unknown; known: multi30k"):
        datasets.get("wmt15")
    with pytest.raises(DownloadError, match="'multi30k/de-xx': not a pair of multi30k"):
        datasets.pair_files("multi30k/de-xx")
    with pytest.raises(DownloadError, match="multi30k: no split test2099"):
        datasets.get("multi30k", splits=["test2099"])
    with pytest.raises(DownloadError, match="multi30k: no language xx; it has cs, de, en, fr"):
        datasets.get("multi30k", langs=["de", "xx"])  # was: the German files alone
    with pytest.raises(DownloadError, match="wmt14-en-de: comes whole; it has no languages"):
        datasets.get("wmt14-en-de", splits=["train"])
    assert not (cache / "wmt14-en-de").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("multi30k/de", "'multi30k/de': not a pair of multi30k (languages cs, de, en, fr)"),
        ("multi30k/", "'multi30k/': not a pair of multi30k"),  # was: the default pair
        ("multi30k/de-en-fr", "'multi30k/de-en-fr': not a pair of multi30k"),
        ("multi30k/en-en", "'multi30k/en-en': not a pair of multi30k"),
        ("/de-en", "data set '/de-en': unknown; known: multi30k, wmt14-en-de"),
        ("wmt15/de-en", "data set 'wmt15/de-en': unknown; known: multi30k"),
    ],
)
def test_a_malformed_data_set_in_a_recipe_is_one_line_before_any_download(
    cache, tmp_path, monkeypatch, capsys, spec, message
):
    """`--set dataset=multi30k/de` crashed with a ValueError (a direction of one language)."""
    with Mirror({}).running() as mirror:
        monkeypatch.setenv("AIAYN_MIRROR", mirror.url)
        config = str(ROOT / "recipes" / "multi30k.yaml")
        argv = ["train", "--config", config, "--out", str(tmp_path / "run"), "--no-progress"]
        err = one_line_error([*argv, "--set", *TINY, f"dataset={spec}"], capsys)
        assert message in err and mirror.requests == []


def tgz(members: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def sgm(lines: list[str]) -> str:
    segs = "".join(f'<seg id="{i + 1}"> {line} </seg>\n' for i, line in enumerate(lines))
    return f'<srcset setid="newstest2014">\n<doc docid="x">\n{segs}</doc>\n</srcset>\n'


def wmt14_stand_in(monkeypatch) -> dict[str, bytes]:
    """Upstream path -> bytes of small archives in statmt's layout, made from the built-in
    pairs (train 0-50, newstest2013 50-60, newstest2014 60-); their checksums replace the
    three pinned ones for the test."""
    de, en = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    side = {"de": de, "en": en}

    def text(lang: str, a: int, b: int) -> str:
        return "".join(f"{line}\n" for line in side[lang][a:b])

    archives = {
        "wmt13/training-parallel-europarl-v7.tgz": tgz(
            {f"training/europarl-v7.de-en.{lang}": text(lang, 0, 20) for lang in side}
            | {"training/europarl-v7.fr-en.fr": "autre\n"}
        ),
        "wmt13/training-parallel-commoncrawl.tgz": tgz(
            {f"commoncrawl.de-en.{lang}": text(lang, 20, 35) for lang in side}
        ),
        "wmt14/training-parallel-nc-v9.tgz": tgz(
            {f"training/news-commentary-v9.de-en.{lang}": text(lang, 35, 50) for lang in side}
        ),
        "wmt14/dev.tgz": tgz({f"dev/newstest2013.{lang}": text(lang, 50, 60) for lang in side}),
        "wmt14/test-full.tgz": tgz({
            "test-full/newstest2014-deen-src.en.sgm": sgm(en[60:]),
            "test-full/newstest2014-deen-ref.de.sgm": sgm(de[60:]),
        }),
    }  # fmt: skip
    data = datasets.DATASETS["wmt14-en-de"]
    pinned = [s for s in data.sources if s.sha256 is not None]
    assert len(pinned) == 3  # the training archives; dev and test are recorded on first use
    sources = tuple(
        dataclasses.replace(s, sha256=hashlib.sha256(archives[s.path]).hexdigest())
        if s.sha256 is not None
        else s
        for s in data.sources
    )
    monkeypatch.setitem(
        datasets.DATASETS, "wmt14-en-de", dataclasses.replace(data, sources=sources)
    )
    return archives


def test_wmt14_from_archives_of_statmt_layout(cache, monkeypatch, capsys):
    de, en = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    with Mirror(wmt14_stand_in(monkeypatch)).running() as mirror:
        argv = ["data", "get", "wmt14-en-de", "--mirror", mirror.url, "--no-progress"]
        assert main(argv) == 0
        folder = cache / "wmt14-en-de"
        assert (folder / "train.de").read_text().splitlines() == de[:50]
        assert (folder / "train.en").read_text().splitlines() == en[:50]
        assert (folder / "newstest2013.en").read_text().splitlines() == en[50:60]
        assert (folder / "newstest2014.de").read_text().splitlines() == de[60:]
        assert (folder / "newstest2014.en").read_text().splitlines() == en[60:]
        recorded = (folder / datasets.RECORDED).read_text()
        assert "archives/dev.tgz" in recorded and "archives/test-full.tgz" in recorded
        assert "europarl" not in recorded  # pinned, not recorded
        assert main(argv) == 0 and len(mirror.requests) == 5  # nothing downloaded again
        capsys.readouterr()
        # a recorded checksum is checked on every later call
        dev = folder / "archives" / "dev.tgz"
        dev.write_bytes(dev.read_bytes() + b"changed")
        assert main(argv) == 2
        assert "dev.tgz: SHA-256 differs" in capsys.readouterr().err
    files = datasets.pair_files("wmt14-en-de")
    assert (
        files["train_src"] == folder / "train.en"
        and files["valid_tgt"] == folder / "newstest2013.de"
    )
    prepare = ["prepare", "--out", str(cache / "prepared"), "--vocab-size", "200", "--no-progress"]
    for flag, key in (("--train-src", "train_src"), ("--train-tgt", "train_tgt"),
                      ("--valid-src", "valid_src"), ("--valid-tgt", "valid_tgt")):  # fmt: skip
        prepare += [flag, str(files[key])]
    assert main(prepare) == 0


def test_a_second_get_waits_for_the_first_to_fill_the_folder(cache, monkeypatch):
    """Two `data get wmt14-en-de` at once: each download had its lock, but both then wrote
    the recorded checksums through one temporary name and extracted into the same `.part`
    files (a traceback, or text replaced while it was read). One process at a time fills
    the folder now; here the downloads are done and only the extraction is left."""
    with Mirror(wmt14_stand_in(monkeypatch)).running() as mirror:
        get = functools.partial(datasets.get, "wmt14-en-de", mirror=mirror.url)
        folder = get(show_progress=False, log=lambda line: None)
    for text in (wmt.DONE, *(p.name for p in folder.glob("*.??"))):
        (folder / text).unlink()  # as when the first process is about to extract
    said: list[str] = []
    lock = cache / ".wmt14-en-de.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process fills the folder
    try:
        second = threading.Thread(target=get, kwargs={"show_progress": False, "log": said.append})
        second.start()
        deadline = time.monotonic() + 20
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)
        assert said == [
            f"{folder}: another process is getting wmt14-en-de into it; waiting for it to finish"
        ]
        time.sleep(0.2)
        assert not (folder / wmt.DONE).exists()  # it waits; it does not extract
    finally:
        lock.unlink()
        os.close(fd)
    second.join(20)
    assert not second.is_alive()
    assert (folder / "train.de").read_text().splitlines() == [p[0] for p in PAIRS[:50]]
    assert (folder / wmt.DONE).is_file()


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (["--timeout", "-1"], {}, "--timeout -1.0: must be a number of seconds above 0"),
        (["--timeout", "nan"], {}, "--timeout nan: must be"),
        (["--timeout", "inf"], {}, "--timeout inf: must be"),
        (["--timeout", "1e300"], {}, r"--timeout 1e\+300: must be"),
        (["--timeout", "0"], {}, "--timeout 0.0: must be"),
        (["--mirror", "/tmp/nomirror"], {}, "--mirror '/tmp/nomirror': not a URL of http"),
        (["--mirror", "http://[bad"], {}, r"--mirror 'http://\[bad': not a URL \(Invalid IPv6"),
        ([], {"AIAYN_MIRROR": "/tmp/x"}, "mirror URL .*AIAYN_MIRROR.* '/tmp/x': not a URL"),
    ],
)
def test_bad_timeouts_and_mirrors_are_one_line_before_any_connection(
    cache, capsys, monkeypatch, flags, env, message
):
    import re

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["data", "get", "multi30k", "--pair", "de-en", "--split", "val", "--no-progress"]
    assert main([*argv, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(message, err), err
    assert not cache.exists()  # nothing written, not even a .part


def test_a_cache_variable_that_names_no_folder_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AIAYN_DATA", "~nouser-aiayn-test/x")
    assert main(["data", "list"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "AIAYN_DATA='~nouser-aiayn-test/x'" in err, err
    a_file = tmp_path / "cache.txt"
    a_file.write_text("not a folder\n")
    monkeypatch.setenv("AIAYN_DATA", str(a_file))
    assert main(["data", "list"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{a_file}: the data cache is not a folder" in err, err
    assert a_file.read_text() == "not a folder\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pair", "xx-yy"], "multi30k: no language pair 'xx-yy'; known pairs: cs-de, cs-en, "
         "cs-fr, de-en, de-fr, en-fr (either direction)"),
        (["--pair", "de-xx"], "no language pair 'de-xx'; known pairs: cs-de,"),  # was: de alone
        (["--pair", "de"], "no language pair 'de'; known pairs"),
        (["--pair", "de-en-fr"], "no language pair 'de-en-fr'; known pairs"),
        (["--pair", "en-en"], "no language pair 'en-en'; known pairs"),
        (["--pair", ""], "no language pair ''; known pairs"),  # was: every language
        (["--pair", "cs-en", "--split", "test2017"], "multi30k: split test2017 has no cs file"),
    ],
)  # fmt: skip
def test_a_pair_the_data_set_lacks_is_one_line_before_any_download(cache, capsys, argv, message):
    with Mirror({}).running() as mirror:
        err = one_line_error(["data", "get", "multi30k", *argv, "--mirror", mirror.url], capsys)
        assert message in err
        assert mirror.requests == [] and not cache.exists()


@pytest.mark.parametrize(
    ("recorded", "where"),
    [(b"justonetoken\n", "line 1: not"), (b"\n   \nnot-hex  archives/dev.tgz\n", "line 3: not"),
     (b"\xff\xfe\n", "cannot read")],
)  # fmt: skip
def test_a_damaged_record_of_checksums_is_one_line_naming_it(cache, capsys, recorded, where):
    folder = cache / "wmt14-en-de"
    folder.mkdir(parents=True)
    (folder / datasets.RECORDED).write_bytes(recorded)
    with Mirror({}).running() as mirror:
        err = one_line_error(["data", "get", "wmt14-en-de", "--mirror", mirror.url], capsys)
        assert f"{folder / datasets.RECORDED}" in err and where in err, err
        assert mirror.requests == []
    assert (folder / datasets.RECORDED).read_bytes() == recorded  # left for the user to see


def wmt14_archives(folder: Path, europarl_de: bytes) -> None:
    """Small archives of every WMT14 member in ``folder/archives``, Europarl's German text
    being ``europarl_de``."""
    from aiayn.data.wmt import WMT14_FILES

    (folder / "archives").mkdir(parents=True)
    for parts in WMT14_FILES.values():
        for archive, members in parts:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
                for member in members.values():
                    data = (
                        sgm(["a b", "c d"]).encode() if member.endswith(".sgm") else b"a b\nc d\n"
                    )
                    if "europarl" in member and member.endswith(".de"):
                        data = europarl_de
                    info = tarfile.TarInfo(member)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
            (folder / "archives" / archive).write_bytes(buffer.getvalue())


def test_wmt14_extraction_failures_are_one_line_and_leave_no_part(tmp_path, monkeypatch):
    from aiayn.data import wmt

    wmt14_archives(tmp_path, b"a b\nc \xff d\n")
    with pytest.raises(DownloadError, match=r"europarl-v7\.de-en\.de, line 2: not UTF-8"):
        wmt.extract_wmt14(tmp_path, log=lambda _: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["archives"]  # no train.en.part

    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

    real_open = open
    monkeypatch.setattr(
        wmt, "open", lambda path, *a, **k: Full() if str(path).endswith(".de.part")
        else real_open(path, *a, **k), raising=False,
    )  # fmt: skip
    wmt14_archives(tmp_path / "ok", b"a b\nc d\n")
    with pytest.raises(DownloadError, match=r"train\.de\.part: cannot write .*No space left"):
        wmt.extract_wmt14(tmp_path / "ok", log=lambda _: None)
    assert sorted(p.name for p in (tmp_path / "ok").iterdir()) == ["archives"]


def test_an_unreadable_archive_recorded_on_first_use_says_how_to_fetch_it_again(
    cache, monkeypatch, capsys
):
    """A file with no pinned checksum is recorded as it came. A proxy's page in its place
    is no gzip data: refused at the download, nothing recorded. One that is gzip but no
    tar passes the download and fails the extraction, and fetching it again needs its
    record gone too, which the error says (a pinned file's error needs no such hint)."""
    from aiayn.data import wmt

    def extract(folder: Path, log) -> None:
        list(wmt._member_lines(folder / "a.tgz", "a.txt"))

    sources = (datasets.Source("a.tgz", "a.tgz", None),)
    data = datasets.Dataset("tiny", "http://unused/", sources, ("de", "en"), {}, "", extract)
    monkeypatch.setitem(datasets.DATASETS, "tiny", data)
    page = b"<html>sign in to the hotel wifi</html>"
    with Mirror({"a.tgz": page}).running() as mirror:
        argv = ["data", "get", "tiny", "--mirror", mirror.url, "--no-progress"]
        record = cache / "tiny" / datasets.RECORDED
        assert "a.tgz: not gzip data" in one_line_error(argv, capsys)
        assert not record.exists() and not (cache / "tiny" / "a.tgz").exists()
        mirror.files["a.tgz"] = gzip.compress(page)
        assert (
            one_line_error(argv, capsys)
            .rstrip()
            .endswith(
                "not a readable .tgz archive (truncated header); if that file is damaged, "
                f"delete it and its line in {record}, then fetch it again"
            )
        )
        mirror.files["a.tgz"] = page
        (cache / "tiny" / "a.tgz").unlink()
        pinned = dataclasses.replace(sources[0], sha256=hashlib.sha256(page).hexdigest())
        monkeypatch.setitem(datasets.DATASETS, "tiny", dataclasses.replace(data, sources=(pinned,)))
        with pytest.raises(DownloadError, match=r"not a readable \.tgz archive") as refused:
            datasets.get("tiny", mirror=mirror.url, show_progress=False, log=lambda _: None)
        assert "RECORDED" not in str(refused.value)
