"""`aiayn prepare` and training from prepared data: the same batches as the in-memory path,
uint16/uint32 token files, atomic output (SIGKILL mid-way), streaming validation errors,
refused mismatches, exact resume, and the WMT14 recipe on a small stand-in."""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.checkpoint import load_checkpoint
from aiayn.cli import main
from aiayn.data import ParallelDataset, read_lines, read_parallel, token_batches
from aiayn.data.prepared import prepare, sample_pairs
from aiayn.data.shards import PreparedData, PreparedSplit, SplitWriter, token_dtype
from aiayn.errors import AiaynError, CorpusError, RecipeError
from aiayn.metrics import corpus_bleu
from aiayn.train.recipe import Recipe
from aiayn.train.trainer import Trainer
from conftest import small_corpus
from test_pipeline import TINY, records, train_argv

pytestmark = pytest.mark.multi30k  # reads Multi30k where it is; CI runs it again without

ROOT = Path(__file__).resolve().parents[1]


def reference_token_batches(src_lens, tgt_lens, max_tokens, seed, epoch):
    """The pure-Python planner of earlier versions, kept as the reference."""
    rng = random.Random(seed * 1_000_003 + epoch)
    keys = [rng.random() for _ in src_lens]
    order = sorted(range(len(src_lens)), key=lambda i: (tgt_lens[i], src_lens[i], keys[i]))
    batches, current, longest_src, longest_tgt = [], [], 0, 0
    for i in order:
        s, t = max(src_lens[i], 1), tgt_lens[i] + 1
        grow_src, grow_tgt = max(longest_src, s), max(longest_tgt, t)
        if current and (len(current) + 1) * max(grow_src, grow_tgt) > max_tokens:
            batches.append(current)
            current, grow_src, grow_tgt = [], s, t
        current.append(i)
        longest_src, longest_tgt = grow_src, grow_tgt
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    return small_corpus(tmp_path_factory.mktemp("corpus"))


def prepare_argv(corpus: dict, out: Path) -> list[str]:
    argv = ["prepare", "--out", str(out), "--vocab-size", "400", "--workers", "2"]
    for key in ("train.de", "train.en", "val.de", "val.en"):
        flag = {"train": "--train", "val": "--valid"}[key.split(".")[0]]
        argv += [f"{flag}-{'src' if key.endswith('de') else 'tgt'}", str(corpus[key])]
    return [*argv, "--no-progress"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, corpus) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "data"
    assert main(prepare_argv(corpus, out)) == 0
    return out


def test_numpy_planner_equals_the_python_reference():
    g = np.random.default_rng(0)
    cases = [(0, 0, 2000, 500, 60), (1, 3, 3000, 300, 60), (2**40, 1, 500, 40, 60)]
    for seed, epoch, n, budget, top in [*cases, (5, 0, 300, 200_000, 70_000)]:  # > uint16
        src, tgt = g.integers(0, top, n).tolist(), g.integers(0, top, n).tolist()
        assert token_batches(src, tgt, budget, seed, epoch) == reference_token_batches(
            src, tgt, budget, seed, epoch
        )


