"""Named data sets, fetched by one call into a cache: Multi30k (Task 1) and WMT 2014
English-German, the paper's data.

The cache is ``$AIAYN_DATA``, else ``$XDG_CACHE_HOME/aiayn``, else ``~/.cache/aiayn``; a
data set lives in a folder of its own name there. Every file comes from a pinned
upstream location (Multi30k: the dataset repository at one commit) or from a mirror that
holds the same relative paths (``mirror=`` or ``$AIAYN_MIRROR``), and is checked against a
SHA-256: pinned in this file where the project knows it, else recorded on the first
download (in the data set's ``RECORDED.sha256``) and checked on every call after.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiayn.data.download import TIMEOUT_S, check_timeout, check_url, fetch, sha256_of
from aiayn.data.folders import LOCKED, held_lock, replace_file, wait_saying
from aiayn.data.wmt import extract_wmt14
from aiayn.errors import DownloadError

MIRROR_ENV = "AIAYN_MIRROR"
CACHE_ENV = "AIAYN_DATA"
RECORDED = "RECORDED.sha256"

MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
# SHA-256 of every file under data/task1/raw/ at MULTI30K_COMMIT.
MULTI30K_SHA256 = {
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.fr.gz": "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
    "test_2018_flickr.cs.gz": "7d0a9db904f94c554a8c58049a9f3a5357c27f46cc3d710d70cb0b4a2585b8c2",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
    "test_2018_flickr.fr.gz": "fb2b83fcceb937a4f7e3e93c1c51c22aba92f1e342391e6b5ba392b16a920501",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}
# Local split name -> upstream file stem; the local names are those the tests and the
# benchmarks read (train, val, test2016).
MULTI30K_SPLITS = {
    "train": "train",
    "val": "val",
    "test2016": "test_2016_flickr",
    "test2017": "test_2017_flickr",
    "test2018": "test_2018_flickr",
    "test2017mscoco": "test_2017_mscoco",
}


@dataclass(frozen=True)
class Source:
    """One upstream file: its path under the base URL, its name in the cache folder, and
    its SHA-256 (None: recorded on the first download)."""

    path: str
    local: str
    sha256: str | None
    split: str = ""
    lang: str = ""


@dataclass(frozen=True)
class Dataset:
    name: str
    base_url: str
    sources: tuple[Source, ...]
    pair: tuple[str, str]  # the default direction
    roles: dict[str, str]  # train / valid / test -> the file stem of that split
    licence: str
    extract: Callable[[Path, Callable[[str], None]], None] | None = None
    suffix: str = ""  # of the files a recipe reads: "{stem}.{lang}{suffix}"
    languages: tuple[str, ...] = field(default=())


def _multi30k() -> Dataset:
    sources = []
    for local, stem in MULTI30K_SPLITS.items():
        for lang in ("cs", "de", "en", "fr"):
            upstream = f"{stem}.{lang}.gz"
            if upstream in MULTI30K_SHA256:
                path = f"data/task1/raw/{upstream}"
                sha = MULTI30K_SHA256[upstream]
                sources.append(Source(path, f"{local}.{lang}.gz", sha, local, lang))
    return Dataset(
        name="multi30k",
        base_url=f"https://raw.githubusercontent.com/multi30k/dataset/{MULTI30K_COMMIT}/",
        sources=tuple(sources),
        pair=("de", "en"),
        roles={"train": "train", "valid": "val", "test": "test2016"},
        licence="non-commercial research and education use (Flickr terms; the repository "
        "has no licence file); cite Elliott et al. 2016",
        suffix=".gz",
        languages=("cs", "de", "en", "fr"),
    )


def _wmt14() -> Dataset:
    # The corpora of fairseq's prepare-wmt14en2de.sh (News Commentary v9, as its --icml17
    # variant and the paper have it). The sizes and SHA-256 of the three training archives
    # are those TensorFlow Datasets pins (url_checksums/wmt14_translate.txt); dev.tgz and
    # test-full.tgz are pinned nowhere this project could check: recorded on first use.
    archives = (
        ("wmt13/training-parallel-europarl-v7.tgz",
         "0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7"),
        ("wmt13/training-parallel-commoncrawl.tgz",
         "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5"),
        ("wmt14/training-parallel-nc-v9.tgz",
         "cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485"),
        ("wmt14/dev.tgz", None),
        ("wmt14/test-full.tgz", None),
    )  # fmt: skip
    return Dataset(
        name="wmt14-en-de",
        base_url="https://www.statmt.org/",
        sources=tuple(Source(p, f"archives/{Path(p).name}", sha) for p, sha in archives),
        pair=("en", "de"),
        roles={"train": "train", "valid": "newstest2013", "test": "newstest2014"},
        licence="research use; Europarl and News Commentary are free to use, Common Crawl "
        "text is subject to the Common Crawl terms (statmt.org/wmt14/translation-task.html)",
        extract=extract_wmt14,
        languages=("de", "en"),
    )


DATASETS = {d.name: d for d in (_multi30k(), _wmt14())}


def cache_dir() -> Path:
    """Where data sets are kept: $AIAYN_DATA, else $XDG_CACHE_HOME/aiayn, else
    ~/.cache/aiayn. DownloadError naming the variable when its ``~`` names no home, and
    naming the path when something other than a folder is there."""
    if os.environ.get(CACHE_ENV):
        folder = _expand(CACHE_ENV)
    elif os.environ.get("XDG_CACHE_HOME"):
        folder = _expand("XDG_CACHE_HOME") / "aiayn"
    else:
        try:
            folder = Path.home() / ".cache" / "aiayn"
        except RuntimeError:
            raise DownloadError(
                f"no home folder for the data cache; set {CACHE_ENV} to a folder"
            ) from None
    if folder.exists() and not folder.is_dir():
        raise DownloadError(
            f"{folder}: the data cache is not a folder; choose another one (the {CACHE_ENV} "
            "environment variable)"
        )
    return folder


def _expand(variable: str) -> Path:
    """The folder that environment variable ``variable`` names, ``~`` expanded."""
    path = os.environ[variable]
    try:
        return Path(path).expanduser()
    except RuntimeError:  # ~user of no one, or no HOME at all
        raise DownloadError(
            f"environment variable {variable}={path!r}: cannot find the home folder it "
            "names; give the cache folder as an absolute path"
        ) from None


def mirror_url(mirror: str | None = None) -> str | None:
    """``mirror``, else $AIAYN_MIRROR, else None (upstream), checked to be a URL that
    can be fetched; DownloadError naming the mirror URL (and where it came from)."""
    if mirror:
        return check_url(mirror, "mirror URL")
    if os.environ.get(MIRROR_ENV):
        return check_url(os.environ[MIRROR_ENV], f"mirror URL (environment {MIRROR_ENV})")
    return None


def dataset(name: str) -> Dataset:
    if name not in DATASETS:
        raise DownloadError(f"data set {name!r}: unknown; known: {', '.join(DATASETS)}")
    return DATASETS[name]


def language_pair(name: str, pair: str) -> list[str]:
    """The two languages of ``pair`` ("de-en", either direction) of data set ``name``;
    DownloadError naming the pairs it has otherwise (checked before any download)."""
    data = dataset(name)
    langs = pair.split("-")
    if len(langs) == 2 and langs[0] != langs[1] and set(langs) <= set(data.languages):
        return langs
    known = [f"{a}-{b}" for i, a in enumerate(data.languages) for b in data.languages[i + 1 :]]
    raise DownloadError(
        f"{name}: no language pair {pair!r}; known pairs: {', '.join(known)} (either direction)"
    )


def get(
    name: str,
    *,
    langs: list[str] | None = None,
    splits: list[str] | None = None,
    mirror: str | None = None,
    timeout: float = TIMEOUT_S,
    show_progress: bool = True,
    log: Callable[[str], None] = print,
) -> Path:
    """Fetch data set ``name`` (only ``langs`` and ``splits`` where given) into the cache;
    returns its folder. Files already there are checked, not downloaded again. One process
    at a time fills a data set's folder: another waits (saying so through ``log``), then
    finds done what the first did."""
    data = dataset(name)
    timeout = check_timeout(timeout)
    base = mirror_url(mirror) or data.base_url
    folder = cache_dir() / data.name
    chosen = [
        s
        for s in data.sources
        if (not langs or s.lang in langs) and (not splits or s.split in splits)
    ]
    if (langs or splits) and not any(s.split for s in data.sources):
        raise DownloadError(f"{name}: comes whole; it has no languages or splits to choose")
    unknown = sorted(set(splits or []) - {s.split for s in data.sources})
    if unknown:
        raise DownloadError(f"{name}: no split {', '.join(unknown)}")
    if langs:
        chosen = _with_every_language(data, chosen, langs, splits)
    if not chosen:
        raise DownloadError(f"{name}: no file for languages {', '.join(langs or [])}")
    base = base.rstrip("/") + "/"
    busy = f"{folder}: another process is getting {name} into it; waiting for it to finish"
    # One process at a time fills the folder: besides each download (fetch's own lock),
    # the checksums recorded on first use and the extraction write fixed names in it.
    with contextlib.suppress(OSError):  # fetch names a folder that cannot be made
        folder.parent.mkdir(parents=True, exist_ok=True)
    with held_lock(folder.parent / f".{data.name}{LOCKED}", wait_saying(busy, log)):
        recorded = _read_recorded(folder)
        fetched = 0
        for source in chosen:
            dest = folder / source.local
            expected = source.sha256 or recorded.get(source.local)
            if dest.is_file():
                if expected is not None and sha256_of(dest) != expected:
                    raise DownloadError(
                        f"{dest}: SHA-256 differs from the expected {expected}: the file was "
                        "changed after its download; delete it and fetch it again"
                    )
            else:
                fetched += fetch(base + source.path, dest, expected, timeout, show_progress, log)
            if expected is None:
                recorded[source.local] = sha256_of(dest)
                _write_recorded(folder, recorded)
        if data.extract is not None:
            try:
                data.extract(folder, log)
            except DownloadError as e:
                if all(s.sha256 is not None for s in chosen):
                    raise
                # A file recorded on first use may have been cut short or replaced (a proxy's
                # page) when it was downloaded: its record must go with it.
                raise DownloadError(
                    f"{e}; if that file is damaged, delete it and its line in "
                    f"{folder / RECORDED}, then fetch it again"
                ) from None
    log(f"{name}: {fetched} file(s) downloaded, {len(chosen) - fetched} already there -> {folder}")
    return folder


def _with_every_language(
    data: Dataset, chosen: list[Source], langs: list[str], splits: list[str] | None
) -> list[Source]:
    """Of ``chosen``, the files of the splits that have every one of ``langs``: a split
    asked for by name that lacks one, or a language the data set lacks, is a
    DownloadError (nothing is fetched for half a pair)."""
    unknown = [lang for lang in langs if lang not in data.languages]
    if unknown:
        raise DownloadError(
            f"{data.name}: no language {', '.join(unknown)}; it has {', '.join(data.languages)}"
        )
    having: dict[str, set[str]] = {}
    for source in data.sources:
        having.setdefault(source.split, set()).add(source.lang)
    for split in splits or []:
        lacking = [lang for lang in langs if lang not in having[split]]
        if lacking:
            raise DownloadError(f"{data.name}: split {split} has no {', '.join(lacking)} file")
    return [s for s in chosen if set(langs) <= having[s.split]]


def parse_spec(spec: str) -> tuple[Dataset, str, str]:
    """``NAME`` or ``NAME/SRC-TGT`` -> (the data set, source language, target language);
    DownloadError for a name or a pair it does not know. Reads and fetches nothing."""
    name, slash, direction = spec.partition("/")
    if name not in DATASETS:
        raise DownloadError(f"data set {spec!r}: unknown; known: {', '.join(DATASETS)}")
    data = DATASETS[name]
    langs = direction.split("-") if slash else list(data.pair)  # "multi30k/": no pair
    if len(langs) != 2 or langs[0] == langs[1] or not set(langs) <= set(data.languages):
        raise DownloadError(
            f"data set {spec!r}: not a pair of {name} (languages {', '.join(data.languages)})"
        )
    return data, langs[0], langs[1]


def pair_files(
    spec: str,
    *,
    roles: Sequence[str] = ("train", "valid", "test"),
    show_progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Path]:
    """``NAME`` or ``NAME/SRC-TGT`` (``multi30k/fr-en``) -> the files of ``roles``: the
    recipe's train_src, train_tgt, valid_src, valid_tgt and test_src, test_tgt, fetching
    what the cache lacks (of Multi30k, only those splits of the two languages)."""
    data, src, tgt = parse_spec(spec)
    files = {
        f"{role}_{side}": f"{data.roles[role]}.{lang}{data.suffix}"
        for role in roles
        for side, lang in (("src", src), ("tgt", tgt))
    }
    folder = cache_dir() / data.name
    if not all((folder / f).is_file() for f in files.values()):
        if any(s.split for s in data.sources):
            splits = [data.roles[r] for r in roles]
            get(data.name, langs=[src, tgt], splits=splits, show_progress=show_progress, log=log)
        else:
            get(data.name, show_progress=show_progress, log=log)
    return {key: folder / f for key, f in files.items()}


def cached() -> list[tuple[str, Path, int, int]]:
    """Per data set: its name, folder, how many of its files are cached, how many it has."""
    rows = []
    for data in DATASETS.values():
        folder = cache_dir() / data.name
        have = sum((folder / s.local).is_file() for s in data.sources)
        rows.append((data.name, folder, have, len(data.sources)))
    return rows


def _read_recorded(folder: Path) -> dict[str, str]:
    """File name -> SHA-256 of ``folder/RECORDED`` (``sha256sum`` lines); DownloadError
    naming the file and line when it holds anything else (edited or damaged)."""
    path = folder / RECORDED
    if not path.is_file():
        return {}
    try:
        lines = path.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DownloadError(f"{path}: cannot read ({e}); delete it to record again") from None
    recorded = {}
    for number, line in enumerate(lines, start=1):
        fields = line.split(maxsplit=1)
        if not fields:
            continue
        if len(fields) != 2 or not re.fullmatch(r"[0-9a-f]{64}", fields[0]):
            raise DownloadError(
                f"{path}, line {number}: not 'SHA-256  file name'; delete the file to "
                "record the checksums again"
            )
        recorded[fields[1].strip()] = fields[0]
    return recorded


def _write_recorded(folder: Path, recorded: dict[str, str]) -> None:
    text = "".join(f"{d}  {n}\n" for n, d in sorted(recorded.items())).encode("utf-8")
    replace_file(folder / RECORDED, lambda f: f.write(text))
