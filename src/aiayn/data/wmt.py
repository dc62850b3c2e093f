"""WMT 2014 English-German from statmt.org's archives to the aligned plain-text files that
`aiayn prepare` takes: ``train.{en,de}`` (Europarl v7, Common Crawl and News Commentary
v9, in that order, as fairseq's prepare-wmt14en2de.sh joins them), ``newstest2013.{en,de}``
(validation) and ``newstest2014.{en,de}`` (the paper's test set). The text is left as
the archives have it: no tokenization, no cleaning (`prepare` drops empty and long pairs).
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

from aiayn.errors import DownloadError

# Output stem -> per language (archive, member); members ending in .sgm hold <seg> lines.
WMT14_FILES: dict[str, list[tuple[str, dict[str, str]]]] = {
    "train": [
        ("training-parallel-europarl-v7.tgz",
         {lang: f"training/europarl-v7.de-en.{lang}" for lang in ("de", "en")}),
        ("training-parallel-commoncrawl.tgz",
         {lang: f"commoncrawl.de-en.{lang}" for lang in ("de", "en")}),
        ("training-parallel-nc-v9.tgz",
         {lang: f"training/news-commentary-v9.de-en.{lang}" for lang in ("de", "en")}),
    ],
    "newstest2013": [("dev.tgz", {lang: f"dev/newstest2013.{lang}" for lang in ("de", "en")})],
    "newstest2014": [
        ("test-full.tgz", {"en": "test-full/newstest2014-deen-src.en.sgm",
                           "de": "test-full/newstest2014-deen-ref.de.sgm"}),
    ],
}  # fmt: skip
DONE = "extracted.json"
SEG = re.compile(r"<seg[^>]*>(.*)</seg>")


def extract_wmt14(folder: Path, log: Callable[[str], None] = print) -> None:
    """Write the plain-text files from ``folder/archives/*.tgz`` once: each output is
    written to a ``.part`` file and renamed when whole, and ``extracted.json`` records the
    line counts when all are done. DownloadError when an archive lacks a
    member or the two languages disagree on the line count."""
    done = folder / DONE
    if done.is_file():
        return
    counts = {}
    for stem, parts in WMT14_FILES.items():
        lines: dict[str, tuple[Path, Path, int]] = {}
        for lang in ("en", "de"):
            out = folder / f"{stem}.{lang}"
            tmp = out.with_name(out.name + ".part")
            try:
                n = _write_lines(tmp, folder, parts, lang)
            except BaseException:  # no half-written text left behind, of either language
                for stale in (tmp, *(t for t, _, _ in lines.values())):
                    stale.unlink(missing_ok=True)
                raise
            lines[lang] = (tmp, out, n)
        if lines["en"][2] != lines["de"][2]:
            for tmp, _, _ in lines.values():
                tmp.unlink()
            raise DownloadError(
                f"{folder}: {stem}.en has {lines['en'][2]} lines but {stem}.de has "
                f"{lines['de'][2]}; the archives are not the expected ones"
            )
        for tmp, out, _ in lines.values():
            os.replace(tmp, out)
        counts[stem] = lines["en"][2]
        log(f"wmt14-en-de: {stem}.en / {stem}.de: {counts[stem]:,} pairs")
    done.write_text(json.dumps(counts), encoding="utf-8")


def _write_lines(
    tmp: Path, folder: Path, parts: list[tuple[str, dict[str, str]]], lang: str
) -> int:
    """Write the ``lang`` lines of ``parts`` (archive, members) to ``tmp``; their count.
    DownloadError naming ``tmp`` when it cannot be written (a full disk)."""
    n = 0
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for archive, members in parts:
                for line in _member_lines(folder / "archives" / archive, members[lang]):
                    f.write(line + "\n")
                    n += 1
    except OSError as e:  # the archives' own read errors are DownloadErrors already
        raise DownloadError(f"{tmp}: cannot write the extracted text ({e.strerror or e})") from None
    return n


def _member_lines(archive: Path, member: str) -> Iterator[str]:
    number = 0
    try:
        with tarfile.open(archive, "r:gz") as tar:
            f = tar.extractfile(member)
            if f is None:
                raise KeyError(member)
            with f:
                for raw in f:
                    number += 1  # for the error below
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if member.endswith(".sgm"):
                        match = SEG.search(line)
                        if match is None:
                            continue
                        line = match.group(1).strip()
                    yield line
    except KeyError:
        raise DownloadError(f"{archive}: has no member {member}") from None
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DownloadError(f"{archive}: not a readable .tgz archive ({e})") from None
    except UnicodeDecodeError as e:
        raise DownloadError(f"{archive}: {member}, line {number}: not UTF-8 ({e.reason})") from None