def test_prepared_batches_equal_the_in_memory_ones(prepared, corpus):
    data = PreparedData(prepared)
    train = read_parallel(corpus["train.de"], corpus["train.en"], 100)
    # A limit below the longest pairs (Multi30k or the built-in sample), so that the
    # max_positions filter is exercised too.
    lengths = sorted(len(data.tokenizer.encode(t)) + 1 for t in train.tgt)
    limit = lengths[len(lengths) * 9 // 10]
    memory = ParallelDataset.from_texts(data.tokenizer, train.src, train.tgt, limit)
    assert memory.dropped_long > 0
    budget = 300 if len(train.src) > 100 else 60  # several batches on the small sample too
    for seed, epoch in ((1, 0), (3, 2)):
        expected = list(memory.batches(budget, seed=seed, epoch=epoch))
        plan = data.train.plan(budget, seed, epoch, max_positions=limit)
        got = [data.train.batch(i) for i in plan]
        assert len(got) == len(expected) > 5
        for a, b in zip(expected, got):
            for name in ("src", "tgt_in", "tgt_out"):
                assert torch.equal(getattr(a, name), getattr(b, name)), name
            assert (a.n_src_tokens, a.n_tgt_tokens) == (b.n_src_tokens, b.n_tgt_tokens)
    assert data.valid_src == read_parallel(corpus["val.de"], corpus["val.en"]).src


def test_manifest_describes_the_data(prepared, corpus):
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["format"] == "aiayn-prepared-1" and manifest["dtype"] == "uint16"
    assert manifest["splits"]["train"]["pairs"] == manifest["splits"]["train"]["lines"]
    digest = __import__("hashlib").sha256(Path(corpus["train.de"]).read_bytes()).hexdigest()
    assert manifest["inputs"]["train_src"]["sha256"] == digest
    assert manifest["inputs"]["valid_tgt"]["bytes"] == Path(corpus["val.en"]).stat().st_size


@pytest.mark.parametrize("vocab, top", [(65536, 65535), (65537, 65536), (70000, 69999)])
def test_token_files_round_trip_at_the_uint16_boundary(tmp_path, vocab, top):
    dtype = token_dtype(vocab)
    assert dtype == (np.uint16 if vocab <= 65536 else np.uint32)
    rows = [[top, 5, top - 1], [7], [top] * 4]
    writer = SplitWriter(tmp_path, "train", dtype)
    for side in ("src", "tgt"):
        writer.write(side, np.array([t for r in rows for t in r]), np.array(list(map(len, rows))))
    writer.close()
    split = PreparedSplit(tmp_path, "train", dtype)
    assert [split.ids("src", i).tolist() for i in range(3)] == rows
    assert split.batch(np.array([2])).src.tolist() == [[top] * 4]
    narrow = SplitWriter(tmp_path, "x", np.uint16)
    with pytest.raises(OverflowError):
        narrow.write("src", np.array([65536]), np.array([1]))
    narrow.discard()
    split.close()


def test_prepare_killed_midway_leaves_nothing_and_reruns_clean(tmp_path, corpus):
    big = {}
    for key in ("train.de", "train.en"):  # 60k pairs: a few seconds of encoding
        lines = Path(corpus[key]).read_bytes()
        lines = gzip.decompress(lines) if lines[:2] == b"\x1f\x8b" else lines  # sample: plain
        lines *= max(1, 60_000 // lines.count(b"\n"))
        big[key] = tmp_path / f"{key}.gz"
        big[key].write_bytes(gzip.compress(lines, compresslevel=1))
    out = tmp_path / "data"
    code = (
        "import sys; from aiayn.data.prepared import prepare; "
        "prepare((sys.argv[1], sys.argv[2]), (sys.argv[3], sys.argv[4]), sys.argv[5], "
        "vocab_size=300, chunk_pairs=500, show_progress=False)"
    )
    args = [big["train.de"], big["train.en"], corpus["val.de"], corpus["val.en"], out]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:  # until token files are being written
            if any(p.stat().st_size > 0 for p in tmp_path.glob(".data.*.tmp/train.src.bin")):
                break
            assert proc.poll() is None, "prepare ended before it could be killed"
            time.sleep(0.01)
        else:
            pytest.fail("prepare wrote no tokens within 120 s")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists() and list(tmp_path.glob(".data.*.tmp"))  # a leftover, no dataset
    small = (corpus["train.de"], corpus["train.en"])
    prepare(small, (corpus["val.de"], corpus["val.en"]), out, 300, show_progress=False)
    n_small = len(read_parallel(*small, 100))  # 300 Multi30k pairs, or the 50 of the sample
    assert not list(tmp_path.glob(".data.*.tmp")) and len(PreparedData(out).train) == n_small
    with pytest.raises(CorpusError, match="already exists"):
        prepare(small, (corpus["val.de"], corpus["val.en"]), out, 300, show_progress=False)


def write(path: Path, data: bytes, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_every_streaming_error_names_the_file_and_line(tmp_path):
    good = write(tmp_path / "good.en", b"one\ntwo\nthree\n")
    valid = (good, good)
    numbers = "".join(f"{i * 7919 % 100_003}\n" for i in range(20_000)).encode()
    long, cut = write(tmp_path / "n.en", numbers), r"cut\.de\.gz, line \d+: cannot read"
    cases = [
        (write(tmp_path / "short.de", b"eins\nzwei\n"), good, r"short\.de ends after line 2"),
        (good, write(tmp_path / "long.de", b"a\nb\nc\nd\n"), r"good\.en ends after line 3"),
        (write(tmp_path / "none.de", b""), good, r"none\.de has 0 lines.*none\.de is empty"),
        (write(tmp_path / "bad.de.gz", b"a\nb\n\xff\n", gz=True), good, r"bad\.de\.gz, line 3"),
        (good, write(tmp_path / "cr.de", b"a\r\n\xc3\x28\nc\n"), r"cr\.de, line 2: invalid UTF"),
        (write(tmp_path / "cut.de.gz", gzip.compress(numbers)[:3000]), long, cut),
    ]
    for i, (src, tgt, message) in enumerate(cases):
        with pytest.raises(CorpusError, match=message):
            prepare((src, tgt), valid, tmp_path / f"out{i}", 100, show_progress=False)
        assert not (tmp_path / f"out{i}").exists()
    assert not list(tmp_path.glob(".out*.tmp"))


def test_unusable_validation_text_is_refused_before_the_training_text_is_read(tmp_path):
    """A typo in a validation path (or a bad validation file) was reported after the
    tokenizer was trained and the whole training text encoded: hours on a big corpus."""
    good = write(tmp_path / "good.en", b"one\ntwo\nthree\n")
    said: list[str] = []  # prepare logs as each stage of its work ends
    cases = [
        ((good, tmp_path / "missing.en"), r"missing\.en: no such file"),
        ((good, write(tmp_path / "v.en", b"a\n\xff\nc\n")), r"v\.en, line 2: invalid UTF"),
        ((good, write(tmp_path / "two.en", b"a\nb\n")), r"two\.en ends after line 2"),
        ((good, write(tmp_path / "blank.en", b"\n \n\n")), "no usable pairs"),
    ]
    for i, (valid, message) in enumerate(cases):
        with pytest.raises(CorpusError, match=message):
            prepare(
                (good, good), valid, tmp_path / f"o{i}", 40, log=said.append, show_progress=False
            )
        assert not (tmp_path / f"o{i}").exists()
    assert said == []  # refused before the tokenizer was trained


def test_a_sample_of_unusable_pairs_alone_does_not_refuse_the_corpus(tmp_path):
    """The tokenizer's sample, not the corpus, was checked for usable pairs: a corpus of
    200 empty pairs and 100 good ones was refused when the sample held only empty ones."""
    src = "".join(f"Haus {i}\n" if i % 3 == 0 else "\n" for i in range(300))
    tgt = "".join(f"house {i}\n" for i in range(300))
    a, b = write(tmp_path / "a.de", src.encode()), write(tmp_path / "a.en", tgt.encode())
    for seed in range(1, 6):  # whichever pair the sample of one draws
        out = tmp_path / f"d{seed}"
        m = prepare((a, b), (a, b), out, 60, sample=1, seed=seed, show_progress=False)
        assert m["splits"]["train"]["pairs"] == 100
    empty = write(tmp_path / "e.de", b"\n" * 300)
    with pytest.raises(CorpusError, match=r"no usable pairs \(300 empty"):
        prepare((empty, b), (a, b), tmp_path / "e", 60, sample=1, show_progress=False)


def test_text_with_carriage_returns_for_line_ends_is_named_so(tmp_path):
    """A file with the CR line ends of old Macs is one long line: prepare said only "no
    usable pairs (0 empty, 1 too long)", and nothing when such a line was kept."""
    cr = write(tmp_path / "cr.de", "".join(f"Satz {i}.\r" for i in range(200)).encode())
    en = write(tmp_path / "cr.en", "".join(f"Sentence {i}.\r" for i in range(200)).encode())
    with pytest.raises(CorpusError, match=r"1 too long\); 1 line\(s\) hold a carriage return"):
        prepare((cr, en), (cr, en), tmp_path / "a", 60, show_progress=False)
    said: list[str] = []
    prepare((cr, en), (cr, en), tmp_path / "b", 60, max_len_words=0, log=said.append)
    assert sum("1 line(s) hold a carriage return (CR alone" in x for x in said) == 2, said


def test_text_with_nul_bytes_is_refused_naming_the_file_and_line(tmp_path):
    """A NUL byte is valid UTF-8: a UTF-16 file of ASCII text (every other byte a NUL) was
    prepared into nonsense without a word. A NUL in a first line is now refused naming the
    file, line and column, with UTF-16 as the likely cause; so is an invalid UTF-8 first
    line that starts with a UTF-16 byte order mark. A NUL further on, as a crawled corpus
    may hold, is read as before (the unknown token)."""
    good = write(tmp_path / "good.en", b"one\ntwo\nthree\n")
    hint = r"not UTF-8 text \(a UTF-16 file, as some Windows editors save text\? save it as UTF-8"
    text = "eins\nzwei\ndrei\n"
    cases = [  # (file, line, column of its first NUL)
        (write(tmp_path / "nul.de", b"ei\x00ns\nzwei\ndrei\n"), 1, 3),
        (write(tmp_path / "le.de", text.encode("utf-16-le")), 1, 2),
        (write(tmp_path / "gz.de", text.encode("utf-16-be"), gz=True), 1, 1),
    ]
    for i, (src, line, column) in enumerate(cases):
        message = f"{re.escape(src.name)}, line {line}: a NUL byte at column {column}: {hint}"
        for train, valid in (((src, good), (good, good)), ((good, good), (good, src))):
            with pytest.raises(CorpusError, match=message):
                prepare(train, valid, tmp_path / f"out{i}", 100, show_progress=False)
            assert not (tmp_path / f"out{i}").exists()
    bom = write(tmp_path / "bom.de", "中文\n".encode("utf-16"))  # no NUL in its first line
    message = r"bom\.de, line 1: invalid UTF-8 \(byte 0xff at column 1\) \(a UTF-16 file"
    with pytest.raises(CorpusError, match=message):
        prepare((bom, good), (good, good), tmp_path / "bom", 100, show_progress=False)
    with pytest.raises(CorpusError, match=r"line 2: invalid UTF-8 \(byte 0xff at column 1\)$"):
        read_lines(write(tmp_path / "late.de", b"eins\n\xff\xfe\n"))  # no hint past line 1
    with pytest.raises(CorpusError, match=r"nul\.de, line 1: a NUL byte"):
        read_lines(cases[0][0])  # every reader of text: translate's input, BLEU's references
    late = write(tmp_path / "late_nul.de", b"eins\nzw\x00ei\ndrei\n")
    assert read_lines(late) == ["eins", "zw\x00ei", "drei"]
    # Compressed files other than gzip were told they might be UTF-16.
    import bz2
    import lzma

    for packed, kind in ((bz2.compress, "a bzip2"), (lzma.compress, "an xz")):
        path = write(tmp_path / "packed.de", packed(text.encode() * 50))
        with pytest.raises(CorpusError, match=rf"\({kind} file\? decompress it: text is read"):
            read_lines(path)
    prepare((late, good), (good, good), tmp_path / "late", 100, show_progress=False)
    assert len(PreparedData(tmp_path / "late").train) == 3


def test_prepare_fills_an_empty_folder_but_never_one_with_files(tmp_path):
    """A folder made beforehand (``mkdir data``) is taken while it is empty; one holding
    anything is refused, and what it holds is left as it was."""
    text = write(tmp_path / "a.txt", "ein Haus\nzwei Bäume\n".encode())
    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.mkdir()
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    prepare((text, text), (text, text), empty, 40, show_progress=False)
    assert len(PreparedData(empty).train) == 2
    with pytest.raises(CorpusError, match="full already exists"):
        prepare((text, text), (text, text), full, 40, show_progress=False)
    assert [p.name for p in full.iterdir()] == ["notes.txt"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_vocabulary_smaller_than_asked_says_so(tmp_path):
    """On a small text SentencePiece stops below vocab_size; the log said only the size."""
    text = write(tmp_path / "a.txt", "ein Haus\nzwei Bäume\n".encode())
    said: list[str] = []
    prepare((text, text), (text, text), tmp_path / "d", 8000, log=said.append, show_progress=False)
    line = next(x for x in said if x.startswith("tokenizer:"))
    assert "vocab_size 8000 asked, the text holds no more" in line
    tokenizer = PreparedData(tmp_path / "d").tokenizer
    assert f"tokenizer: {tokenizer.vocab_size} joint tokens" in line


def test_a_prepare_removes_its_own_leftovers_not_another_outputs_staging(tmp_path):
    text = write(tmp_path / "a.txt", "ein Haus\nzwei Bäume\n".encode())
    own, other = tmp_path / ".data.k1ll3d_x.tmp", tmp_path / ".data.v2.abcd1234.tmp"
    for folder in (own, other):
        folder.mkdir()
    # "dat[a]" as a glob pattern would match the leftovers of "data"
    prepare((text, text), (text, text), tmp_path / "dat[a]", 40, show_progress=False)
    assert own.is_dir() and other.is_dir()
    prepare((text, text), (text, text), tmp_path / "data", 40, show_progress=False)
    assert not own.exists() and other.is_dir()  # another output's, maybe in use


def test_a_second_prepare_into_the_same_output_is_refused_while_the_first_runs(
    tmp_path, monkeypatch
):
    """A second prepare into an output that a first is writing deleted the first's staging
    folder as a killed prepare's leftover; the first then failed with "cannot write the
    prepared data (No such file or directory)". Now the second is refused and the first
    goes on; the lock file and staging folder a killed prepare left are taken over."""
    import aiayn.data.prepared as prepared_module

    text = write(tmp_path / "a.txt", "ein Haus\nzwei Bäume\n".encode())
    out = tmp_path / "data"
    (tmp_path / ".data.lock").write_text("")  # as a killed prepare left them
    (tmp_path / ".data.k1ll3d_x.tmp").mkdir()
    first_stages = prepared_module._prepare_into
    refused: list[str] = []
    stages: list[Path] = []

    def second_prepare_meanwhile(tmp: Path, *args: object) -> dict:
        stages.append(tmp)
        if len(stages) > 1:  # the second prepare, had it not been refused
            return first_stages(tmp, *args)
        with pytest.raises(AiaynError) as raised:
            prepare((text, text), (text, text), out, 40, show_progress=False)
        refused.append(str(raised.value))
        assert tmp.is_dir()  # the first one's staging folder is still there
        return first_stages(tmp, *args)

    monkeypatch.setattr(prepared_module, "_prepare_into", second_prepare_meanwhile)
    prepare((text, text), (text, text), out, 40, show_progress=False)
    assert refused == [
        f"another prepare is writing {out}; let it finish, or prepare into another directory"
    ]
    assert len(PreparedData(out).train) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "data"]


def test_dropped_pairs_are_counted_and_the_sample_is_seeded(tmp_path):
    src = write(tmp_path / "a.de", "eins\n\nzwei drei vier fünf\nsechs sieben\n".encode())
    tgt = write(tmp_path / "a.en", b"one\nlost\ntwo three four five\nsix seven\n")
    m = prepare((src, tgt), (src, tgt), tmp_path / "d", 40, max_len_words=3, show_progress=False)
    assert (m["splits"]["train"]["pairs"], m["splits"]["train"]["dropped_empty"]) == (2, 1)
    assert (m["splits"]["train"]["dropped_long"], m["splits"]["valid"]["pairs"]) == (1, 3)
    # A side of which SentencePiece's normaliser leaves no token (U+200B alone) is empty:
    # it was kept, and validation scored against empty references.
    tgt = write(tmp_path / "b.en", "one\nlost\ntwo three four five\n\u200b\n".encode())
    m = prepare((src, tgt), (src, tgt), tmp_path / "e", 40, max_len_words=3, show_progress=False)
    assert (m["splits"]["train"]["pairs"], m["splits"]["train"]["dropped_empty"]) == (1, 2)
    assert (m["splits"]["valid"]["pairs"], m["splits"]["valid"]["dropped_empty"]) == (2, 2)
    assert "\u200b" not in (tmp_path / "e" / "valid.tgt.txt").read_text(encoding="utf-8")
    pairs = [(str(i), str(i)) for i in range(1000)]
    assert sample_pairs(iter(pairs), 2000, 1) == pairs  # all of them, in order
    a = sample_pairs(iter(pairs), 50, 1)
    assert a == sample_pairs(iter(pairs), 50, 1) != sample_pairs(iter(pairs), 50, 2)
    assert len(a) == 50 and a == sorted(a, key=lambda p: int(p[0]))


def test_settings_out_of_range_and_an_output_that_cannot_be_made_are_one_line(tmp_path, capsys):
    text = write(tmp_path / "a.txt", "ein Haus\nzwei Bäume\n".encode())
    argv = ["prepare", "--train-src", str(text), "--train-tgt", str(text), "--no-progress"]
    argv += ["--valid-src", str(text), "--valid-tgt", str(text)]
    cases = [
        (["--vocab-size", "0"], "--vocab-size must be at least 5, got 0"),
        (["--vocab-size", "4"], "--vocab-size must be at least 5, got 4"),
        (["--vocab-size", "6"], "vocab_size 6 is too small: the characters of the training"),
        (["--max-len-words", "-1"], "--max-len-words must be at least 0, got -1"),
        (["--spm-sample", "0"], "--spm-sample must be at least 1, got 0"),  # was "sample"
        (["--workers", "0"], "--workers must be at least 1, got 0"),
        (["--out", str(text / "out")], f"{text / 'out'}: cannot create"),  # under a file
    ]
    for flags, message in cases:
        out = [] if "--out" in flags else ["--out", str(tmp_path / "out")]  # given once
        assert main([*argv, *out, *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err and "INTERNAL" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_a_damaged_index_file_is_named(tmp_path, prepared):
    damaged = tmp_path / "data"
    shutil.copytree(prepared, damaged)
    index = damaged / "train.src.idx.npy"
    for junk in (os.urandom(2000), None):
        if junk is None:
            np.save(index, np.zeros(5))  # a valid .npy, of the wrong shape
        else:
            index.write_bytes(junk)
        with pytest.raises(CorpusError, match=f"^{re.escape(str(index))}: not a valid index file"):
            PreparedData(damaged)


def test_an_index_whose_rows_leave_the_token_file_is_refused_when_read(tmp_path, prepared):
    """A negative offset was accepted and failed at the first batch (os.pread's EINVAL,
    a traceback); one past the end read as padding; a length of 10**12 wrapped to a
    negative size in int32. Each is now refused when the data is read, naming the row."""
    damaged = tmp_path / "data"
    shutil.copytree(prepared, damaged)
    path = damaged / "train.src.idx.npy"
    good = np.load(path)
    cases = [
        ((5, 0), -50, f"row 5 has offset -50, the lengths before it put it at {good[5, 0]}"),
        ((5, 0), 10**6, "row 5 has offset 1000000"),
        ((0, 0), 1, "row 0 has offset 1, the lengths before it put it at 0"),
        ((5, 1), 10**12, "row 5 has length 1000000000000"),
        ((7, 1), -3, "row 7 has length -3"),
    ]
    for (row, column), value, message in cases:
        index = good.copy()
        index[row, column] = value
        np.save(path, index)
        with pytest.raises(CorpusError) as raised:
            PreparedData(damaged)
        said = str(raised.value)
        assert said.startswith(f"{path}: {message}") and said.endswith("prepare it again"), said
    np.save(path, good.astype(np.uint64))  # another integer type, right values: still read
    assert PreparedData(damaged).train.ids("src", 5).tolist() == (
        PreparedData(prepared).train.ids("src", 5).tolist()
    )


def test_an_id_outside_the_vocabulary_names_its_token_file_and_row(tmp_path, prepared, capsys):
    """A token file holding an id past the vocabulary (damage, or data encoded with another
    tokenizer) failed in the model, "tgt_in holds id 60000, outside the vocabulary [0,
    400)", naming no file. Each batch's ids are checked as it is read (the corpus is
    never scanned whole): the file and the row of its index are named."""
    damaged = tmp_path / "data"
    shutil.copytree(prepared, damaged)
    vocab = PreparedData(prepared).tokenizer.vocab_size
    for split, side, row in (("train", "tgt", 5), ("valid", "src", 2)):
        path = damaged / f"{split}.{side}.bin"
        ids = np.fromfile(path, PreparedData(prepared).dtype)
        ids[np.load(damaged / f"{split}.{side}.idx.npy")[row, 0] + 1] = 60000
        ids.tofile(path)
    data = PreparedData(damaged)  # opened without a scan: the rows are checked when read
    assert data.train.batch(np.array([0, 1, 7])).src.shape[0] == 3  # other rows read on
    wanted = (
        f"{damaged / 'train.tgt.bin'}: sentence 5 (row 5 of its index) holds id 60000, "
        f"outside the vocabulary [0, {vocab}); the prepared data is damaged, prepare it again"
    )
    with pytest.raises(CorpusError) as raised:
        data.train.batch(np.arange(len(data.train)))
    assert str(raised.value) == wanted
    # The command: one line, naming the training row or (the update's batch without it)
    # the validation one, at the validation after the update.
    run = ["train", "--data", str(damaged), "--out", str(tmp_path / "run"), "--no-progress"]
    assert main([*run, "--set", *TINY, "max_steps=1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    named = (
        f"{damaged / 'train.tgt.bin'}: sentence 5 ",
        f"{damaged / 'valid.src.bin'}: sentence 2 ",
    )
    assert any(n in err for n in named) and "holds id 60000, outside the vocabulary" in err, err


def test_a_validation_text_that_is_not_utf8_names_its_file_and_line(tmp_path, prepared, capsys):
    """It said "prepared data is incomplete ('utf-8' codec can't decode byte 0xff in
    position 3609 ...)", naming neither the file nor the line."""
    damaged = tmp_path / "data"
    shutil.copytree(prepared, damaged)
    text = damaged / "valid.src.txt"
    lines = text.read_bytes().split(b"\n")
    lines[2] = lines[2][:3] + b"\xff" + lines[2][3:]
    text.write_bytes(b"\n".join(lines))
    message = f"{text}, line 3: invalid UTF-8 (byte 0xff at column 4)"
    with pytest.raises(CorpusError, match=f"^{re.escape(message)}"):
        PreparedData(damaged)
    train = ["train", "--data", str(damaged), "--out", str(tmp_path / "run"), "--no-progress"]
    assert main([*train, "--set", *TINY, "max_steps=1"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_mismatched_or_damaged_data_is_refused(tmp_path, corpus, prepared, capsys):
    run = tmp_path / "run"
    assert main(train_argv(corpus, run, "max_steps=2")) == 0  # its own tokenizer
    other = tmp_path / "other"
    valid = (corpus["val.de"], corpus["val.en"])
    prepare((corpus["train.de"], corpus["train.en"]), valid, other, 350, show_progress=False)
    argv = ["train", "--out", str(run), "--data", str(other), "--resume", "--no-progress"]
    assert main([*argv, "--set", *TINY, "max_steps=4"]) == 2
    err = capsys.readouterr().err
    assert "data was encoded with another tokenizer" in err and "Traceback" not in err
    assert main(prepare_argv(corpus, prepared)) == 2  # never over an existing directory
    err = capsys.readouterr().err
    assert "already exists" in err and len(err.strip().splitlines()) == 1
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps({**manifest, "format": "aiayn-prepared-0"}))
    with pytest.raises(CorpusError, match="this version of aiayn reads 'aiayn-prepared-1'"):
        PreparedData(other)
    with pytest.raises(CorpusError, match="not a prepared data directory"):
        PreparedData(tmp_path)
    # a recipe's data: before `aiayn prepare` made it (was "not a prepared data directory")
    with pytest.raises(CorpusError, match=r"gone: no such folder \(no manifest\.json; prepare"):
        PreparedData(tmp_path / "gone")
    (tmp_path / "text.txt").write_text("a recipe's data: a text file\n")
    with pytest.raises(CorpusError, match=r"text\.txt: not a prepared data directory"):
        PreparedData(tmp_path / "text.txt")
    damaged = tmp_path / "damaged"
    prepare((corpus["train.de"], corpus["train.en"]), valid, damaged, 350, show_progress=False)
    with (damaged / "train.tgt.bin").open("r+b") as f:
        f.truncate(100)
    with pytest.raises(CorpusError, match=r"train\.tgt\.bin: 100 bytes, the index says"):
        PreparedData(damaged)


def test_the_summary_names_a_word_limit_only_where_there_is_one(tmp_path, prepared):
    """Prepared with no limit (max_len_words 0: kept as null), it said "0 longer than None
    words"."""
    assert "longer than 100 words, dropped when prepared" in PreparedData(prepared).summary("train")
    unlimited = tmp_path / "data"
    shutil.copytree(prepared, unlimited)
    manifest = json.loads((unlimited / "manifest.json").read_text())
    (unlimited / "manifest.json").write_text(json.dumps({**manifest, "max_len_words": None}))
    said = PreparedData(unlimited).summary("train")
    assert "longer than" not in said and "empty, dropped when prepared" in said
    # Validation pairs are kept whatever their length: no limit to name (it named 100).
    assert "longer than" not in PreparedData(prepared).summary("valid")


def test_a_damaged_manifest_or_validation_text_names_its_file(tmp_path, prepared, capsys):
    """A manifest with a field missing or of another type was a KeyError or numpy's
    TypeError; a valid.tgt.txt one line short was found only at the first validation
    ("BLEU needs one reference per hypothesis", naming no file). Now each is one line
    naming the file (and the field), when the data is read."""
    manifest = json.loads((prepared / "manifest.json").read_text())
    splits, inputs = manifest["splits"], manifest["inputs"]
    cases = [
        ({"format": manifest["format"]}, "field 'dtype' is missing"),
        ({**manifest, "dtype": "float7"}, "field 'dtype' must be 'uint16' or 'uint32', got"),
        ({**manifest, "vocab_size": "400"}, "field 'vocab_size' must be a whole number > 0"),
        ({**manifest, "splits": []}, "field 'splits' must be an object, got []"),
        ({**manifest, "splits": {"train": splits["train"]}}, "field 'splits.valid' is missing"),
        ({**manifest, "splits": {**splits, "valid": {**splits["valid"], "pairs": -1}}},
         "field 'splits.valid.pairs' must be a whole number >= 0, got -1"),
        ({**manifest, "inputs": {**inputs, "train_src": {**inputs["train_src"], "bytes": None}}},
         "field 'inputs.train_src.bytes' must be a whole number >= 0, got None"),
        ({**manifest, "spm_model": "../spm.model"}, "field 'spm_model' must be a file name"),
        ({**manifest, "max_len_words": 1.5}, "field 'max_len_words' must be a whole number"),
    ]  # fmt: skip
    damaged = tmp_path / "damaged"
    shutil.copytree(prepared, damaged)
    path = damaged / "manifest.json"
    for text, message in cases:
        path.write_text(json.dumps(text))
        with pytest.raises(CorpusError) as raised:
            PreparedData(damaged)
        assert str(raised.value).startswith(f"{path}: {message}"), str(raised.value)
    path.write_text(json.dumps(manifest))
    n = splits["valid"]["pairs"]
    reference = damaged / "valid.tgt.txt"
    reference.write_text("".join(line + "\n" for line in reference.read_text().splitlines()[1:]))
    message = f"{reference}: {n - 1} lines, the manifest says {n} validation pairs"
    with pytest.raises(CorpusError, match=f"^{re.escape(message)}"):
        PreparedData(damaged)
    train = ["train", "--data", str(damaged), "--out", str(tmp_path / "run"), "--no-progress"]
    assert main([*train, "--set", *TINY, "max_steps=1"]) == 2  # before any update
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_prepared_path_resumes_exactly_and_equals_the_raw_text_path(tmp_path, corpus, prepared):
    """20 updates from raw text = 12 + 8 (resumed) from the prepared directory."""
    raw, split = tmp_path / "raw", tmp_path / "split"
    assert main(train_argv(corpus, raw, "max_steps=20")) == 0
    argv = ["train", "--out", str(split), "--data", str(prepared), "--no-progress", "--set", *TINY]
    assert main([*argv, "max_steps=12"]) == 0
    assert main([*argv[: -len(TINY) - 1], "--resume", "--set", *TINY, "max_steps=20"]) == 0
    a = load_checkpoint(raw / "checkpoint_last.pt")
    b = load_checkpoint(split / "checkpoint_last.pt")
    assert a["step"] == b["step"] == 20 and a["tokenizer"] == b["tokenizer"]
    assert [r["step"] for r in records(split, "train")] == list(range(1, 21))
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert (raw / "data" / "manifest.json").is_file()  # raw text went through the same format


def test_wmt14_recipe_on_a_small_stand_in(tmp_path, prepared):
    recipe = Recipe.from_yaml(ROOT / "recipes" / "wmt14-en-de-base.yaml")
    assert (recipe.model["d_model"], recipe.model["n_layers"], recipe.warmup) == (512, 6, 4000)
    assert recipe.vocab_size == 37000 and recipe.model["share_embeddings"]
    assert 24000 <= recipe.max_tokens * recipe.update_freq <= 26000
    assert (recipe.save_every_minutes, recipe.keep_last) == (10, 5)
    tiny = [t for t in TINY if not t.startswith(("save_every", "keep_last"))]
    # keep_last 10: on the small built-in sample every update ends an epoch, and those epoch
    # checkpoints would push the timed ones out of the last 5.
    overrides = ["max_steps=3", "save_every_minutes=1e-9", "keep_last=10"]
    recipe.override([*tiny, f"data={prepared}", *overrides])
    trainer = Trainer(recipe, tmp_path / "run", log=lambda _: None)
    assert trainer.cfg.d_model == 32 and trainer.recipe.update_freq == recipe.update_freq
    assert trainer.train(progress=False).step == 3
    timed = sorted(p.name for p in (tmp_path / "run").glob("checkpoint_step*.pt"))
    assert timed == [
        "checkpoint_step0000001.pt",
        "checkpoint_step0000002.pt",
        "checkpoint_step0000003.pt",
    ]
    assert main(["average", "--model", str(tmp_path / "run"), "--last", "5"]) == 0


def test_validation_bleu_takes_the_recipes_tokenization(tmp_path, prepared, monkeypatch):
    """`valid_tokenize` is the validation BLEU's tokenization (as `evaluate --tokenize`):
    the score is corpus BLEU of the translations with it, named by sacreBLEU's names;
    another name is refused naming the field and the choices. The translations here are
    the references with their spaces and dots dropped, which char scores high and 13a low
    whatever an untrained model would say."""
    from aiayn.train import validation

    overrides = [*TINY, f"data={prepared}", "max_steps=1"]
    trainer = Trainer(Recipe().override(overrides), tmp_path / "a", log=lambda _: None)
    refs = trainer.valid_ref
    squeezed = dict(zip(trainer.valid_src, (r.replace(" ", "").replace(".", "") for r in refs)))
    monkeypatch.setattr(
        validation,
        "translate_texts",
        lambda model, tok, src, beam, **_: [squeezed[s] for s in src],
    )
    hyps = [squeezed[s] for s in trainer.valid_src]
    scores = {}
    for name in ("13a", "char", "none"):
        recipe = Recipe().override([*overrides, f"valid_tokenize={name}"])
        trainer = Trainer(recipe, tmp_path / name, log=lambda _: None)
        scores[name] = trainer.validate()["bleu"]
        assert scores[name] == corpus_bleu(hyps, refs, tokenize=name).score, name
    assert scores["char"] > 50 > scores["13a"], scores  # the tokenization was applied
    with pytest.raises(RecipeError) as refused:
        Recipe().override(["valid_tokenize=ja-mecab"])
    assert "'valid_tokenize' must be 13a | intl | zh | char | none" in str(refused.value)


def test_the_encoding_processes_are_no_forks_of_the_caller():
    """A fork copies the locks that the caller's other threads hold (a progress bar's, a
    test runner's): a prepare under two test workers once waited forever on one. The
    processes come from a fork server (or spawn), started clean."""
    from aiayn.data.prepared import _pool_context

    context = _pool_context()
    assert context.get_start_method() in ("forkserver", "spawn")
    if context.get_start_method() == "forkserver":
        with context.Pool(1) as pool:
            assert pool.apply(os.getppid) != os.getpid()  # the server's child, not ours


def test_prepare_in_a_script_without_a_main_guard_stops_with_one_line(corpus, tmp_path):
    """Each encoding process imports the calling script; unguarded, it called prepare
    again there, and the pool started dying processes again forever."""
    script = tmp_path / "prepare_me.py"
    paths = [str(corpus[k]) for k in ("train.de", "train.en", "val.de", "val.en")]
    script.write_text(
        "from aiayn.data.prepared import prepare\n"
        f"prepare({paths[:2]!r}, {paths[2:]!r}, {str(tmp_path / 'out')!r}, vocab_size=400,\n"
        "        workers=2, show_progress=False)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "prepare ran again in its encoding process: call it under" in done.stderr
    assert done.stderr.rstrip().endswith("or out of memory)"), done.stderr[-2000:]
    assert not (tmp_path / "out").exists()
